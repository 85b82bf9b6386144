package isomsg_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/isomsg"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

var created = time.Date(2026, 12, 3, 21, 30, 15, 123456000, time.UTC)

func initiation(debtor, creditor string) isomsg.Initiation {
	return isomsg.Initiation{
		MsgID: "submission-42", PmtInfID: "submission-42", EndToEndID: "payout-7",
		DebtorAccount: debtor, CreditorAccount: creditor,
		AmountMinor: 1395, Currency: "EUR", CreatedAt: created,
	}
}

func TestInitiationValidatesAndRoundTrips(t *testing.T) {
	for _, in := range []isomsg.Initiation{
		initiation("DE89370400440532013000", "NL91ABNA0417164300"),
		initiation("acct-1", "ben-42"),
		initiation("acct-1", "NL91 ABNA 0417 1643 00"),
		func() isomsg.Initiation {
			in := initiation("acct-1", "ben-42")
			in.AmountMinor, in.Currency = 1395, "BHD"
			in.EndToEndID = strings.Repeat("p", 35)
			in.CreditorAccount = strings.Repeat("b", 34)
			return in
		}(),
		func() isomsg.Initiation {
			in := initiation("acct-1", "ben-42")
			in.AmountMinor, in.Currency = 0, "JPY"
			return in
		}(),
	} {
		doc, err := isomsg.WriteInitiation(in)
		if err != nil {
			t.Fatalf("WriteInitiation(%+v): %v", in, err)
		}
		testkit.ValidateISO20022(t, doc)
		back, err := isomsg.ReadInitiation(doc)
		if err != nil {
			t.Fatalf("ReadInitiation: %v\n%s", err, doc)
		}
		if !back.CreatedAt.Equal(in.CreatedAt) {
			t.Errorf("CreatedAt %v, want %v", back.CreatedAt, in.CreatedAt)
		}
		back.CreatedAt = in.CreatedAt
		if back != in {
			t.Errorf("round trip: %+v, want %+v", back, in)
		}
	}
}

func TestInitiationWritesIBANOrOthr(t *testing.T) {
	doc, err := isomsg.WriteInitiation(initiation("DE89370400440532013000", "ben-42"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(doc)
	for _, want := range []string{
		`<Document xmlns="urn:iso:std:iso:20022:tech:xsd:pain.001.001.09">`,
		`<DbtrAcct><Id><IBAN>DE89370400440532013000</IBAN></Id></DbtrAcct>`,
		`<CdtrAcct><Id><Othr><Id>ben-42</Id></Othr></Id></CdtrAcct>`,
		`<InstdAmt Ccy="EUR">13.95</InstdAmt>`,
		`<CtrlSum>13.95</CtrlSum>`, `<NbOfTxs>1</NbOfTxs>`, `<PmtMtd>TRF</PmtMtd>`,
		`<ReqdExctnDt><Dt>2026-12-03</Dt></ReqdExctnDt>`,
		`<DbtrAgt><FinInstnId><Othr><Id>NOTPROVIDED</Id></Othr></FinInstnId></DbtrAgt>`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("pain.001 lacks %s:\n%s", want, s)
		}
	}
}

func TestWriteInitiationRefuses(t *testing.T) {
	for name, mutate := range map[string]func(*isomsg.Initiation){
		"EndToEndId over 35": func(in *isomsg.Initiation) { in.EndToEndID = strings.Repeat("p", 36) },
		"creditor over 34":   func(in *isomsg.Initiation) { in.CreditorAccount = strings.Repeat("b", 35) },
		"debtor over 34":     func(in *isomsg.Initiation) { in.DebtorAccount = strings.Repeat("a", 35) },
		"empty MsgId":        func(in *isomsg.Initiation) { in.MsgID = "" },
		"no exponent":        func(in *isomsg.Initiation) { in.Currency = "XAU" },
		"unknown currency":   func(in *isomsg.Initiation) { in.Currency = "ZZZ" },
		"negative amount":    func(in *isomsg.Initiation) { in.AmountMinor = -1 },
		"no creation time":   func(in *isomsg.Initiation) { in.CreatedAt = time.Time{} },
		"NUL in creditor":    func(in *isomsg.Initiation) { in.CreditorAccount = "ben\x00-42" },
		"control in debtor":  func(in *isomsg.Initiation) { in.DebtorAccount = "acct\x01" },
		"not UTF-8":          func(in *isomsg.Initiation) { in.EndToEndID = "p-\xff" },
	} {
		in := initiation("acct-1", "ben-42")
		mutate(&in)
		if _, err := isomsg.WriteInitiation(in); err == nil {
			t.Errorf("%s: written", name)
		}
	}
}

func TestReadInitiationRefuses(t *testing.T) {
	good, err := isomsg.WriteInitiation(initiation("acct-1", "ben-42"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(good)
	pmtInf := s[strings.Index(s, "<PmtInf>"):strings.Index(s, "</CstmrCdtTrfInitn>")]
	tx := s[strings.Index(s, "<CdtTrfTxInf>") : strings.Index(s, "</CdtTrfTxInf>")+len("</CdtTrfTxInf>")]
	for name, doc := range map[string]string{
		"two PmtInf":        strings.Replace(s, pmtInf, pmtInf+pmtInf, 1),
		"two CdtTrfTxInf":   strings.Replace(s, tx, tx+tx, 1),
		"other namespace":   strings.Replace(s, "pain.001.001.09", "pain.001.001.03", 1),
		"bad amount":        strings.Replace(s, ">13.95</InstdAmt>", ">13.955</InstdAmt>", 1),
		"unknown currency":  strings.ReplaceAll(s, `Ccy="EUR"`, `Ccy="ZZZ"`),
		"no CdtrAcct":       strings.Replace(s, "<CdtrAcct><Id><Othr><Id>ben-42</Id></Othr></Id></CdtrAcct>", "", 1),
		"empty account":     strings.Replace(s, "<Id>ben-42</Id>", "<Id></Id>", 1),
		"NbOfTxs 2":         strings.Replace(s, "<NbOfTxs>1</NbOfTxs>", "<NbOfTxs>2</NbOfTxs>", 1),
		"CtrlSum differs":   strings.Replace(s, "<CtrlSum>13.95</CtrlSum>", "<CtrlSum>13.96</CtrlSum>", 1),
		"bad CreDtTm":       strings.Replace(s, "<CreDtTm>2026-12-03T21:30:15.123456Z", "<CreDtTm>yesterday", 1),
		"trailing element":  s + "<Document/>",
		"not XML":           "13.95 EUR to ben-42",
		"NUL in EndToEndId": strings.Replace(s, "payout-7", "payout\x00-7", 1),
		"truncated":         s[:len(s)/2],
	} {
		if doc == s {
			t.Fatalf("%s: the mutation changed nothing", name)
		}
		if in, err := isomsg.ReadInitiation([]byte(doc)); err == nil {
			t.Errorf("%s: read as %+v", name, in)
		}
	}
}

func report(status string) isomsg.StatusReport {
	return isomsg.StatusReport{
		MsgID: "rail-7", OrgnlMsgID: "submission-42", OrgnlPmtInfID: "submission-42",
		EndToEndID: "payout-7", Status: status, CreatedAt: created,
	}
}

func TestStatusReportValidatesAndRoundTrips(t *testing.T) {
	accepted := report("ACSC")
	accepted.AcctSvcrRef = "BANK-TX-41"
	rejected := report("RJCT")
	rejected.ReasonCode, rejected.AdditionalInfo = "AC04", "Account closed"
	rejectedBare := report("RJCT")
	pending := report("PDNG")
	noPmtInfID := report("ACCP")
	noPmtInfID.OrgnlPmtInfID = ""
	for _, r := range []isomsg.StatusReport{accepted, rejected, rejectedBare, pending, noPmtInfID} {
		doc, err := isomsg.WriteStatusReport(r)
		if err != nil {
			t.Fatalf("WriteStatusReport(%+v): %v", r, err)
		}
		testkit.ValidateISO20022(t, doc)
		back, err := isomsg.ReadStatusReport(doc)
		if err != nil {
			t.Fatalf("ReadStatusReport: %v\n%s", err, doc)
		}
		if !back.CreatedAt.Equal(r.CreatedAt) {
			t.Errorf("CreatedAt %v, want %v", back.CreatedAt, r.CreatedAt)
		}
		want := r
		want.CreatedAt = back.CreatedAt
		if want.OrgnlPmtInfID == "" {
			want.OrgnlPmtInfID = want.OrgnlMsgID
		}
		if back != want {
			t.Errorf("round trip: %+v, want %+v", back, want)
		}
	}
}

func TestWriteStatusReportRefusesWhatWouldNotValidate(t *testing.T) {
	for name, mutate := range map[string]func(*isomsg.StatusReport){
		"AcctSvcrRef over 35": func(r *isomsg.StatusReport) { r.AcctSvcrRef = strings.Repeat("R", 36) },
		"reason over 4":       func(r *isomsg.StatusReport) { r.ReasonCode = "AC041" },
		"no status":           func(r *isomsg.StatusReport) { r.Status = "" },
		"NUL in reference":    func(r *isomsg.StatusReport) { r.AcctSvcrRef = "R\x00" },
	} {
		r := report("ACSC")
		mutate(&r)
		if _, err := isomsg.WriteStatusReport(r); err == nil {
			t.Errorf("%s: written", name)
		}
	}
}

func TestReadStatusReportRefuses(t *testing.T) {
	r := report("ACSC")
	r.AcctSvcrRef = "BANK-TX-41"
	good, err := isomsg.WriteStatusReport(r)
	if err != nil {
		t.Fatal(err)
	}
	s := string(good)
	tx := s[strings.Index(s, "<TxInfAndSts>") : strings.Index(s, "</TxInfAndSts>")+len("</TxInfAndSts>")]
	for name, doc := range map[string]string{
		"no transaction":   strings.Replace(s, tx, "", 1),
		"two transactions": strings.Replace(s, tx, tx+tx, 1),
		"other namespace":  strings.Replace(s, "pain.002.001.10", "pain.002.001.03", 1),
		"pain.001":         strings.ReplaceAll(strings.Replace(s, "pain.002.001.10", "pain.001.001.09", 1), "CstmrPmtStsRpt", "CstmrCdtTrfInitn"),
		"NUL in reference": strings.Replace(s, "BANK-TX-41", "BANK\x00TX-41", 1),
		"bad CreDtTm":      strings.Replace(s, "<CreDtTm>2026", "<CreDtTm>x2026", 1),
		"two roots":        s + s,
		"two TxSts":        strings.Replace(s, "<TxSts>ACSC</TxSts>", "<TxSts>RJCT</TxSts><TxSts>ACSC</TxSts>", 1),
		"two references":   strings.Replace(s, "<AcctSvcrRef>BANK-TX-41</AcctSvcrRef>", "<AcctSvcrRef>A</AcctSvcrRef><AcctSvcrRef>BANK-TX-41</AcctSvcrRef>", 1),
		"two EndToEndIds":  strings.Replace(s, "<OrgnlEndToEndId>payout-7</OrgnlEndToEndId>", "<OrgnlEndToEndId>payout-8</OrgnlEndToEndId><OrgnlEndToEndId>payout-7</OrgnlEndToEndId>", 1),
		"empty":            "",
	} {
		if doc == s {
			t.Fatalf("%s: the mutation changed nothing", name)
		}
		if back, err := isomsg.ReadStatusReport([]byte(doc)); err == nil {
			t.Errorf("%s: read as %+v", name, back)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestStatementsValidateRoundTripAndGiveLines(t *testing.T) {
	from, to := created.Add(-5*time.Second), created
	booked := created.Add(-2 * time.Second).Truncate(time.Microsecond)
	stmts := []isomsg.Statement{
		{
			ID: "stmt-1", Account: "acct-1", From: &from, To: &to, Currency: "EUR",
			OpeningMinor: 0, ClosingMinor: -1395 - 400 + 250,
			Entries: []isomsg.Entry{
				{Ref: "1", AcctSvcrRef: "rail-1", EndToEndID: "payout-1", CreditorAccount: "NL91ABNA0417164300",
					Currency: "EUR", AmountMinor: 1395, Debit: true, Status: "BOOK", BookedAt: booked},
				{Ref: "2", AcctSvcrRef: "rail-2", EndToEndID: "payout-2", CreditorAccount: "ben-2",
					Currency: "EUR", AmountMinor: 400, Debit: true, Status: "BOOK", BookedAt: booked,
					InstructedMinor: ptr(int64(1395)), InstructedCurrency: "BHD"},
				{Ref: "3", AcctSvcrRef: "rail-3", Currency: "EUR", AmountMinor: 250, Status: "BOOK", BookedAt: booked},
				{Ref: "4", Currency: "EUR", AmountMinor: 99, Debit: true, Status: "PDNG"},
			},
		},
		{ID: "stmt-empty", Account: "DE89370400440532013000", Currency: "JPY", OpeningMinor: -5, ClosingMinor: -5},
	}
	doc, err := isomsg.WriteStatements("camt-1", created, stmts)
	if err != nil {
		t.Fatal(err)
	}
	testkit.ValidateISO20022(t, doc)
	back, err := isomsg.ReadStatements(doc)
	if err != nil {
		t.Fatalf("ReadStatements: %v\n%s", err, doc)
	}
	if !reflect.DeepEqual(back, stmts) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, stmts)
	}
	for _, s := range back {
		if err := s.Balanced(); err != nil {
			t.Errorf("Balanced: %v", err)
		}
	}
	lines, err := back[0].Lines()
	if err != nil {
		t.Fatal(err)
	}
	want := []lockapi.StatementLine{
		{Seq: 1, ReceivedAt: booked, Reference: "payout-1", AccountID: "acct-1", AmountMinor: 1395, Currency: "EUR",
			Beneficiary: "NL91ABNA0417164300", Result: lockapi.ResultAccepted, RailReference: ptr("rail-1")},
		{Seq: 2, ReceivedAt: booked, Reference: "payout-2", AccountID: "acct-1", AmountMinor: 1395, Currency: "BHD",
			Beneficiary: "ben-2", Result: lockapi.ResultAccepted, RailReference: ptr("rail-2")},
	}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("Lines:\n got %+v\nwant %+v", lines, want)
	}
	if s := string(doc); !strings.Contains(s, "<Domn><Cd>PMNT</Cd><Fmly><Cd>ICDT</Cd><SubFmlyCd>ESCT</SubFmlyCd></Fmly></Domn>") {
		t.Errorf("no outgoing SEPA credit transfer code in\n%s", s)
	}
}

func readFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestReadsABanksRicherStatement(t *testing.T) {
	doc := readFixture(t, "bank-statement.xml")
	testkit.ValidateISO20022(t, []byte(doc))
	stmts, err := isomsg.ReadStatements([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(stmts) != 1 {
		t.Fatalf("%d statements, want 1", len(stmts))
	}
	s := stmts[0]
	if s.Account != "DE89370400440532013000" || s.Currency != "EUR" || s.OpeningMinor != 100000 || s.ClosingMinor != 108355 {
		t.Errorf("statement %+v", s)
	}
	if s.From == nil || !s.From.Equal(time.Date(2026, 12, 1, 23, 0, 0, 0, time.UTC)) {
		t.Errorf("From %v", s.From)
	}
	if err := s.Balanced(); err != nil {
		t.Error(err)
	}
	lines, err := s.Lines()
	if err != nil {
		t.Fatal(err)
	}
	want := []lockapi.StatementLine{
		{Seq: 41, ReceivedAt: time.Date(2026, 12, 2, 9, 15, 30, 250000000, time.UTC), Reference: "payout-7",
			AccountID: "DE89370400440532013000", AmountMinor: 1395, Currency: "EUR",
			Beneficiary: "NL91ABNA0417164300", Result: lockapi.ResultAccepted, RailReference: ptr("BANK-TX-41")},
		{Seq: 42, ReceivedAt: time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC), Reference: "payout-8",
			AccountID: "DE89370400440532013000", AmountMinor: 400, Currency: "JPY",
			Beneficiary: "jp-0012345", Result: lockapi.ResultAccepted, RailReference: ptr("BANK-ENTRY-42")},
	}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("Lines:\n got %+v\nwant %+v", lines, want)
	}
}

func TestReadStatementsRefusesMalformed(t *testing.T) {
	s := readFixture(t, "bank-statement.xml")
	entry41 := s[strings.Index(s, "<Ntry>") : strings.Index(s, "</Ntry>")+len("</Ntry>")]
	tx41 := entry41[strings.Index(entry41, "<TxDtls>") : strings.Index(entry41, "</TxDtls>")+len("</TxDtls>")]
	for name, doc := range map[string]string{
		"bad amount":                 strings.Replace(s, `<Amt Ccy="EUR">13.95</Amt>`, `<Amt Ccy="EUR">13.9.5</Amt>`, 1),
		"amount past the exponent":   strings.Replace(s, `<Amt Ccy="EUR">13.95</Amt>`, `<Amt Ccy="EUR">13.951</Amt>`, 1),
		"currency without exponent":  strings.Replace(s, `<Amt Ccy="EUR">13.95</Amt>`, `<Amt Ccy="XAU">13.95</Amt>`, 1),
		"bad balance amount":         strings.Replace(s, `<Amt Ccy="EUR">1000.00</Amt>`, `<Amt Ccy="EUR">1,000.00</Amt>`, 1),
		"missing account":            strings.Replace(s, "<Id><IBAN>DE89370400440532013000</IBAN></Id>", "", 1),
		"empty account":              strings.Replace(s, "<Id><IBAN>DE89370400440532013000</IBAN></Id>", "<Id></Id>", 1),
		"no closing balance":         strings.Replace(s, "<Cd>CLBD</Cd>", "<Cd>ITBD</Cd>", 1),
		"no opening balance":         strings.Replace(s, "<Cd>PRCD</Cd>", "<Cd>ITBD</Cd>", 1),
		"balances in two currencies": strings.Replace(s, `<Amt Ccy="EUR">1000.00</Amt>`, `<Amt Ccy="USD">1000.00</Amt>`, 1),
		"CdtDbtInd neither":          strings.Replace(s, "<CdtDbtInd>DBIT</CdtDbtInd>", "<CdtDbtInd>DEBIT</CdtDbtInd>", 1),
		"booked debit no EndToEndId": strings.Replace(s, "<EndToEndId>payout-7</EndToEndId>", "", 1),
		"booked debit no reference":  strings.Replace(strings.Replace(s, "<AcctSvcrRef>BANK-TX-41</AcctSvcrRef>", "", 1), "<AcctSvcrRef>BANK-ENTRY-41</AcctSvcrRef>", "", 1),
		"booked debit no creditor":   strings.Replace(s, "<CdtrAcct><Id><IBAN>NL91ABNA0417164300</IBAN></Id></CdtrAcct>", "", 1),
		"booked debit no date":       strings.Replace(s, "<BookgDt><DtTm>2026-12-02T10:15:30.25+01:00</DtTm></BookgDt>", "", 1),
		"booked debit batch":         strings.Replace(s, tx41, tx41+tx41, 1),
		"booked debit reversal":      strings.Replace(s, "<CdtDbtInd>DBIT</CdtDbtInd>\n        <Sts>", "<CdtDbtInd>DBIT</CdtDbtInd>\n        <RvslInd>true</RvslInd>\n        <Sts>", 1),
		"bad booking date":           strings.Replace(s, "2026-12-02T10:15:30.25+01:00", "2026-12-02 10:15", 1),
		"bad period":                 strings.Replace(s, "<FrDtTm>2026-12-02T00:00:00+01:00", "<FrDtTm>2026-13-02T00:00:00+01:00", 1),
		"other namespace":            strings.Replace(s, "camt.053.001.08", "camt.053.001.02", 1),
		"camt.052":                   strings.ReplaceAll(strings.Replace(s, "camt.053.001.08", "camt.052.001.08", 1), "BkToCstmrStmt", "BkToCstmrAcctRpt"),
		"no statement":               s[:strings.Index(s, "<Stmt>")] + "</BkToCstmrStmt></Document>",
		"truncated":                  s[:len(s)-40],
		"NUL":                        strings.Replace(s, "payout-7", "payout\x00-7", 1),
	} {
		if doc == s {
			t.Fatalf("%s: the mutation changed nothing", name)
		}
		if stmts, err := isomsg.ReadStatements([]byte(doc)); err == nil {
			t.Errorf("%s: read as %+v", name, stmts)
		}
	}
}

func TestLinesRefuseANtryRefThatIsNoNumber(t *testing.T) {
	s := readFixture(t, "bank-statement.xml")
	for _, ref := range []string{"A-41", "-41", "+41", "4 1", "99999999999999999999"} {
		doc := strings.Replace(s, "<NtryRef>41</NtryRef>", "<NtryRef>"+ref+"</NtryRef>", 1)
		stmts, err := isomsg.ReadStatements([]byte(doc))
		if err != nil {
			t.Fatalf("NtryRef %q: ReadStatements: %v", ref, err)
		}
		if lines, err := stmts[0].Lines(); err == nil {
			t.Errorf("NtryRef %q: lines %+v", ref, lines)
		}
	}
	doc := strings.Replace(s, "<NtryRef>41</NtryRef>", "", 1)
	stmts, err := isomsg.ReadStatements([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if lines, err := stmts[0].Lines(); err == nil {
		t.Errorf("no NtryRef: lines %+v", lines)
	}
	// A reader that numbers lines itself reads them all the same.
	lines, err := stmts[0].UnnumberedLines()
	if err != nil || len(lines) != 2 || lines[0].Seq != 0 || lines[0].Reference != "payout-7" || lines[1].Reference != "payout-8" {
		t.Errorf("UnnumberedLines without NtryRef: %+v, %v", lines, err)
	}
}

func TestBalancedRefusesAStatementThatDoesNotAddUp(t *testing.T) {
	s := readFixture(t, "bank-statement.xml")
	for name, doc := range map[string]string{
		"closing off by a cent": strings.ReplaceAll(s, "1083.55", "1083.56"),
		"debit read as credit":  strings.Replace(s, "<CdtDbtInd>DBIT</CdtDbtInd>\n        <Sts><Cd>BOOK", "<CdtDbtInd>CRDT</CdtDbtInd>\n        <Sts><Cd>BOOK", 1),
		"entry in another currency": strings.Replace(s, `<Amt Ccy="EUR">2.50</Amt>
        <CdtDbtInd>`, `<Amt Ccy="USD">2.50</Amt>
        <CdtDbtInd>`, 1),
	} {
		if doc == s {
			t.Fatalf("%s: the mutation changed nothing", name)
		}
		stmts, err := isomsg.ReadStatements([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := stmts[0].Balanced(); err == nil {
			t.Errorf("%s: balanced", name)
		}
	}
	unbalanced := isomsg.Statement{ID: "s", Account: "a", Currency: "EUR", OpeningMinor: 100, ClosingMinor: 100,
		Entries: []isomsg.Entry{{Currency: "EUR", AmountMinor: 1, Debit: true, Status: "BOOK"}}}
	if err := unbalanced.Balanced(); err == nil {
		t.Error("a statement whose balances do not add up is balanced")
	}
}

func TestSchemasAreTheOfficialFiles(t *testing.T) {
	for name, want := range map[string]string{
		"pain.001.001.09.xsd": "de038b373e47b0077b1832ddd81f4b2f1eb25d35721f62da1e38b7f5a09fda24",
		"pain.002.001.10.xsd": "2f9f8d0e9891fa9f31ccf0576397afe501614384d688ae6e43ba694b3d24b0cf",
		"camt.053.001.08.xsd": "338e9cb0c9989b5181802a7b773eece070d6815fc9d6483ac0579117bc24ccba",
	} {
		b, err := os.ReadFile(filepath.Join("xsd", name))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); got != want {
			t.Errorf("%s: SHA-256 %s, want the official file's %s", name, got, want)
		}
		readme, err := os.ReadFile(filepath.Join("xsd", "README.md"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(readme), want) {
			t.Errorf("xsd/README.md does not give %s's SHA-256", name)
		}
	}
}

// prefixed writes doc as banks' XML libraries often do: every element with a
// namespace prefix instead of the default namespace.
func prefixed(doc []byte) []byte {
	s := strings.Replace(string(doc), `xmlns="`, `xmlns:ns2="`, 1)
	s = regexp.MustCompile(`<(/?)([A-Za-z])`).ReplaceAllString(s, "<${1}ns2:${2}")
	return []byte(s)
}

func TestReadsPrefixedDocuments(t *testing.T) {
	r := report("ACSC")
	r.AcctSvcrRef = "BANK-TX-41"
	rep, err := isomsg.WriteStatusReport(r)
	if err != nil {
		t.Fatal(err)
	}
	doc := prefixed(rep)
	testkit.ValidateISO20022(t, doc)
	back, err := isomsg.ReadStatusReport(doc)
	if err != nil || back.Status != "ACSC" || back.AcctSvcrRef != "BANK-TX-41" || back.EndToEndID != "payout-7" {
		t.Errorf("prefixed pain.002 read as %+v, %v", back, err)
	}
	camt := prefixed([]byte(readFixture(t, "bank-statement.xml")))
	testkit.ValidateISO20022(t, camt)
	stmts, err := isomsg.ReadStatements(camt)
	if err != nil {
		t.Fatal(err)
	}
	if lines, err := stmts[0].Lines(); err != nil || len(lines) != 2 {
		t.Errorf("prefixed camt.053: %+v, %v", lines, err)
	}
}
