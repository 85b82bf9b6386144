package iso20022_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/isomsg"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
	"lock.dev/rail"
	"lock.dev/rail/iso20022"
)

var pay = rail.Payment{SubmissionID: 42, PayoutID: "p-1001", AccountID: "acct-7", AmountMinor: 125000,
	Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}

// report is the bank's pain.002 on pay, validated against the official schema.
func report(t *testing.T, r isomsg.StatusReport) []byte {
	t.Helper()
	if r.OrgnlMsgID == "" {
		r.OrgnlMsgID = "submission-42"
	}
	if r.EndToEndID == "" {
		r.EndToEndID = pay.PayoutID
	}
	r.MsgID, r.CreatedAt = "BANK-RPT-1", time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	doc, err := isomsg.WriteStatusReport(r)
	if err != nil {
		t.Fatal(err)
	}
	testkit.ValidateISO20022(t, doc)
	return doc
}

func TestStatusClasses(t *testing.T) {
	a := iso20022.New()
	for _, c := range []struct {
		r       isomsg.StatusReport
		verdict rail.Verdict
		ref     string
		reason  string
		why     string
	}{
		{isomsg.StatusReport{Status: "ACSC", AcctSvcrRef: "BANK-TX-1"}, rail.Accepted, "BANK-TX-1", "", ""},
		{isomsg.StatusReport{Status: "ACCC", AcctSvcrRef: "BANK-TX-2"}, rail.Accepted, "BANK-TX-2", "", ""},
		{isomsg.StatusReport{Status: "ACSP", AcctSvcrRef: "BANK-TX-3"}, rail.Accepted, "BANK-TX-3", "", ""},
		{isomsg.StatusReport{Status: "ACWC", AcctSvcrRef: "BANK-TX-4"}, rail.Accepted, "BANK-TX-4", "", ""},
		{isomsg.StatusReport{Status: "ACSC"}, rail.NotUnderstood, "", "", "without AcctSvcrRef"},
		{isomsg.StatusReport{Status: "ACCP"}, rail.Pending, "", "", "ACCP"},
		{isomsg.StatusReport{Status: "ACCP", AcctSvcrRef: "BANK-TX-5"}, rail.Pending, "", "", "ACCP"},
		{isomsg.StatusReport{Status: "ACTC"}, rail.Pending, "", "", "ACTC"},
		{isomsg.StatusReport{Status: "RCVD"}, rail.Pending, "", "", "RCVD"},
		{isomsg.StatusReport{Status: "PDNG", AcctSvcrRef: "BANK-TX-6"}, rail.Pending, "", "", "PDNG"},
		{isomsg.StatusReport{Status: "RJCT", ReasonCode: "AC04", AdditionalInfo: "Closed account number"}, rail.Declined, "", "AC04", ""},
		{isomsg.StatusReport{Status: "RJCT", AdditionalInfo: "no code"}, rail.Declined, "", "", ""},
		{isomsg.StatusReport{Status: "RJCT"}, rail.Declined, "", "", ""},
		{isomsg.StatusReport{Status: "CANC", AcctSvcrRef: "BANK-TX-7"}, rail.NotUnderstood, "", "", "CANC"},
		{isomsg.StatusReport{Status: "ZZZZ", AcctSvcrRef: "BANK-TX-8"}, rail.NotUnderstood, "", "", "ZZZZ"},
		{isomsg.StatusReport{Status: "acsc", AcctSvcrRef: "BANK-TX-9"}, rail.NotUnderstood, "", "", "acsc"},
		{isomsg.StatusReport{Status: "ACSC", AcctSvcrRef: "BANK-TX-1", EndToEndID: "p-1002"}, rail.NotUnderstood, "", "", "EndToEndId"},
		{isomsg.StatusReport{Status: "RJCT", ReasonCode: "AC04", EndToEndID: "p-1002"}, rail.NotUnderstood, "", "", "EndToEndId"},
		{isomsg.StatusReport{Status: "ACSC", AcctSvcrRef: "BANK-TX-1", OrgnlMsgID: "submission-43"}, rail.NotUnderstood, "", "", "message"},
		{isomsg.StatusReport{Status: "ACSC", AcctSvcrRef: "BANK\u0085TX"}, rail.NotUnderstood, "", "", "control"},
		{isomsg.StatusReport{Status: "ACSC", AcctSvcrRef: "BANK\tTX"}, rail.NotUnderstood, "", "", "control"},
		{isomsg.StatusReport{Status: "RJCT", ReasonCode: "A\u0085"}, rail.NotUnderstood, "", "", "control"},
	} {
		doc := report(t, c.r)
		ans := a.ReadAnswer(pay, rail.Reply{Status: http.StatusOK, ContentType: "application/xml", Body: doc})
		if ans.Verdict != c.verdict || ans.RailReference != c.ref || ans.DeclineReason != c.reason || !strings.Contains(ans.Why, c.why) {
			t.Errorf("%+v: %+v, want %s %q %q, why with %q", c.r, ans, c.verdict, c.ref, c.reason, c.why)
		}
	}
}

// Only a 200 carries an answer: an accept or a decline under any other status
// is not understood, whatever its body says.
func TestOnlyA200Answers(t *testing.T) {
	a := iso20022.New()
	for _, r := range []isomsg.StatusReport{{Status: "ACSC", AcctSvcrRef: "BANK-TX-1"}, {Status: "RJCT", ReasonCode: "AC04"}} {
		doc := report(t, r)
		for _, st := range []int{201, 202, 400, 404, 422, 500, 502, 503} {
			if ans := a.ReadAnswer(pay, rail.Reply{Status: st, ContentType: "application/xml", Body: doc}); ans.Verdict != rail.NotUnderstood {
				t.Errorf("%s under %d: %+v", r.Status, st, ans)
			}
		}
	}
}

// A bank's richer report, validated against the schema, is read by its
// transaction's status and first reason.
func TestReadsABanksRejection(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("testdata", "pain002-bank-rjct.xml"))
	if err != nil {
		t.Fatal(err)
	}
	testkit.ValidateISO20022(t, doc)
	ans := iso20022.New().ReadAnswer(pay, rail.Reply{Status: http.StatusOK, ContentType: "application/xml", Body: doc})
	if ans.Verdict != rail.Declined || ans.DeclineReason != "AC04" {
		t.Errorf("%+v, want declined AC04", ans)
	}
	other := pay
	other.PayoutID = "p-1002"
	if ans := iso20022.New().ReadAnswer(other, rail.Reply{Status: http.StatusOK, Body: doc}); ans.Verdict != rail.NotUnderstood {
		t.Errorf("for another payout: %+v", ans)
	}
}

func TestRefuse(t *testing.T) {
	a := iso20022.New()
	ok := pay
	ok.PayoutID, ok.AccountID, ok.Beneficiary = strings.Repeat("p", 35), strings.Repeat("a", 34), strings.Repeat("é", 34)
	if errs := a.Refuse(ok); errs != nil {
		t.Errorf("a payment at every limit is refused: %v", errs)
	}
	for _, c := range []struct {
		mutate func(*rail.Payment)
		fields []string
	}{
		{func(p *rail.Payment) { p.PayoutID = strings.Repeat("p", 36) }, []string{"payoutId"}},
		{func(p *rail.Payment) { p.AccountID = strings.Repeat("a", 35) }, []string{"accountId"}},
		{func(p *rail.Payment) { p.Beneficiary = strings.Repeat("b", 35) }, []string{"beneficiary"}},
		{func(p *rail.Payment) { p.Currency = "XAU" }, []string{"currency"}},
		{func(p *rail.Payment) { p.Currency = "ZZZ" }, []string{"currency"}},
		{func(p *rail.Payment) {
			p.PayoutID, p.Beneficiary, p.Currency = strings.Repeat("p", 64), strings.Repeat("b", 40), "XXX"
		}, []string{"payoutId", "beneficiary", "currency"}},
	} {
		p := pay
		c.mutate(&p)
		errs := a.Refuse(p)
		var got []string
		for _, e := range errs {
			got = append(got, e.Field)
			if e.Problem == "" {
				t.Errorf("%+v: field %s without a problem", p, e.Field)
			}
		}
		if strings.Join(got, ",") != strings.Join(c.fields, ",") {
			t.Errorf("%+v refused for %v, want %v", p, got, c.fields)
		}
		if _, err := a.PaymentRequest(p); err == nil {
			t.Errorf("%+v: a request was built for a refused payment", p)
		}
	}
}

func TestPaymentRequest(t *testing.T) {
	at := time.Date(2026, 12, 3, 21, 30, 0, 0, time.UTC)
	a := iso20022.NewWithClock(func() time.Time { return at })
	for _, p := range []rail.Payment{pay,
		{SubmissionID: 9223372036854775807, PayoutID: strings.Repeat("p", 35), AccountID: "DE89370400440532013000",
			AmountMinor: 1395, Currency: "BHD", Beneficiary: strings.Repeat("b", 34)},
		{SubmissionID: 7, PayoutID: "p-7", AccountID: "acct-7", AmountMinor: 1395, Currency: "JPY", Beneficiary: "ben-7"},
	} {
		req, err := a.PaymentRequest(p)
		if err != nil {
			t.Fatal(err)
		}
		if req.Method != http.MethodPost || req.Path != "/iso20022/pain.001" || req.ContentType != "application/xml" {
			t.Errorf("request %s %s %s", req.Method, req.Path, req.ContentType)
		}
		testkit.ValidateISO20022(t, req.Body)
		in, err := isomsg.ReadInitiation(req.Body)
		if err != nil {
			t.Fatal(err)
		}
		id := "submission-" + strconv.FormatInt(p.SubmissionID, 10)
		want := isomsg.Initiation{MsgID: id, PmtInfID: id, EndToEndID: p.PayoutID, DebtorAccount: p.AccountID,
			CreditorAccount: p.Beneficiary, AmountMinor: p.AmountMinor, Currency: p.Currency, CreatedAt: at}
		if !in.CreatedAt.Equal(at) {
			t.Errorf("CreatedAt %v", in.CreatedAt)
		}
		in.CreatedAt = at
		if in != want {
			t.Errorf("pain.001 %+v, want %+v", in, want)
		}
	}
	if h := a.HealthRequest(); h.Method != http.MethodGet || h.Path != "/iso20022/health" || h.Body != nil {
		t.Errorf("health request %+v", h)
	}
	if s := a.StatementRequest(7, 100); s.Method != http.MethodGet || s.Path != "/iso20022/camt.053?after=7&limit=100" {
		t.Errorf("statement request %+v", s)
	}
	if a.Protocol() != "iso20022" {
		t.Errorf("protocol %q", a.Protocol())
	}
}

// A camt.053 groups entries by account; the page is read in the rail's
// numbering, by NtryRef, and only from a 200.
func TestReadStatementOrdersByNtryRef(t *testing.T) {
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	entry := func(seq, payout string) isomsg.Entry {
		return isomsg.Entry{Ref: seq, AcctSvcrRef: "R-" + seq, EndToEndID: payout, CreditorAccount: "ben-1", Currency: "EUR",
			AmountMinor: 100, Debit: true, Status: isomsg.Booked, BookedAt: at}
	}
	doc, err := isomsg.WriteStatements("CAMT-1", at, []isomsg.Statement{
		{ID: "S-a", Account: "acct-a", Currency: "EUR", ClosingMinor: -200, Entries: []isomsg.Entry{entry("12", "p-12"), entry("14", "p-14")}},
		{ID: "S-b", Account: "acct-b", Currency: "EUR", ClosingMinor: -100, Entries: []isomsg.Entry{entry("13", "p-13")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.ValidateISO20022(t, doc)
	a := iso20022.New()
	lines, err := a.ReadStatement(rail.Reply{Status: http.StatusOK, ContentType: "application/xml", Body: doc}, 11, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range lines {
		got = append(got, l.Reference+"@"+l.AccountID)
		if l.Result != lockapi.ResultAccepted || l.RailReference == nil || *l.RailReference != "R-"+strconv.FormatInt(l.Seq, 10) {
			t.Errorf("line %+v", l)
		}
	}
	if strings.Join(got, " ") != "p-12@acct-a p-13@acct-b p-14@acct-a" {
		t.Errorf("lines %v", got)
	}
	if _, err := a.ReadStatement(rail.Reply{Status: http.StatusNotFound, Body: doc}, 11, 10); err == nil {
		t.Error("a page under 404 was read")
	}
}
