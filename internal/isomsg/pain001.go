package isomsg

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Initiation is one pain.001.001.09 credit transfer initiation with one payment
// information block and one transaction: how the iso20022 rail adapter
// presents one payout (docs/contracts/iso20022.md).
type Initiation struct {
	MsgID           string // GrpHdr/MsgId
	PmtInfID        string // PmtInf/PmtInfId
	EndToEndID      string // CdtTrfTxInf/PmtId/EndToEndId: the payoutId
	DebtorAccount   string // PmtInf/DbtrAcct: the accountId, IBAN if it is one, else Othr/Id
	CreditorAccount string // CdtTrfTxInf/CdtrAcct: the beneficiary, IBAN if it is one, else Othr/Id
	AmountMinor     int64  // CdtTrfTxInf/Amt/InstdAmt, in the currency's minor units
	Currency        string // InstdAmt/@Ccy
	CreatedAt       time.Time
}

type pain001Doc struct {
	XMLName struct{}        `xml:"urn:iso:std:iso:20022:tech:xsd:pain.001.001.09 Document"`
	Initn   *pain001Message `xml:"CstmrCdtTrfInitn"`
}

type pain001Message struct {
	GrpHdr pain001GroupHeader `xml:"GrpHdr"`
	PmtInf []paymentInfo      `xml:"PmtInf"`
}

type pain001GroupHeader struct {
	MsgID    string `xml:"MsgId"`
	CreDtTm  string `xml:"CreDtTm"`
	NbOfTxs  string `xml:"NbOfTxs"`
	CtrlSum  string `xml:"CtrlSum,omitempty"`
	InitgPty party  `xml:"InitgPty"`
}

type party struct {
	Nm string `xml:"Nm,omitempty"`
}

type paymentInfo struct {
	PmtInfID    string           `xml:"PmtInfId"`
	PmtMtd      string           `xml:"PmtMtd"`
	ReqdExctnDt dateChoice       `xml:"ReqdExctnDt"`
	Dbtr        party            `xml:"Dbtr"`
	DbtrAcct    *cashAccount     `xml:"DbtrAcct"`
	DbtrAgt     agent            `xml:"DbtrAgt"`
	CdtTrfTxInf []creditTransfer `xml:"CdtTrfTxInf"`
}

// dateChoice is DateAndDateTime2Choice.
type dateChoice struct {
	Dt   string `xml:"Dt,omitempty"`
	DtTm string `xml:"DtTm,omitempty"`
}

// time reads the choice: DtTm as it is, Dt at 00:00 UTC; ok false when neither
// is given.
func (d *dateChoice) time() (t time.Time, ok bool, err error) {
	switch {
	case d == nil || (d.Dt == "" && d.DtTm == ""):
		return time.Time{}, false, nil
	case d.DtTm != "":
		t, err = parseDateTime(d.DtTm)
	default:
		t, err = parseDate(d.Dt)
	}
	return t, err == nil, err
}

// agent is BranchAndFinancialInstitutionIdentification6 with only
// FinInstnId/Othr/Id.
type agent struct {
	FinInstnID struct {
		Othr *otherAcct `xml:"Othr,omitempty"`
	} `xml:"FinInstnId"`
}

type creditTransfer struct {
	PmtID struct {
		EndToEndID string `xml:"EndToEndId"`
	} `xml:"PmtId"`
	Amt struct {
		InstdAmt *amount `xml:"InstdAmt"`
	} `xml:"Amt"`
	Cdtr     *party       `xml:"Cdtr"`
	CdtrAcct *cashAccount `xml:"CdtrAcct"`
}

// WriteInitiation encodes in as a pain.001.001.09 document: GrpHdr (MsgId,
// CreDtTm, NbOfTxs 1, CtrlSum, InitgPty), one PmtInf (PmtInfId, PmtMtd TRF,
// ReqdExctnDt/Dt the creation date, Dbtr, DbtrAcct, DbtrAgt) and one
// CdtTrfTxInf (PmtId/EndToEndId, Amt/InstdAmt, Cdtr, CdtrAcct). The parties'
// names and the debtor's agent, which the schema requires but a payout does not
// carry, are NOTPROVIDED. An empty or over-long identifier, or a currency
// without an ISO 4217 exponent, is an error: the document would not validate.
func WriteInitiation(in Initiation) ([]byte, error) {
	for _, f := range []struct {
		name, v string
		max     int
	}{
		{"MsgId", in.MsgID, 35}, {"PmtInfId", in.PmtInfID, 35}, {"EndToEndId", in.EndToEndID, 35},
		{"DbtrAcct", in.DebtorAccount, 34}, {"CdtrAcct", in.CreditorAccount, 34},
	} {
		if err := checkText(f.name, f.v, f.max); err != nil {
			return nil, err
		}
	}
	amt, err := newAmount(in.AmountMinor, in.Currency)
	if err != nil {
		return nil, err
	}
	created := in.CreatedAt
	if created.IsZero() {
		return nil, errors.New("pain.001: no creation time")
	}
	dbtrAcct, cdtrAcct := newAccount(in.DebtorAccount), newAccount(in.CreditorAccount)
	tx := creditTransfer{Cdtr: &party{Nm: notProvided}, CdtrAcct: &cdtrAcct}
	tx.PmtID.EndToEndID = in.EndToEndID
	tx.Amt.InstdAmt = &amt
	pi := paymentInfo{
		PmtInfID:    in.PmtInfID,
		PmtMtd:      "TRF",
		ReqdExctnDt: dateChoice{Dt: formatDate(created)},
		Dbtr:        party{Nm: notProvided},
		DbtrAcct:    &dbtrAcct,
		CdtTrfTxInf: []creditTransfer{tx},
	}
	pi.DbtrAgt.FinInstnID.Othr = &otherAcct{ID: notProvided}
	return marshal(pain001Doc{Initn: &pain001Message{
		GrpHdr: pain001GroupHeader{
			MsgID: in.MsgID, CreDtTm: formatDateTime(created), NbOfTxs: "1", CtrlSum: amt.Value,
			InitgPty: party{Nm: "lock.dev"},
		},
		PmtInf: []paymentInfo{pi},
	}})
}

// ReadInitiation decodes a pain.001.001.09 document with exactly one PmtInf
// holding exactly one CdtTrfTxInf, whose amount is an InstdAmt and whose
// creditor account is given. NbOfTxs must be 1 and CtrlSum, when given, the
// amount; anything else is an error, not a guess.
func ReadInitiation(b []byte) (Initiation, error) {
	var doc pain001Doc
	if err := unmarshal(b, &doc); err != nil {
		return Initiation{}, fmt.Errorf("pain.001: %w", err)
	}
	m := doc.Initn
	if m == nil {
		return Initiation{}, errors.New("pain.001: no CstmrCdtTrfInitn")
	}
	if len(m.PmtInf) != 1 || len(m.PmtInf[0].CdtTrfTxInf) != 1 {
		return Initiation{}, errors.New("pain.001: not exactly one PmtInf with one CdtTrfTxInf")
	}
	if m.GrpHdr.NbOfTxs != "1" {
		return Initiation{}, fmt.Errorf("pain.001: NbOfTxs %q, not 1", m.GrpHdr.NbOfTxs)
	}
	pi, tx := m.PmtInf[0], m.PmtInf[0].CdtTrfTxInf[0]
	in := Initiation{MsgID: m.GrpHdr.MsgID, PmtInfID: pi.PmtInfID, EndToEndID: tx.PmtID.EndToEndID}
	for _, f := range []struct{ name, v string }{{"MsgId", in.MsgID}, {"PmtInfId", in.PmtInfID}, {"EndToEndId", in.EndToEndID}} {
		if err := checkText(f.name, f.v, 35); err != nil {
			return Initiation{}, err
		}
	}
	var err error
	if in.CreatedAt, err = parseDateTime(m.GrpHdr.CreDtTm); err != nil {
		return Initiation{}, fmt.Errorf("pain.001: CreDtTm: %w", err)
	}
	if in.DebtorAccount, err = pi.DbtrAcct.id(); err != nil {
		return Initiation{}, fmt.Errorf("pain.001: DbtrAcct: %w", err)
	}
	if in.CreditorAccount, err = tx.CdtrAcct.id(); err != nil {
		return Initiation{}, fmt.Errorf("pain.001: CdtrAcct: %w", err)
	}
	if tx.Amt.InstdAmt == nil {
		return Initiation{}, errors.New("pain.001: no Amt/InstdAmt")
	}
	in.Currency = tx.Amt.InstdAmt.Ccy
	if in.AmountMinor, err = tx.Amt.InstdAmt.minor(); err != nil {
		return Initiation{}, fmt.Errorf("pain.001: InstdAmt: %w", err)
	}
	if m.GrpHdr.CtrlSum != "" {
		sum, err := ParseAmount(trimSpace(m.GrpHdr.CtrlSum), in.Currency)
		if err != nil || sum != in.AmountMinor {
			return Initiation{}, fmt.Errorf("pain.001: CtrlSum %q is not the amount", m.GrpHdr.CtrlSum)
		}
	}
	return in, nil
}

// checkText refuses a text the schema's MaxNText would refuse — empty or
// longer than max characters — and one XML cannot carry as it is: invalid
// UTF-8, or a character outside XML's Char production (NUL and most C0
// controls), which encoding/xml would silently replace with U+FFFD.
func checkText(name, v string, max int) error {
	if v == "" {
		return fmt.Errorf("%s is empty", name)
	}
	if !utf8.ValidString(v) {
		return fmt.Errorf("%s is not valid UTF-8", name)
	}
	n := 0
	for _, r := range v {
		if !isXMLChar(r) {
			return fmt.Errorf("%s holds %U, which XML cannot carry", name, r)
		}
		n++
	}
	if n > max {
		return fmt.Errorf("%s has %d characters, at most %d fit", name, n, max)
	}
	return nil
}

// checkOptionalText is checkText for an element written only when v is set.
func checkOptionalText(name, v string, max int) error {
	if v == "" {
		return nil
	}
	return checkText(name, v, max)
}

// isXMLChar reports whether r is in XML 1.0's Char production.
func isXMLChar(r rune) bool {
	return r == 0x09 || r == 0x0A || r == 0x0D || (r >= 0x20 && r <= 0xD7FF) ||
		(r >= 0xE000 && r <= 0xFFFD) || (r >= 0x10000 && r <= 0x10FFFF)
}
