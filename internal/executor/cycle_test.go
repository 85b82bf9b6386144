package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/payment"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/stack"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// perPayoutProxy plays rail-proxy with one scripted answer (and audit trail) per
// payout, and records every submission it receives.
type perPayoutProxy struct {
	answers map[string]http.HandlerFunc
	trails  map[string][]lockapi.Submission

	mu     sync.Mutex
	tokens map[string][]string // payoutId → X-Fencing-Token of each submission
}

func (s *perPayoutProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		lockapi.WriteJSON(w, 200, lockapi.SubmissionList{Submissions: append([]lockapi.Submission{}, s.trails[r.URL.Query().Get("payoutId")]...)})
		return
	}
	b, _ := io.ReadAll(r.Body)
	var sub lockapi.SubmissionRequest
	_ = json.Unmarshal(b, &sub)
	s.mu.Lock()
	s.tokens[sub.PayoutID] = append(s.tokens[sub.PayoutID], r.Header.Get(lockapi.HeaderFencingToken))
	s.mu.Unlock()
	r.Body = io.NopCloser(strings.NewReader(string(b)))
	h, ok := s.answers[sub.PayoutID]
	if !ok {
		h = acceptAs("RS-" + sub.PayoutID)
	}
	h(w, r)
}

func (s *perPayoutProxy) submissions(id string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.tokens[id]...)
}

// noAuth runs the system and the executor plaintext, without identities
// (UNSAFE_NO_AUTH): for the tests of this package whose rail-proxy is a
// scripted plaintext test server, or that look at a stop or the executor's own
// endpoints — about those, not identity (docs/contracts/workload-identity.md).
const noAuth = true

// scriptedRail is the system's settings for a test whose rail-proxy is
// scripted: paydb's audit trail records none of its answers, so
// payment-resource's books check (docs/contracts/books.md) would refuse every
// post. It is off: these tests are about what the executor makes of the
// answers, not about the books.
var scriptedRail = map[string]map[string]string{"payment-resource": {"PAYMENT_BOOKS_CHECK": "false"}}

func acceptAs(ref string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var sub lockapi.SubmissionRequest
		_ = json.NewDecoder(r.Body).Decode(&sub)
		lockapi.WriteJSON(w, 200, lockapi.SubmissionAccepted{SubmissionID: 1, PayoutID: sub.PayoutID, AccountID: sub.AccountID,
			Outcome: lockapi.OutcomeAcked, RailReference: ref})
	}
}

// A whole cycle against real lock-server and payment-resource, with rail-proxy's
// answers scripted: what each answer leaves in paydb (posted, or left CLAIMED),
// that a payout left CLAIMED is not submitted again by the cycle, that posts carry
// the token the payout was claimed and submitted with, and how each is counted.
func TestCycleOutcomesInPaydb(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := stack.Start(ctx, stack.Options{UnsafeNoAuth: noAuth, PaydbURL: pgtest.PaydbURL(t), LockdbURL: pgtest.LockdbURL(t), Env: scriptedRail})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })

	// The first attempt of each duplicate presented its payout as created below.
	dupe := func(first, ref any) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			var sub lockapi.SubmissionRequest
			_ = json.NewDecoder(r.Body).Decode(&sub)
			problemAnswer(409, lockapi.CodeDuplicateSubmission, map[string]any{"submissionId": 9, "firstSubmissionId": 2,
				"firstSubmittedAt": time.Now().UTC(), "firstOutcome": first, "firstRailReference": ref,
				"firstAccountId": "acct-" + sub.PayoutID, "firstAmountMinor": 500, "firstCurrency": "EUR",
				"firstBeneficiary": "DE89370400440532013000"})(w, r)
		}
	}
	acked := lockapi.OutcomeAcked
	ref := "RS-on-record"
	proxy := &perPayoutProxy{
		answers: map[string]http.HandlerFunc{
			"c-paid":         acceptAs("RS-paid"),
			"c-declined":     problemAnswer(422, lockapi.CodeRailRejected, map[string]any{"submissionId": 1, "declineReason": "account closed"}),
			"c-ambiguous":    problemAnswer(409, lockapi.CodeRailAmbiguous, map[string]any{"submissionId": 1}),
			"c-fenced":       problemAnswer(409, lockapi.CodeFencedOut, map[string]any{"submissionId": 1, "presentedToken": 1, "highestToken": 99}),
			"c-unavailable":  problemAnswer(503, lockapi.CodeRailUnavailable, map[string]any{"stage": "intent_commit"}),
			"c-dup-null":     dupe(nil, nil),
			"c-dup-acked":    dupe("ACKED", "RS-first"),
			"c-silent":       hangUp,
			"c-silent-acked": hangUp,
		},
		trails: map[string][]lockapi.Submission{
			"c-silent-acked": {{SubmissionID: 4, PayoutID: "c-silent-acked", AccountID: "acct-c-silent-acked", AmountMinor: 500,
				Currency: "EUR", Beneficiary: "DE89370400440532013000", Outcome: &acked, RailReference: &ref}},
		},
		tokens: map[string][]string{},
	}
	// Every submission on a connection of its own: a hang-up on a reused one
	// would be sent again (TestSubmissionResentOnceAfterIdleConnectionClosed),
	// and this test is about the answers, each given once.
	fake := httptest.NewUnstartedServer(proxy)
	fake.Config.SetKeepAlivesEnabled(false)
	fake.Start()
	defer fake.Close()

	pc := payment.NewClient(st.PaymentURL)
	create := func(id string) {
		t.Helper()
		if _, err := pc.Create(ctx, lockapi.SubmissionRequest{PayoutID: id, AccountID: "acct-" + id, AmountMinor: 500,
			Currency: "EUR", Beneficiary: "DE89370400440532013000"}); err != nil {
			t.Fatal(err)
		}
	}
	for id := range proxy.answers {
		create(id)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = st.LockServerURL, st.PaymentURL, fake.URL
	cfg.OwnerID = "cycle-exec"
	cfg.Workers = 3
	cfg.LeaseTTL = 2 * time.Second
	cfg.PollInterval = 20 * time.Millisecond
	cfg.ReconcileInterval = -1 // the cycle alone
	cfg.Listener, cfg.LogOutput = ln, io.Discard
	cfg.Identity.UnsafeNoAuth = noAuth
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(runCtx, cfg) }()
	metricsURL := "http://" + ln.Addr().String()
	count := func(result string) float64 {
		t.Helper()
		v, err := testkit.ReadMetric(context.Background(), metricsURL, `executor_payout_total{result="`+result+`"}`)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	testkit.Eventually(t, 30*time.Second, "every scripted payout to be answered", func() bool {
		n := 0.0
		for _, r := range []string{"paid", "declined", "ambiguous", "fenced", "duplicate", "unavailable"} {
			n += count(r)
		}
		return n == float64(len(proxy.answers))
	})
	// One more payout: once it is paid the workers have looked at the PENDING
	// payouts again since the others were answered.
	create("c-last")
	testkit.Eventually(t, 30*time.Second, "the last payout", func() bool {
		p, err := pc.Get(ctx, "c-last")
		return err == nil && p.Status == lockapi.StatusPaid
	})
	want := map[string]float64{"paid": 3, "declined": 1, "ambiguous": 1, "fenced": 1, "duplicate": 2, "unavailable": 2, "skipped": 0}
	for r, n := range want {
		if got := count(r); got != n {
			t.Errorf(`executor_payout_total{result=%q} = %v, want %v`, r, got, n)
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v after a stop, want nil", err)
	}

	type expect struct {
		status, ref, reason string
	}
	expects := map[string]expect{
		"c-paid":         {lockapi.StatusPaid, "RS-paid", ""},
		"c-declined":     {lockapi.StatusDeclined, "", "account closed"},
		"c-ambiguous":    {lockapi.StatusAmbiguous, "", ""},
		"c-fenced":       {lockapi.StatusClaimed, "", ""},
		"c-unavailable":  {lockapi.StatusClaimed, "", ""},
		"c-dup-null":     {lockapi.StatusClaimed, "", ""},
		"c-dup-acked":    {lockapi.StatusPaid, "RS-first", ""},
		"c-silent":       {lockapi.StatusClaimed, "", ""},
		"c-silent-acked": {lockapi.StatusPaid, "RS-on-record", ""},
		"c-last":         {lockapi.StatusPaid, "RS-c-last", ""},
	}
	for id, w := range expects {
		p, err := pc.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if p.Status != w.status || deref(p.RailReference) != w.ref || deref(p.DeclineReason) != w.reason {
			t.Errorf("%s: %s ref %q reason %q, want %s ref %q reason %q", id, p.Status, deref(p.RailReference), deref(p.DeclineReason), w.status, w.ref, w.reason)
		}
		subs := proxy.submissions(id)
		if len(subs) != 1 {
			t.Errorf("%s was submitted %d times (%v), want once", id, len(subs), subs)
			continue
		}
		if fmt.Sprint(p.FenceToken) != subs[0] || deref(p.ClaimedBy) != "cycle-exec" {
			t.Errorf("%s: claimed with token %d by %q, submitted with %s", id, p.FenceToken, deref(p.ClaimedBy), subs[0])
		}
	}
	// Paid payouts have their ledger entry, posted with the submission's token.
	var entries int
	if err := st.Paydb.QueryRow(ctx, `SELECT count(*) FROM ledger_entry l JOIN payout p USING (payout_id)
		WHERE l.posted_token = p.fence_token AND l.amount_minor = -p.amount_minor`).Scan(&entries); err != nil {
		t.Fatal(err)
	}
	if entries != 4 {
		t.Errorf("%d matching ledger entries, want 4 (the PAID payouts)", entries)
	}
}
