package executor

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockapi"
)

// scriptedProxy plays rail-proxy: POST answers with submit; GET answers with the
// audit trail trail (or fails when trailFails).
type scriptedProxy struct {
	submit     http.HandlerFunc
	trail      []lockapi.Submission
	trailFails bool
}

func (s scriptedProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		if s.trailFails {
			lockapi.WriteProblem(w, lockapi.NewProblem(503, lockapi.CodeUnavailable, "paydb is out of reach", nil))
			return
		}
		lockapi.WriteJSON(w, 200, lockapi.SubmissionList{Submissions: s.trail})
		return
	}
	s.submit(w, r)
}

// hangUp reads the request and closes the connection: no answer.
func hangUp(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, not an orderly close
		}
		conn.Close()
	}
}

// row is an audit-trail row of payout p-1 that presented p-1's own fields
// (testPayout), as rail-proxy reports them.
func row(id, token int64, outcome string, ref, reason string) lockapi.Submission {
	s := lockapi.Submission{SubmissionID: id, PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 100, Currency: "EUR",
		Beneficiary: "NL00BANK0123456789", PresentedToken: token, OwnerID: "someone"}
	if outcome != "" {
		s.Outcome = &outcome
	}
	if ref != "" {
		s.RailReference = &ref
	}
	if reason != "" {
		s.DeclineReason = &reason
	}
	return s
}

func discardLogger() *slog.Logger { return slog.New(slog.NewJSONHandler(io.Discard, nil)) }

func newTestExecutor(t *testing.T, proxyURL string) *executor {
	t.Helper()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.RailProxyURL = proxyURL
	cfg.LogOutput = io.Discard
	// Plaintext to the test's own server: about answers, not identity
	// (docs/contracts/workload-identity.md).
	e, err := newExecutor(cfg, discardLogger(), m, peerTLS{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.close)
	return e
}

// Step 4 of docs/contracts/executor.md: every answer of rail-proxy, and every audit trail the
// no-answer path can find, mapped to what is posted and how it is counted.
func TestVerdictForEveryAnswer(t *testing.T) {
	t.Parallel()
	const token = 7
	dupe := func(first any, ref any) http.HandlerFunc {
		return problemAnswer(409, lockapi.CodeDuplicateSubmission, dupeMembers(first, ref, nil))
	}
	accepted := func(w http.ResponseWriter, _ *http.Request) {
		lockapi.WriteJSON(w, 200, lockapi.SubmissionAccepted{SubmissionID: 1, PayoutID: "p-1", AccountID: "acct-1", PresentedToken: token, Outcome: "ACKED", RailReference: "RS-1"})
	}
	cases := []struct {
		name   string
		proxy  scriptedProxy
		result string
		post   string // "" = nothing posted
		ref    string
		reason string
	}{
		{"200 → PAID", scriptedProxy{submit: accepted}, resultPaid, "PAID", "RS-1", ""},
		{"RAIL_REJECTED → DECLINED", scriptedProxy{submit: problemAnswer(422, lockapi.CodeRailRejected, map[string]any{"submissionId": 1, "declineReason": "closed account"})},
			resultDeclined, "DECLINED", "", "closed account"},
		{"RAIL_AMBIGUOUS → AMBIGUOUS", scriptedProxy{submit: problemAnswer(409, lockapi.CodeRailAmbiguous, map[string]any{"submissionId": 1})},
			resultAmbiguous, "AMBIGUOUS", "", ""},
		{"FENCED_OUT → nothing", scriptedProxy{submit: problemAnswer(409, lockapi.CodeFencedOut, map[string]any{"presentedToken": token, "highestToken": 8, "submissionId": 1})},
			resultFenced, "", "", ""},
		{"RAIL_UNAVAILABLE → nothing", scriptedProxy{submit: problemAnswer(503, lockapi.CodeRailUnavailable, map[string]any{"stage": "dial", "submissionId": 1})},
			resultUnavailable, "", "", ""},
		{"INVALID_REQUEST → nothing", scriptedProxy{submit: problemAnswer(400, lockapi.CodeInvalidRequest, map[string]any{"errors": []any{}})},
			resultUnavailable, "", "", ""},
		{"DUPLICATE first ACKED → PAID with the first reference", scriptedProxy{submit: dupe("ACKED", "RS-first")},
			resultDuplicate, "PAID", "RS-first", ""},
		{"DUPLICATE first ACKED without reference → reference from the trail", scriptedProxy{submit: dupe("ACKED", nil),
			trail: []lockapi.Submission{row(2, 5, "ACKED", "RS-trail", ""), row(9, token, "DUPLICATE", "", "")}},
			resultDuplicate, "PAID", "RS-trail", ""},
		{"DUPLICATE first ACKED, reference nowhere → nothing", scriptedProxy{submit: dupe("ACKED", nil)},
			resultDuplicate, "", "", ""},
		{"DUPLICATE first REJECTED → DECLINED with the trail's reason", scriptedProxy{submit: dupe("REJECTED", nil),
			trail: []lockapi.Submission{row(2, 5, "REJECTED", "", "limit exceeded"), row(9, token, "DUPLICATE", "", "")}},
			resultDuplicate, "DECLINED", "", "limit exceeded"},
		// DECLINED is final: a reason not read now could never be added.
		{"DUPLICATE first REJECTED, trail unreadable → nothing (reconcile adopts)", scriptedProxy{submit: dupe("REJECTED", nil), trailFails: true},
			resultDuplicate, "", "", ""},
		{"DUPLICATE first TIMEOUT → AMBIGUOUS", scriptedProxy{submit: dupe("TIMEOUT", nil)},
			resultDuplicate, "AMBIGUOUS", "", ""},
		{"DUPLICATE first null → nothing", scriptedProxy{submit: dupe(nil, nil)},
			resultDuplicate, "", "", ""},
		{"no answer, trail ACKED → PAID", scriptedProxy{submit: hangUp,
			trail: []lockapi.Submission{row(1, token, "ACKED", "RS-9", "")}}, resultPaid, "PAID", "RS-9", ""},
		{"no answer, trail REJECTED → DECLINED", scriptedProxy{submit: hangUp,
			trail: []lockapi.Submission{row(1, token, "REJECTED", "", "no such beneficiary")}}, resultDeclined, "DECLINED", "", "no such beneficiary"},
		{"no answer, trail TIMEOUT → AMBIGUOUS", scriptedProxy{submit: hangUp,
			trail: []lockapi.Submission{row(1, token, "TIMEOUT", "", "")}}, resultAmbiguous, "AMBIGUOUS", "", ""},
		{"no answer, trail unresolved → nothing", scriptedProxy{submit: hangUp,
			trail: []lockapi.Submission{row(1, token, "", "", "")}}, resultUnavailable, "", "", ""},
		{"no answer, another token's attempt ACKED → PAID", scriptedProxy{submit: hangUp,
			trail: []lockapi.Submission{row(1, 5, "ACKED", "RS-5", ""), row(2, token, "DUPLICATE", "", "")}}, resultPaid, "PAID", "RS-5", ""},
		{"no answer, our attempt FENCED → nothing, fenced", scriptedProxy{submit: hangUp,
			trail: []lockapi.Submission{row(1, token, "FENCED", "", "")}}, resultFenced, "", "", ""},
		{"no answer, only UNSENT on record → nothing", scriptedProxy{submit: hangUp,
			trail: []lockapi.Submission{row(1, token, "UNSENT", "", "")}}, resultUnavailable, "", "", ""},
		{"no answer, nothing on record → nothing", scriptedProxy{submit: hangUp}, resultUnavailable, "", "", ""},
		{"no answer, trail unreadable → nothing", scriptedProxy{submit: hangUp, trailFails: true}, resultUnavailable, "", "", ""},
		{"500 INTERNAL is no answer, trail ACKED → PAID", scriptedProxy{submit: problemAnswer(500, lockapi.CodeInternal, nil),
			trail: []lockapi.Submission{row(1, token, "ACKED", "RS-3", "")}}, resultPaid, "PAID", "RS-3", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := verdictAgainst(t, tc.proxy, token)
			if v.result != tc.result {
				t.Errorf("counted as %q, want %q (%s)", v.result, tc.result, v.why)
			}
			if got := postOutcome(v.post); tc.post == "" && got != "none" || tc.post != "" && got != tc.post {
				t.Fatalf("posts %s, want %q (%s)", got, tc.post, v.why)
			}
			if v.post == nil {
				return
			}
			if deref(v.post.RailReference) != tc.ref || deref(v.post.DeclineReason) != tc.reason {
				t.Errorf("posts reference %q reason %q, want %q %q", deref(v.post.RailReference), deref(v.post.DeclineReason), tc.ref, tc.reason)
			}
			if v.post.Outcome != lockapi.StatusPaid && v.post.RailReference != nil {
				t.Errorf("%s posted with a rail reference", v.post.Outcome)
			}
		})
	}
}

// The answer to the resend after a stale connection (same token,
// fresh connection). FENCED_OUT may be the doing of our own first copy, which
// reached the proxy after all: the audit trail tells which.
func TestVerdictForResentAnswer(t *testing.T) {
	t.Parallel()
	const token = 7
	fencedBy := func(highest int64) http.HandlerFunc {
		return problemAnswer(409, lockapi.CodeFencedOut, map[string]any{"presentedToken": token, "highestToken": highest, "submissionId": 2})
	}
	cases := []struct {
		name   string
		proxy  scriptedProxy
		result string
		post   string
		ref    string
	}{
		{"FENCED_OUT, our first copy ACKED → PAID", scriptedProxy{submit: fencedBy(token),
			trail: []lockapi.Submission{row(1, token, "ACKED", "RS-first-copy", ""), row(2, token, "FENCED", "", "")}},
			resultPaid, "PAID", "RS-first-copy"},
		{"FENCED_OUT, our first copy unresolved → nothing", scriptedProxy{submit: fencedBy(token),
			trail: []lockapi.Submission{row(1, token, "", "", ""), row(2, token, "FENCED", "", "")}},
			resultUnavailable, "", ""},
		{"FENCED_OUT by a newer holder, both copies fenced → nothing, fenced", scriptedProxy{submit: fencedBy(9),
			trail: []lockapi.Submission{row(1, token, "FENCED", "", ""), row(2, token, "FENCED", "", "")}},
			resultFenced, "", ""},
		{"FENCED_OUT, trail unreadable → nothing", scriptedProxy{submit: fencedBy(token), trailFails: true},
			resultUnavailable, "", ""},
		{"accepted → PAID", scriptedProxy{submit: func(w http.ResponseWriter, _ *http.Request) {
			lockapi.WriteJSON(w, 200, lockapi.SubmissionAccepted{SubmissionID: 1, PayoutID: "p-1", AccountID: "acct-1",
				PresentedToken: token, Outcome: "ACKED", RailReference: "RS-1"})
		}}, resultPaid, "PAID", "RS-1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := verdictOn(t, tc.proxy, token, true)
			if v.result != tc.result {
				t.Errorf("counted as %q, want %q (%s)", v.result, tc.result, v.why)
			}
			if got := postOutcome(v.post); tc.post == "" && got != "none" || tc.post != "" && got != tc.post {
				t.Fatalf("posts %s, want %q (%s)", got, tc.post, v.why)
			}
			if v.post != nil && deref(v.post.RailReference) != tc.ref {
				t.Errorf("posts reference %q, want %q", deref(v.post.RailReference), tc.ref)
			}
		})
	}
}

// testPayout is the payout verdictOn submits.
var testPayout = lockapi.Payout{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 100, Currency: "EUR", Beneficiary: "NL00BANK0123456789"}

// dupeMembers are the members of a DUPLICATE_SUBMISSION answer for testPayout
// whose first attempt presented testPayout's own fields, with change applied
// (nil: none; a member set to nil is left out, as an older rail-proxy does).
func dupeMembers(first, ref any, change map[string]any) map[string]any {
	m := map[string]any{"submissionId": 9, "firstSubmissionId": 2, "firstSubmittedAt": time.Now().UTC(),
		"firstOutcome": first, "firstRailReference": ref,
		"firstAccountId": testPayout.AccountID, "firstAmountMinor": testPayout.AmountMinor,
		"firstCurrency": testPayout.Currency, "firstBeneficiary": testPayout.Beneficiary}
	for k, v := range change {
		if v == nil {
			delete(m, k)
			continue
		}
		m[k] = v
	}
	return m
}

// verdictAgainst submits payout p-1 with token through an executor whose
// rail-proxy is proxy, and returns the executor's verdict on the answer.
func verdictAgainst(t *testing.T, proxy http.Handler, token int64) verdict {
	t.Helper()
	return verdictOn(t, proxy, token, false)
}

// verdictOn is verdictAgainst for a first submission or, with resend, for the
// reconcile pass's resend (whose answer must be marked as one).
func verdictOn(t *testing.T, proxy http.Handler, token int64, resend bool) verdict {
	t.Helper()
	srv := httptest.NewServer(proxy)
	defer srv.Close()
	e := newTestExecutor(t, srv.URL)
	p := testPayout
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := lockapi.SubmissionRequest{PayoutID: p.PayoutID, AccountID: p.AccountID,
		AmountMinor: p.AmountMinor, Currency: p.Currency, Beneficiary: p.Beneficiary}
	send := e.proxy.submit
	if resend {
		send = e.proxy.resubmit
	}
	a := send(ctx, req, token, "exec-a")
	if resend && !a.resent {
		t.Fatal("the resend's answer is not marked as such")
	}
	return e.verdict(ctx, p, token, a)
}
