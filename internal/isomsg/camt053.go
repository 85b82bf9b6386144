package isomsg

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"lock.dev/lockapi"
)

// Statement is one camt.053.001.08 Stmt: one account's statement over a
// period (docs/contracts/iso20022.md).
type Statement struct {
	ID       string     // Stmt/Id
	Account  string     // Stmt/Acct/Id: IBAN or Othr/Id
	From, To *time.Time // Stmt/FrToDt; nil when the statement has none
	// Currency is the balances' currency.
	Currency string
	// OpeningMinor and ClosingMinor are the booked balances (OPBD — or PRCD,
	// the previous statement's closing, when a bank gives that instead — and
	// CLBD), signed: credit +, debit −.
	OpeningMinor int64
	ClosingMinor int64
	Entries      []Entry
}

// Entry is one Ntry of a statement. The transaction's details are those of
// its one NtryDtls/TxDtls; an entry that batches several transactions carries
// none of them (and is refused when it is a booked debit).
type Entry struct {
	Ref             string // NtryRef
	AcctSvcrRef     string // TxDtls/Refs/AcctSvcrRef, else the entry's AcctSvcrRef
	EndToEndID      string // TxDtls/Refs/EndToEndId
	CreditorAccount string // TxDtls/RltdPties/CdtrAcct: IBAN or Othr/Id
	Currency        string // Amt/@Ccy
	AmountMinor     int64  // Amt, unsigned: the direction is Debit
	Debit           bool   // CdtDbtInd DBIT (else CRDT)
	Status          string // Sts/Cd (BOOK, PDNG, INFO …)
	// BookedAt is BookgDt/DtTm, or BookgDt/Dt at 00:00 UTC; zero when the
	// entry has no booking date.
	BookedAt time.Time
	// InstructedMinor and InstructedCurrency are TxDtls/AmtDtls/InstdAmt/Amt:
	// the amount as the payment instructed it, which the entry's Amt may differ
	// from (charges, the account's currency). Nil when absent.
	InstructedMinor    *int64
	InstructedCurrency string
}

type camt053Doc struct {
	XMLName struct{}        `xml:"urn:iso:std:iso:20022:tech:xsd:camt.053.001.08 Document"`
	Stmt    *camt053Message `xml:"BkToCstmrStmt"`
}

type camt053Message struct {
	GrpHdr struct {
		MsgID   string `xml:"MsgId"`
		CreDtTm string `xml:"CreDtTm"`
	} `xml:"GrpHdr"`
	Stmt []stmtXML `xml:"Stmt"`
}

type stmtXML struct {
	ID      string       `xml:"Id"`
	CreDtTm string       `xml:"CreDtTm,omitempty"`
	FrToDt  *period      `xml:"FrToDt,omitempty"`
	Acct    *cashAccount `xml:"Acct"`
	Bal     []balanceXML `xml:"Bal"`
	Ntry    []entryXML   `xml:"Ntry"`
}

type balanceXML struct {
	Tp struct {
		CdOrPrtry codeChoice `xml:"CdOrPrtry"`
	} `xml:"Tp"`
	Amt       amount     `xml:"Amt"`
	CdtDbtInd string     `xml:"CdtDbtInd"`
	Dt        dateChoice `xml:"Dt"`
}

type entryXML struct {
	NtryRef     string      `xml:"NtryRef,omitempty"`
	Amt         amount      `xml:"Amt"`
	CdtDbtInd   string      `xml:"CdtDbtInd"`
	RvslInd     string      `xml:"RvslInd,omitempty"`
	Sts         codeChoice  `xml:"Sts"`
	BookgDt     *dateChoice `xml:"BookgDt,omitempty"`
	AcctSvcrRef string      `xml:"AcctSvcrRef,omitempty"`
	BkTxCd      struct {
		Domn *txCodeDomain `xml:"Domn,omitempty"`
	} `xml:"BkTxCd"`
	NtryDtls []entryDetails `xml:"NtryDtls,omitempty"`
}

// period is DateTimePeriod1.
type period struct {
	FrDtTm string `xml:"FrDtTm"`
	ToDtTm string `xml:"ToDtTm"`
}

// txCodeDomain is BankTransactionCodeStructure5: domain, family, sub-family.
type txCodeDomain struct {
	Cd   string `xml:"Cd"`
	Fmly struct {
		Cd        string `xml:"Cd"`
		SubFmlyCd string `xml:"SubFmlyCd"`
	} `xml:"Fmly"`
}

type entryDetails struct {
	TxDtls []txDtlsXML `xml:"TxDtls"`
}

type txRefs struct {
	AcctSvcrRef string `xml:"AcctSvcrRef,omitempty"`
	EndToEndID  string `xml:"EndToEndId,omitempty"`
}

type amountDetails struct {
	InstdAmt *struct {
		Amt amount `xml:"Amt"`
	} `xml:"InstdAmt,omitempty"`
}

type relatedParties struct {
	CdtrAcct *cashAccount `xml:"CdtrAcct,omitempty"`
}

type txDtlsXML struct {
	Refs      *txRefs         `xml:"Refs,omitempty"`
	AmtDtls   *amountDetails  `xml:"AmtDtls,omitempty"`
	RltdPties *relatedParties `xml:"RltdPties,omitempty"`
}

const (
	credit = "CRDT"
	debit  = "DBIT"
	// Booked is Ntry/Sts/Cd of an entry the bank has booked: only booked
	// entries moved money.
	Booked = "BOOK"
)

// WriteStatements encodes stmts as one camt.053.001.08 document with one Stmt
// each: Id, CreDtTm, FrToDt when From and To are set, Acct, the balances OPBD
// and CLBD (dated From's and To's day, else createdAt's), and per entry NtryRef,
// Amt, CdtDbtInd, Sts/Cd, BookgDt/DtTm, AcctSvcrRef, BkTxCd (payments, issued
// or received credit transfer; SEPA's ESCT for euros, OTHR otherwise) and one
// TxDtls with Refs (AcctSvcrRef, EndToEndId), AmtDtls/InstdAmt and
// RltdPties/CdtrAcct as far as the entry has them. A document needs at least
// one statement, as the schema does.
func WriteStatements(msgID string, createdAt time.Time, stmts []Statement) ([]byte, error) {
	if err := checkText("MsgId", msgID, 35); err != nil {
		return nil, err
	}
	if createdAt.IsZero() {
		return nil, errors.New("camt.053: no creation time")
	}
	if len(stmts) == 0 {
		return nil, errors.New("camt.053: no statement")
	}
	var m camt053Message
	m.GrpHdr.MsgID, m.GrpHdr.CreDtTm = msgID, formatDateTime(createdAt)
	for i, s := range stmts {
		x, err := s.xml(createdAt)
		if err != nil {
			return nil, fmt.Errorf("camt.053: statement %d: %w", i, err)
		}
		m.Stmt = append(m.Stmt, x)
	}
	return marshal(camt053Doc{Stmt: &m})
}

func (s Statement) xml(createdAt time.Time) (stmtXML, error) {
	if err := checkText("Stmt/Id", s.ID, 35); err != nil {
		return stmtXML{}, err
	}
	if err := checkText("Acct", s.Account, 34); err != nil {
		return stmtXML{}, err
	}
	acct := newAccount(s.Account)
	x := stmtXML{ID: s.ID, CreDtTm: formatDateTime(createdAt), Acct: &acct}
	openDay, closeDay := createdAt, createdAt
	if (s.From == nil) != (s.To == nil) {
		return stmtXML{}, errors.New("FrToDt needs both From and To")
	}
	if s.From != nil {
		x.FrToDt = &period{FrDtTm: formatDateTime(*s.From), ToDtTm: formatDateTime(*s.To)}
		openDay, closeDay = *s.From, *s.To
	}
	for _, b := range []struct {
		code  string
		minor int64
		day   time.Time
	}{{"OPBD", s.OpeningMinor, openDay}, {"CLBD", s.ClosingMinor, closeDay}} {
		ind, abs := credit, b.minor
		if b.minor < 0 {
			if b.minor == math.MinInt64 {
				return stmtXML{}, fmt.Errorf("balance %s out of range", b.code)
			}
			ind, abs = debit, -b.minor
		}
		amt, err := newAmount(abs, s.Currency)
		if err != nil {
			return stmtXML{}, fmt.Errorf("balance %s: %w", b.code, err)
		}
		var bal balanceXML
		bal.Tp.CdOrPrtry.Cd = b.code
		bal.Amt, bal.CdtDbtInd, bal.Dt = amt, ind, dateChoice{Dt: formatDate(b.day)}
		x.Bal = append(x.Bal, bal)
	}
	for i, e := range s.Entries {
		n, err := e.xml()
		if err != nil {
			return stmtXML{}, fmt.Errorf("entry %d: %w", i, err)
		}
		x.Ntry = append(x.Ntry, n)
	}
	return x, nil
}

func (e Entry) xml() (entryXML, error) {
	amt, err := newAmount(e.AmountMinor, e.Currency)
	if err != nil {
		return entryXML{}, err
	}
	if err := checkText("Sts/Cd", e.Status, 4); err != nil {
		return entryXML{}, err
	}
	for _, f := range []struct{ name, v string }{{"NtryRef", e.Ref}, {"AcctSvcrRef", e.AcctSvcrRef}, {"EndToEndId", e.EndToEndID}} {
		if err := checkOptionalText(f.name, f.v, 35); err != nil {
			return entryXML{}, err
		}
	}
	n := entryXML{NtryRef: e.Ref, Amt: amt, CdtDbtInd: credit, Sts: codeChoice{Cd: e.Status}, AcctSvcrRef: e.AcctSvcrRef}
	family := "RCDT" // received credit transfers
	if e.Debit {
		n.CdtDbtInd, family = debit, "ICDT" // issued credit transfers
	}
	sub := "OTHR"
	if e.Currency == "EUR" {
		sub = "ESCT" // SEPA credit transfer
	}
	n.BkTxCd.Domn = &txCodeDomain{Cd: "PMNT"}
	n.BkTxCd.Domn.Fmly.Cd, n.BkTxCd.Domn.Fmly.SubFmlyCd = family, sub
	if !e.BookedAt.IsZero() {
		n.BookgDt = &dateChoice{DtTm: formatDateTime(e.BookedAt)}
	}
	var tx txDtlsXML
	if e.AcctSvcrRef != "" || e.EndToEndID != "" {
		tx.Refs = &txRefs{AcctSvcrRef: e.AcctSvcrRef, EndToEndID: e.EndToEndID}
	}
	if e.InstructedMinor != nil {
		ia, err := newAmount(*e.InstructedMinor, e.InstructedCurrency)
		if err != nil {
			return entryXML{}, fmt.Errorf("InstdAmt: %w", err)
		}
		tx.AmtDtls = &amountDetails{InstdAmt: &struct {
			Amt amount `xml:"Amt"`
		}{Amt: ia}}
	}
	if e.CreditorAccount != "" {
		if err := checkText("CdtrAcct", e.CreditorAccount, 34); err != nil {
			return entryXML{}, err
		}
		ca := newAccount(e.CreditorAccount)
		tx.RltdPties = &relatedParties{CdtrAcct: &ca}
	}
	if tx.Refs != nil || tx.AmtDtls != nil || tx.RltdPties != nil {
		n.NtryDtls = []entryDetails{{TxDtls: []txDtlsXML{tx}}}
	}
	return n, nil
}

// ReadStatements decodes a camt.053.001.08 document's statements. It reads
// what the project uses and ignores every other element, so a bank's richer
// statement is read; it refuses a document that does not parse or is in
// another namespace, a statement without Id, account, or booked opening (OPBD
// or PRCD) and closing (CLBD) balances in one currency, an amount that is not
// one in its currency's ISO 4217 exponent, a CdtDbtInd other than CRDT or
// DBIT, a malformed date, and a booked debit entry the books could not match:
// one without EndToEndId, AcctSvcrRef, creditor account or booking date, one
// batching several transactions, or a reversal.
func ReadStatements(b []byte) ([]Statement, error) {
	var doc camt053Doc
	if err := unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("camt.053: %w", err)
	}
	if doc.Stmt == nil || len(doc.Stmt.Stmt) == 0 {
		return nil, errors.New("camt.053: no BkToCstmrStmt/Stmt")
	}
	out := make([]Statement, 0, len(doc.Stmt.Stmt))
	for i, x := range doc.Stmt.Stmt {
		s, err := x.statement()
		if err != nil {
			return nil, fmt.Errorf("camt.053: statement %d (%q): %w", i, x.ID, err)
		}
		out = append(out, s)
	}
	return out, nil
}

func (x stmtXML) statement() (Statement, error) {
	s := Statement{ID: x.ID}
	if s.ID == "" {
		return Statement{}, errors.New("no Id")
	}
	var err error
	if s.Account, err = x.Acct.id(); err != nil {
		return Statement{}, fmt.Errorf("account (Acct): %w", err)
	}
	if x.FrToDt != nil {
		from, err := parseDateTime(x.FrToDt.FrDtTm)
		if err != nil {
			return Statement{}, fmt.Errorf("FrToDt/FrDtTm: %w", err)
		}
		to, err := parseDateTime(x.FrToDt.ToDtTm)
		if err != nil {
			return Statement{}, fmt.Errorf("FrToDt/ToDtTm: %w", err)
		}
		s.From, s.To = &from, &to
	}
	var opening, closing, previous *balanceXML
	for i := range x.Bal {
		switch x.Bal[i].Tp.CdOrPrtry.Cd {
		case "OPBD":
			opening = &x.Bal[i]
		case "PRCD":
			previous = &x.Bal[i]
		case "CLBD":
			closing = &x.Bal[i]
		}
	}
	if opening == nil {
		opening = previous
	}
	if opening == nil || closing == nil {
		return Statement{}, errors.New("no booked opening (OPBD or PRCD) and closing (CLBD) balances")
	}
	if opening.Amt.Ccy != closing.Amt.Ccy {
		return Statement{}, fmt.Errorf("opening balance in %s, closing in %s", opening.Amt.Ccy, closing.Amt.Ccy)
	}
	s.Currency = closing.Amt.Ccy
	if s.OpeningMinor, err = opening.signed(); err != nil {
		return Statement{}, fmt.Errorf("opening balance: %w", err)
	}
	if s.ClosingMinor, err = closing.signed(); err != nil {
		return Statement{}, fmt.Errorf("closing balance: %w", err)
	}
	for i, n := range x.Ntry {
		e, err := n.entry()
		if err != nil {
			return Statement{}, fmt.Errorf("entry %d (NtryRef %q): %w", i, n.NtryRef, err)
		}
		s.Entries = append(s.Entries, e)
	}
	return s, nil
}

func (b *balanceXML) signed() (int64, error) {
	v, err := b.Amt.minor()
	if err != nil {
		return 0, err
	}
	switch b.CdtDbtInd {
	case credit:
		return v, nil
	case debit:
		return -v, nil
	}
	return 0, fmt.Errorf("CdtDbtInd %q is neither CRDT nor DBIT", b.CdtDbtInd)
}

func (n entryXML) entry() (Entry, error) {
	e := Entry{Ref: n.NtryRef, Currency: n.Amt.Ccy, Status: n.Sts.Cd, AcctSvcrRef: n.AcctSvcrRef}
	var err error
	if e.AmountMinor, err = n.Amt.minor(); err != nil {
		return Entry{}, fmt.Errorf("amount (Amt): %w", err)
	}
	switch n.CdtDbtInd {
	case credit:
	case debit:
		e.Debit = true
	default:
		return Entry{}, fmt.Errorf("CdtDbtInd %q is neither CRDT nor DBIT", n.CdtDbtInd)
	}
	if e.BookedAt, _, err = n.BookgDt.time(); err != nil {
		return Entry{}, fmt.Errorf("BookgDt: %w", err)
	}
	var txs []txDtlsXML
	for _, d := range n.NtryDtls {
		txs = append(txs, d.TxDtls...)
	}
	bookedDebit := e.Debit && e.Status == Booked
	if len(txs) == 1 {
		tx := txs[0]
		if tx.Refs != nil {
			e.EndToEndID = tx.Refs.EndToEndID
			if tx.Refs.AcctSvcrRef != "" {
				e.AcctSvcrRef = tx.Refs.AcctSvcrRef
			}
		}
		if tx.AmtDtls != nil && tx.AmtDtls.InstdAmt != nil {
			v, err := tx.AmtDtls.InstdAmt.Amt.minor()
			if err != nil {
				return Entry{}, fmt.Errorf("TxDtls/AmtDtls/InstdAmt: %w", err)
			}
			e.InstructedMinor, e.InstructedCurrency = &v, tx.AmtDtls.InstdAmt.Amt.Ccy
		}
		if tx.RltdPties != nil && tx.RltdPties.CdtrAcct != nil {
			if e.CreditorAccount, err = tx.RltdPties.CdtrAcct.id(); err != nil {
				return Entry{}, fmt.Errorf("TxDtls/RltdPties/CdtrAcct: %w", err)
			}
		}
	}
	if !bookedDebit {
		return e, nil
	}
	switch {
	case len(txs) != 1:
		return Entry{}, fmt.Errorf("booked debit with %d TxDtls, not one: a batch the books cannot match payout by payout", len(txs))
	case trimSpace(n.RvslInd) == "true" || trimSpace(n.RvslInd) == "1":
		return Entry{}, errors.New("booked debit is a reversal, which the books do not read")
	case e.EndToEndID == "":
		return Entry{}, errors.New("booked debit without TxDtls/Refs/EndToEndId")
	case e.AcctSvcrRef == "":
		return Entry{}, errors.New("booked debit without AcctSvcrRef")
	case e.CreditorAccount == "":
		return Entry{}, errors.New("booked debit without TxDtls/RltdPties/CdtrAcct")
	case e.BookedAt.IsZero():
		return Entry{}, errors.New("booked debit without BookgDt")
	}
	return e, nil
}

// Balanced checks that the closing balance minus the opening one is the sum of
// the booked entries (credits +, debits −), all in the statement's currency: a
// statement that does not add up is not one to settle the books from. Entries
// not booked (PDNG, INFO) moved nothing yet and are not counted.
func (s Statement) Balanced() error {
	sum := s.OpeningMinor
	for i, e := range s.Entries {
		if e.Status != Booked {
			continue
		}
		if e.Currency != s.Currency {
			return fmt.Errorf("statement %q: entry %d in %s, balances in %s", s.ID, i, e.Currency, s.Currency)
		}
		d := e.AmountMinor
		if e.Debit {
			d = -d
		}
		if (d > 0 && sum > math.MaxInt64-d) || (d < 0 && sum < math.MinInt64-d) {
			return fmt.Errorf("statement %q: entries overflow", s.ID)
		}
		sum += d
	}
	if sum != s.ClosingMinor {
		return fmt.Errorf("statement %q does not balance: opening %d plus entries is %d, closing is %d",
			s.ID, s.OpeningMinor, sum, s.ClosingMinor)
	}
	return nil
}

// Lines are the statement's booked debit entries (Sts/Cd BOOK, CdtDbtInd DBIT)
// as ACCEPTED statement lines, in the statement's order: seq = NtryRef, which
// must be a decimal number (the rail numbers its entries); reference =
// EndToEndId; railReference = AcctSvcrRef; amount and currency from
// TxDtls/AmtDtls/InstdAmt when present, else the entry's Amt; account = the
// statement's; beneficiary = RltdPties/CdtrAcct; receivedAt = the booking date.
// Credits and entries not booked are not lines: a bank statement lists what
// moved, and declines never appear in it.
func (s Statement) Lines() ([]lockapi.StatementLine, error) { return s.lines(true) }

// UnnumberedLines are Lines with Seq 0 and NtryRef not read, for a reader that
// numbers the lines itself (the reconciler's statement files, in import
// order): a bank's NtryRef is optional and need not be a number.
func (s Statement) UnnumberedLines() ([]lockapi.StatementLine, error) { return s.lines(false) }

func (s Statement) lines(numbered bool) ([]lockapi.StatementLine, error) {
	var lines []lockapi.StatementLine
	for i, e := range s.Entries {
		if !e.Debit || e.Status != Booked {
			continue
		}
		var seq int64
		if numbered {
			if e.Ref == "" || !allDigits(e.Ref) {
				return nil, fmt.Errorf("statement %q: entry %d: NtryRef %q is not a decimal number", s.ID, i, e.Ref)
			}
			var err error
			if seq, err = strconv.ParseInt(e.Ref, 10, 64); err != nil {
				return nil, fmt.Errorf("statement %q: entry %d: NtryRef %q: %w", s.ID, i, e.Ref, err)
			}
		}
		if e.EndToEndID == "" || e.AcctSvcrRef == "" || e.CreditorAccount == "" || e.BookedAt.IsZero() {
			return nil, fmt.Errorf("statement %q: entry %d: booked debit without EndToEndId, AcctSvcrRef, creditor account or booking date", s.ID, i)
		}
		amountMinor, currency := e.AmountMinor, e.Currency
		if e.InstructedMinor != nil {
			amountMinor, currency = *e.InstructedMinor, e.InstructedCurrency
		}
		ref := e.AcctSvcrRef
		lines = append(lines, lockapi.StatementLine{
			Seq: seq, ReceivedAt: e.BookedAt.UTC(), Reference: e.EndToEndID, AccountID: s.Account,
			AmountMinor: amountMinor, Currency: currency, Beneficiary: e.CreditorAccount,
			Result: lockapi.ResultAccepted, RailReference: &ref,
		})
	}
	return lines, nil
}
