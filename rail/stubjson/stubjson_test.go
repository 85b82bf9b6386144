package stubjson_test

import (
	"strings"
	"testing"

	"lock.dev/rail"
	"lock.dev/rail/internal/stubharness"
	"lock.dev/rail/railtest"
	"lock.dev/rail/stubjson"
)

// The stub adapter passes the conformance suite against rail-stub's replies.
func TestConformance(t *testing.T) {
	railtest.Run(t, stubjson.New(), stubharness.Harness{})
}

// The wire of rail-stub's protocol, byte for byte: the request rail-proxy has
// always sent, and how each kind of reply is read.
func TestWire(t *testing.T) {
	a := stubjson.New()
	p := rail.Payment{SubmissionID: 9, PayoutID: "p-1001", AccountID: "acct-7", AmountMinor: 125000, Currency: "EUR", Beneficiary: "NL91 ABNA <&> 0417"}
	req, err := a.PaymentRequest(p)
	want := `{"reference":"p-1001","accountId":"acct-7","amountMinor":125000,"currency":"EUR","beneficiary":"NL91 ABNA \u003c\u0026\u003e 0417"}`
	if err != nil || req.Method != "POST" || req.Path != "/rail/v1/payments" || req.ContentType != "application/json" ||
		req.Accept != "application/json" || string(req.Body) != want {
		t.Fatalf("payment request %+v %q (%v), want POST /rail/v1/payments JSON %s", req, req.Body, err, want)
	}
	if h := a.HealthRequest(); h.Method != "GET" || h.Path != "/rail/v1/health" || h.Accept != "" || h.Body != nil {
		t.Fatalf("health request %+v", h)
	}
	if s := a.StatementRequest(7, 100); s.Method != "GET" || s.Path != "/rail/v1/calls?after=7&limit=100" || s.Accept != "application/json" {
		t.Fatalf("statement request %+v", s)
	}
	if a.Protocol() != "stub" || a.Refuse(rail.Payment{PayoutID: strings.Repeat("p", 64)}) != nil {
		t.Fatalf("protocol %q, or a payment refused", a.Protocol())
	}
	for _, c := range []struct {
		status      int
		body        string
		verdict     rail.Verdict
		ref, reason string
	}{
		{200, `{"status":"ACCEPTED","railReference":"RS-1"}`, rail.Accepted, "RS-1", ""},
		{422, `{"status":"DECLINED","reason":"insufficient funds"}`, rail.Declined, "", "insufficient funds"},
		{422, `{"status":"DECLINED"}`, rail.Declined, "", ""},
		{422, `{"status":"DECLINED","reason":null}`, rail.Declined, "", ""},
		{422, `{"status":"DECLINED","reason":""}`, rail.Declined, "", ""},
		{200, `not json`, rail.NotUnderstood, "", ""},
		{200, `{"status":"ACCEPTED"}`, rail.NotUnderstood, "", ""},
		{200, `{"status":"DECLINED","reason":"x"}`, rail.NotUnderstood, "", ""},
		{422, `{"status":"ACCEPTED","railReference":"RS-1"}`, rail.NotUnderstood, "", ""},
		{500, `{"status":"ACCEPTED","railReference":"RS-1"}`, rail.NotUnderstood, "", ""},
		{422, `{"status":"DECLINED","reason":7}`, rail.NotUnderstood, "", ""},
		{200, `{"status":"ACCEPTED","railReference":"RS-\u0085"}`, rail.NotUnderstood, "", ""},
		{200, `{"status":"ACCEPTED","railReference":"` + strings.Repeat("R", 36) + `"}`, rail.NotUnderstood, "", ""},
		{422, `{"status":"DECLINED","reason":"` + strings.Repeat("r", 141) + `"}`, rail.NotUnderstood, "", ""},
	} {
		ans := a.ReadAnswer(p, rail.Reply{Status: c.status, ContentType: "application/json", Body: []byte(c.body)})
		if ans.Verdict != c.verdict || ans.RailReference != c.ref || ans.DeclineReason != c.reason ||
			(ans.Verdict == rail.NotUnderstood && ans.Why == "") {
			t.Errorf("%d %s: %+v, want %s %q %q", c.status, c.body, ans, c.verdict, c.ref, c.reason)
		}
	}
}
