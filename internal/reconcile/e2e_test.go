package reconcile_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/executor"
	"lock.dev/internal/identity"
	"lock.dev/internal/invariants"
	"lock.dev/internal/logcapture"
	"lock.dev/internal/railstub"
	"lock.dev/internal/stack"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// The whole system under chaos — replies later than the proxy's
// read timeout, dropped replies, declines, a rail-proxy crash (SIGKILL) with
// calls in flight — with executors doing the work and a reconciler running beside
// them. After the final pass: no payout is AMBIGUOUS, the ledger equals what the
// rail accepted for our payouts, every PAID payout has exactly one accepted call,
// no exception, and each settle outcome occurred and agrees with the rail-stub's
// own call log (not the reconciler's copy, which is checked against it too).
func TestEndToEndUnderChaosTheBooksClose(t *testing.T) {
	t.Parallel()
	const settleAfter = 2 * time.Second
	logw := testLog(t)
	e := newEnv(t, stack.Options{
		ProxyAsChild: true,
		Log:          logw,
		Env: map[string]map[string]string{
			"rail-proxy": {"RAIL_READ_TIMEOUT": "300ms", "RAIL_CONNECT_TIMEOUT": "200ms", "RAIL_PROXY_INTERRUPTED_AFTER": "6600ms"},
			"rail-stub":  {"RAIL_STUB_SEED": "7"},
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Each settle outcome at least once, whatever the random chaos below does.
	e.ambiguousMix(t, "fix", 2, 2, 2)

	rec, err := e.st.StartReconciler(ctx, map[string]string{
		"RECONCILER_INTERVAL": "200ms", "RECONCILER_SETTLE_AFTER": settleAfter.String()})
	if err != nil {
		t.Fatal(err)
	}

	const accounts = 6
	created := 0
	create := func(n int) {
		t.Helper()
		for range n {
			p := payoutReq(fmt.Sprintf("p-%03d", created), fmt.Sprintf("acct-%d", created%accounts), int64(100+created*37))
			if _, err := e.creator.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
			created++
		}
	}
	const latency, dropRate, declineRate = 20, 0.06, 0.08
	e.chaos(t, latency, declineRate, dropRate)
	wctx, stopWork := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i := range 2 {
		cfg := executor.DefaultConfig()
		urls := e.st.ServiceURLs()
		cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = urls["LOCK_SERVER_URL"], urls["PAYMENT_RESOURCE_URL"], urls["RAIL_PROXY_URL"]
		cfg.OwnerID = fmt.Sprintf("executor-%d", i+1)
		cfg.Workers, cfg.LeaseTTL, cfg.ProxyTimeout = 2, 2*time.Second, 5*time.Second
		cfg.PollInterval, cfg.ReconcileInterval = 50*time.Millisecond, time.Second
		cfg.LogOutput = logw
		cfg.Identity = e.workload(identity.NameExecutor)
		ln, err := stack.Listener()
		if err != nil {
			t.Fatal(err)
		}
		cfg.Listener = ln
		wg.Go(func() {
			if err := executor.Run(wctx, cfg); err != nil {
				errs <- err
			}
		})
	}

	// Plain chaos: drops and declines.
	create(20)
	waitSettled(t, ctx, e, 6+created)
	// A slow window: every reply later than the read timeout (TIMEOUT, whether
	// the rail accepted or declined).
	e.chaos(t, 600, declineRate, dropRate)
	create(12)
	waitSettled(t, ctx, e, 6+created)
	// The crash: the rail holds its replies, and rail-proxy is killed just after
	// the rail booked a call it has not answered.
	seen := len(e.calls(t))
	create(12)
	deadline, _ := ctx.Deadline()
	testkit.Eventually(t, time.Until(deadline), "the rail to book a call", func() bool { return len(e.calls(t)) != seen })
	if err := e.st.CrashProxy(ctx); err != nil {
		t.Fatalf("crash rail-proxy: %v", err)
	}
	e.chaos(t, latency, declineRate, dropRate)
	create(16)
	waitSettled(t, ctx, e, 6+created)
	stopWork()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("executor: %v", err)
	}
	if _, err := e.st.FinalPass(ctx, rec, settleAfter); err != nil {
		t.Fatal(err)
	}
	if n := e.count(t, `SELECT count(*) FROM payout WHERE status = 'AMBIGUOUS'`); n != 0 {
		// What each one is waiting for, so that a run that stops here says why;
		// then one more final pass, its window recomputed: a payout that moved
		// while the first was being judged is settled by it, and one that is
		// still AMBIGUOUS after it fails the test.
		t.Logf("%d payouts AMBIGUOUS after the final pass:\n%s", n, e.ambiguousDetail(t))
		if _, err := e.st.FinalPass(ctx, rec, settleAfter); err != nil {
			t.Fatal(err)
		}
		if n := e.count(t, `SELECT count(*) FROM payout WHERE status = 'AMBIGUOUS'`); n != 0 {
			t.Fatalf("%d payouts AMBIGUOUS after a second final pass:\n%s", n, e.ambiguousDetail(t))
		}
	}
	if got := e.exceptions(t); len(got) != 0 {
		t.Fatalf("exceptions after a run with fencing on: %v", got)
	}
	calls := e.calls(t)
	byRef := map[string][]railstub.Call{}
	var acceptedOurs int64
	payoutIDs := map[string]bool{}
	rows, err := e.st.Paydb.Query(ctx, `SELECT payout_id FROM payout`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		payoutIDs[id] = true
	}
	rows.Close()
	for _, c := range calls {
		byRef[c.Reference] = append(byRef[c.Reference], c)
		if c.Result == railstub.ResultAccepted && payoutIDs[c.Reference] {
			acceptedOurs += c.AmountMinor
		}
	}
	var booked int64
	if err := e.st.Paydb.QueryRow(ctx, `SELECT coalesce(-sum(amount_minor), 0) FROM ledger_entry`).Scan(&booked); err != nil {
		t.Fatal(err)
	}
	if booked != acceptedOurs {
		t.Fatalf("the ledger books %d, the rail accepted %d for our payouts", booked, acceptedOurs)
	}

	// Every PAID payout: exactly one accepted call, carrying its rail reference.
	paid, err := e.st.Paydb.Query(ctx, `SELECT payout_id, rail_reference FROM payout WHERE status = 'PAID'`)
	if err != nil {
		t.Fatal(err)
	}
	for paid.Next() {
		var id, ref string
		if err := paid.Scan(&id, &ref); err != nil {
			t.Fatal(err)
		}
		var acc []railstub.Call
		for _, c := range byRef[id] {
			if c.Result == railstub.ResultAccepted {
				acc = append(acc, c)
			}
		}
		if len(acc) != 1 || acc[0].RailReference != ref {
			t.Errorf("PAID %s (%s): the rail accepted %v", id, ref, acc)
		}
	}
	paid.Close()

	// Each settle, against the rail-stub's own log.
	outcomes := map[string]int{}
	settles, err := e.st.Paydb.Query(ctx, `SELECT payout_id, outcome, rail_reference, statement_seq FROM payout_settlement`)
	if err != nil {
		t.Fatal(err)
	}
	for settles.Next() {
		var id, outcome string
		var ref *string
		var seq *int64
		if err := settles.Scan(&id, &outcome, &ref, &seq); err != nil {
			t.Fatal(err)
		}
		outcomes[outcome]++
		cs := byRef[id]
		switch outcome {
		case lockapi.StatusPaid:
			if seq == nil || ref == nil || !hasCall(cs, *seq, railstub.ResultAccepted, *ref) {
				t.Errorf("%s settled PAID from seq %v ref %v, but the rail's log for it is %+v", id, seq, ref, cs)
			}
		case lockapi.StatusDeclined:
			if seq == nil || !hasCall(cs, *seq, railstub.ResultDeclined, "") || countResult(cs, railstub.ResultAccepted) != 0 {
				t.Errorf("%s settled DECLINED from seq %v, but the rail's log for it is %+v", id, seq, cs)
			}
		case lockapi.StatusNotPresented:
			if len(cs) != 0 {
				t.Errorf("%s settled NOT_PRESENTED, but the rail was presented it: %+v", id, cs)
			}
		}
	}
	settles.Close()
	for _, o := range []string{lockapi.StatusPaid, lockapi.StatusDeclined, lockapi.StatusNotPresented} {
		if outcomes[o] == 0 {
			t.Errorf("no AMBIGUOUS payout was settled %s (settles: %v)", o, outcomes)
		}
	}
	t.Logf("settled from the statement: %v; %d rail calls", outcomes, len(calls))

	// The invariant checker, from ground truth, agrees: every invariant holds,
	// the books close (7) included.
	h, err := invariants.Load(ctx, e.st.Paydb, e.st.Lockdb, calls)
	if err != nil {
		t.Fatal(err)
	}
	report := invariants.Evaluate(h, invariants.Options{FencingEnabled: true, RequireSettled: true, Reconciled: true})
	if !report.OK() || !report.Held(7) || report.Reconciliation == nil || report.Reconciliation.AmbiguousLeft != 0 {
		t.Errorf("invariant checker: %v", report.Violations)
	}

	// The reconciler's copy is the rail's log, line for line.
	if n := e.count(t, `SELECT count(*) FROM rail_statement_line`); n != len(calls) {
		t.Fatalf("the copy has %d lines, the rail's log %d", n, len(calls))
	}
	for _, c := range calls {
		if n := e.count(t, `SELECT count(*) FROM rail_statement_line WHERE seq = $1 AND reference = $2 AND account_id = $3
			AND amount_minor = $4 AND currency = $5 AND result = $6 AND rail_reference IS NOT DISTINCT FROM nullif($7, '')
			AND decline_reason IS NOT DISTINCT FROM nullif($8, '') AND beneficiary = $9`,
			c.Seq, c.Reference, c.AccountID, c.AmountMinor, c.Currency, c.Result, c.RailReference, c.Reason, c.Beneficiary); n != 1 {
			t.Errorf("call %d is not copied as it is: %+v", c.Seq, c)
		}
	}
}

// waitSettled waits until n payouts are final (AMBIGUOUS counts: the executors are
// done with it) and no attempt is unresolved.
func waitSettled(t testing.TB, ctx context.Context, e *env, n int) {
	t.Helper()
	deadline, _ := ctx.Deadline()
	testkit.EventuallyState(t, time.Until(deadline), fmt.Sprintf("%d payouts final and no attempt unresolved", n), func() (bool, string) {
		done := e.count(t, `SELECT count(*) FROM payout WHERE status IN ('PAID','DECLINED','AMBIGUOUS','NOT_PRESENTED')`)
		open := e.count(t, `SELECT count(*) FROM rail_submission WHERE outcome IS NULL`)
		return done >= n && open == 0, fmt.Sprintf("%d of %d payouts final, %d attempts unresolved", done, n, open)
	})
}

func hasCall(cs []railstub.Call, seq int64, result, ref string) bool {
	for _, c := range cs {
		if c.Seq == seq && c.Result == result && (ref == "" || c.RailReference == ref) {
			return true
		}
	}
	return false
}

func countResult(cs []railstub.Call, result string) int {
	n := 0
	for _, c := range cs {
		if c.Result == result {
			n++
		}
	}
	return n
}

// testLog collects the services' logs and shows their end when the test fails.
func testLog(t testing.TB) io.Writer {
	b := &logcapture.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			lines := strings.Split(b.String(), "\n")
			t.Logf("the services' last log lines:\n%s", strings.Join(lines[max(0, len(lines)-150):], "\n"))
		}
	})
	return b
}

// ambiguousDetail describes each AMBIGUOUS payout: its row, its attempts, its
// statement lines and exceptions, beside the reconciler's cursor.
func (e *env) ambiguousDetail(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	q := func(sql string, args ...any) {
		rows, err := e.st.Paydb.Query(context.Background(), sql, args...)
		if err != nil {
			fmt.Fprintf(&b, "  %v\n", err)
			return
		}
		defer rows.Close()
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				fmt.Fprintf(&b, "  %v\n", err)
				return
			}
			fmt.Fprintf(&b, "  %v\n", vals)
		}
	}
	b.WriteString("cursor (last_seq, read_at, now):\n")
	q(`SELECT last_seq, read_at, now() FROM reconciler_cursor`)
	b.WriteString("payouts (id, account, updated_at):\n")
	q(`SELECT payout_id, account_id, updated_at FROM payout WHERE status = 'AMBIGUOUS' ORDER BY payout_id`)
	b.WriteString("their attempts (payout, id, outcome, submitted_at, resolved_at):\n")
	q(`SELECT s.payout_id, s.submission_id, s.outcome, s.submitted_at, s.resolved_at FROM rail_submission s
	     JOIN payout p USING (payout_id) WHERE p.status = 'AMBIGUOUS' ORDER BY s.submission_id`)
	b.WriteString("their lines (reference, seq, result, account, amount):\n")
	q(`SELECT l.reference, l.seq, l.result, l.account_id, l.amount_minor FROM rail_statement_line l
	     JOIN payout p ON p.payout_id = l.reference WHERE p.status = 'AMBIGUOUS' ORDER BY l.seq`)
	b.WriteString("exceptions (kind, payout, seq, detail):\n")
	q(`SELECT kind, payout_id, seq, detail FROM reconciliation_exception ORDER BY exception_id`)
	return b.String()
}
