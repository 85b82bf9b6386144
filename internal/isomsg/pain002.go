package isomsg

import (
	"errors"
	"fmt"
	"time"
)

// StatusReport is one pain.002.001.10 status report on one transaction: the
// bank's answer to a pain.001 (docs/contracts/iso20022.md says what each status
// means to the gate).
type StatusReport struct {
	MsgID      string // GrpHdr/MsgId
	OrgnlMsgID string // OrgnlGrpInfAndSts/OrgnlMsgId: the pain.001's MsgId
	// OrgnlPmtInfID is OrgnlPmtInfAndSts/OrgnlPmtInfId, the pain.001's
	// PmtInfId; empty when written: the OrgnlMsgID, as the project's pain.001
	// uses one identifier for both.
	OrgnlPmtInfID  string
	EndToEndID     string // TxInfAndSts/OrgnlEndToEndId
	Status         string // TxInfAndSts/TxSts (ACSC, RJCT, PDNG …)
	AcctSvcrRef    string // TxInfAndSts/AcctSvcrRef
	ReasonCode     string // TxInfAndSts/StsRsnInf/Rsn/Cd (the first StsRsnInf)
	AdditionalInfo string // TxInfAndSts/StsRsnInf/AddtlInf (its first line)
	CreatedAt      time.Time
}

type pain002Doc struct {
	XMLName struct{}        `xml:"urn:iso:std:iso:20022:tech:xsd:pain.002.001.10 Document"`
	Rpt     *pain002Message `xml:"CstmrPmtStsRpt"`
}

type pain002Message struct {
	GrpHdr struct {
		MsgID   string `xml:"MsgId"`
		CreDtTm string `xml:"CreDtTm"`
	} `xml:"GrpHdr"`
	OrgnlGrpInfAndSts struct {
		OrgnlMsgID   []string `xml:"OrgnlMsgId"`
		OrgnlMsgNmID string   `xml:"OrgnlMsgNmId"`
	} `xml:"OrgnlGrpInfAndSts"`
	OrgnlPmtInfAndSts []orgnlPmtInf `xml:"OrgnlPmtInfAndSts"`
}

type orgnlPmtInf struct {
	OrgnlPmtInfID string        `xml:"OrgnlPmtInfId"`
	TxInfAndSts   []txInfAndSts `xml:"TxInfAndSts"`
}

// codeChoice is one of ISO 20022's "code or proprietary" choices.
type codeChoice struct {
	Cd    string `xml:"Cd,omitempty"`
	Prtry string `xml:"Prtry,omitempty"`
}

// txInfAndSts is PaymentTransaction105. Its single-valued elements that decide
// a verdict are slices, so that a document repeating one — which the schema
// forbids, and encoding/xml would read as the last — is refused rather than
// read as whichever came last.
type txInfAndSts struct {
	OrgnlEndToEndID []string       `xml:"OrgnlEndToEndId,omitempty"`
	TxSts           []string       `xml:"TxSts,omitempty"`
	StsRsnInf       []statusReason `xml:"StsRsnInf,omitempty"`
	AcctSvcrRef     []string       `xml:"AcctSvcrRef,omitempty"`
}

type statusReason struct {
	Rsn      *codeChoice `xml:"Rsn,omitempty"`
	AddtlInf []string    `xml:"AddtlInf,omitempty"`
}

// WriteStatusReport encodes r as a pain.002.001.10 document: GrpHdr (MsgId,
// CreDtTm), OrgnlGrpInfAndSts (OrgnlMsgId, OrgnlMsgNmId pain.001.001.09) and
// one OrgnlPmtInfAndSts with one TxInfAndSts (OrgnlEndToEndId, TxSts,
// StsRsnInf with Rsn/Cd and AddtlInf when given, AcctSvcrRef when given).
func WriteStatusReport(r StatusReport) ([]byte, error) {
	pmtInf := r.OrgnlPmtInfID
	if pmtInf == "" {
		pmtInf = r.OrgnlMsgID
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{{"MsgId", r.MsgID, 35}, {"OrgnlMsgId", r.OrgnlMsgID, 35}, {"OrgnlPmtInfId", pmtInf, 35},
		{"OrgnlEndToEndId", r.EndToEndID, 35}, {"TxSts", r.Status, 4}} {
		if err := checkText(f.name, f.v, f.max); err != nil {
			return nil, err
		}
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{{"AcctSvcrRef", r.AcctSvcrRef, 35}, {"Rsn/Cd", r.ReasonCode, 4}, {"AddtlInf", r.AdditionalInfo, 105}} {
		if err := checkOptionalText(f.name, f.v, f.max); err != nil {
			return nil, err
		}
	}
	if r.CreatedAt.IsZero() {
		return nil, errors.New("pain.002: no creation time")
	}
	tx := txInfAndSts{OrgnlEndToEndID: []string{r.EndToEndID}, TxSts: []string{r.Status}}
	if r.AcctSvcrRef != "" {
		tx.AcctSvcrRef = []string{r.AcctSvcrRef}
	}
	if r.ReasonCode != "" || r.AdditionalInfo != "" {
		var sr statusReason
		if r.ReasonCode != "" {
			sr.Rsn = &codeChoice{Cd: r.ReasonCode}
		}
		if r.AdditionalInfo != "" {
			sr.AddtlInf = []string{r.AdditionalInfo}
		}
		tx.StsRsnInf = []statusReason{sr}
	}
	var m pain002Message
	m.GrpHdr.MsgID, m.GrpHdr.CreDtTm = r.MsgID, formatDateTime(r.CreatedAt)
	m.OrgnlGrpInfAndSts.OrgnlMsgID, m.OrgnlGrpInfAndSts.OrgnlMsgNmID = []string{r.OrgnlMsgID}, "pain.001.001.09"
	m.OrgnlPmtInfAndSts = []orgnlPmtInf{{OrgnlPmtInfID: pmtInf, TxInfAndSts: []txInfAndSts{tx}}}
	return marshal(pain002Doc{Rpt: &m})
}

// ReadStatusReport decodes a pain.002.001.10 document reporting on exactly one
// transaction (one TxInfAndSts in all): a report on none — a group status
// alone — or on several is an error, as is a document that does not parse.
// The status and reason are returned as the bank wrote them; what they mean
// is the reader's to decide. A reason given as Rsn/Prtry instead of Rsn/Cd is
// returned as ReasonCode all the same.
func ReadStatusReport(b []byte) (StatusReport, error) {
	var doc pain002Doc
	if err := unmarshal(b, &doc); err != nil {
		return StatusReport{}, fmt.Errorf("pain.002: %w", err)
	}
	m := doc.Rpt
	if m == nil {
		return StatusReport{}, errors.New("pain.002: no CstmrPmtStsRpt")
	}
	r := StatusReport{MsgID: m.GrpHdr.MsgID}
	var txs []txInfAndSts
	for _, p := range m.OrgnlPmtInfAndSts {
		if len(p.TxInfAndSts) > 0 {
			r.OrgnlPmtInfID = p.OrgnlPmtInfID
		}
		txs = append(txs, p.TxInfAndSts...)
	}
	if len(txs) != 1 {
		return StatusReport{}, fmt.Errorf("pain.002: %d TxInfAndSts, not one", len(txs))
	}
	var err error
	if r.CreatedAt, err = parseDateTime(m.GrpHdr.CreDtTm); err != nil {
		return StatusReport{}, fmt.Errorf("pain.002: CreDtTm: %w", err)
	}
	tx := txs[0]
	for _, f := range []struct {
		name string
		vs   []string
		to   *string
	}{
		{"OrgnlMsgId", m.OrgnlGrpInfAndSts.OrgnlMsgID, &r.OrgnlMsgID}, {"OrgnlEndToEndId", tx.OrgnlEndToEndID, &r.EndToEndID},
		{"TxSts", tx.TxSts, &r.Status}, {"AcctSvcrRef", tx.AcctSvcrRef, &r.AcctSvcrRef},
	} {
		if len(f.vs) > 1 {
			return StatusReport{}, fmt.Errorf("pain.002: %d %s elements, at most one", len(f.vs), f.name)
		}
		if len(f.vs) == 1 {
			*f.to = f.vs[0]
		}
	}
	if len(tx.StsRsnInf) > 0 {
		sr := tx.StsRsnInf[0]
		if sr.Rsn != nil {
			r.ReasonCode = sr.Rsn.Cd
			if r.ReasonCode == "" {
				r.ReasonCode = sr.Rsn.Prtry
			}
		}
		if len(sr.AddtlInf) > 0 {
			r.AdditionalInfo = sr.AddtlInf[0]
		}
	}
	return r, nil
}
