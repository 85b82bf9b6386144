package hatest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/internal/executor"
	"lock.dev/internal/identity"
	"lock.dev/internal/invariants"
	"lock.dev/internal/logcapture"
	"lock.dev/internal/patroni"
	"lock.dev/internal/payment"
	"lock.dev/internal/railstub"
	"lock.dev/internal/stack"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

const (
	loadAccounts = 3
	settleAfter  = 2 * time.Second
)

// dbSeq numbers the databases each run creates on the shared cluster, so that
// no run sees another's rows.
var dbSeq atomic.Int64

// requireHealthy waits until the cluster has a leader accepting writes, a
// synchronous standby and every member streaming (an Async cluster: no
// synchronous standby), and fails the test otherwise.
func requireHealthy(t *testing.T, c *patroni.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.WaitHealthy(ctx); err != nil {
		clusterLogs(t, c)
		t.Fatal(err)
	}
}

// clusterLogs logs the end of etcd's and Patroni's logs.
func clusterLogs(t *testing.T, c *patroni.Cluster) {
	t.Helper()
	var b strings.Builder
	_ = c.WriteLogs(&b)
	lines := strings.Split(b.String(), "\n")
	if len(lines) > 150 {
		lines = lines[len(lines)-150:]
	}
	t.Logf("etcd and Patroni logs (last lines):\n%s", strings.Join(lines, "\n"))
}

// loadRun is the whole system running under load on a Patroni cluster: the
// stack's services on the cluster's multi-host URLs (identities and books
// checks on, the defaults), a reconciler, and two executors whose workers
// freeze past their lease now and then (stale writers), paying through the
// taps that record every token handed out and every answer's status.
type loadRun struct {
	t       *testing.T
	ctx     context.Context
	cluster *patroni.Cluster
	st      *stack.Stack
	rec     *stack.Reconciler
	logs    *logcapture.Buffer
	pc      *payment.Client
	created int

	stopOnce sync.Once
	stopWork context.CancelFunc
	wg       sync.WaitGroup
	errs     chan error
}

// startLoad creates a fresh paydb and lockdb on c, starts the system on them,
// creates 24 payouts over loadAccounts accounts, starts the executors, and
// returns once 6 payouts are final: the system is under load. Everything is
// stopped by the test's cleanup.
func startLoad(t *testing.T, ctx context.Context, c *patroni.Cluster) *loadRun {
	t.Helper()
	n := dbSeq.Add(1)
	paydb, lockdb := fmt.Sprintf("paydb_%d", n), fmt.Sprintf("lockdb_%d", n)
	for _, db := range []string{paydb, lockdb} {
		if err := c.CreateDatabase(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	r := &loadRun{t: t, ctx: ctx, cluster: c, logs: &logcapture.Buffer{}, errs: make(chan error, 2)}
	st, err := stack.Start(ctx, stack.Options{
		PaydbURL: c.URL(paydb), LockdbURL: c.URL(lockdb),
		Tap: true,
		Log: r.logs,
		Env: map[string]map[string]string{
			// The shortest interrupted-intent age docs/contracts/rail-proxy.md
			// allows for these timeouts, so intents a failover left unresolved
			// settle within the test.
			"rail-proxy": {"RAIL_READ_TIMEOUT": "300ms", "RAIL_CONNECT_TIMEOUT": "200ms", "RAIL_PROXY_INTERRUPTED_AFTER": "6500ms"},
			"rail-stub":  {"RAIL_STUB_SEED": "9", "RAIL_STUB_LATENCY_MS": "20", "RAIL_STUB_DECLINE_RATE": "0.1"},
			// The books checks stay on (their default); a NOT_PRESENTED settle
			// needs the statement read this long past the attempt.
			"payment-resource": {"PAYMENT_SETTLE_AFTER": settleAfter.String()},
		},
	})
	if err != nil {
		t.Fatalf("start the system on the Patroni cluster: %v", err)
	}
	r.st = st
	t.Cleanup(func() {
		r.stopExecutors()
		if t.Failed() {
			t.Logf("service warnings and errors:\n%s", r.logs.Problems(60))
			clusterLogs(t, c)
		}
		if err := st.Close(); err != nil {
			t.Errorf("stop the system: %v", err)
		}
	})
	if r.rec, err = st.StartReconciler(ctx, map[string]string{
		"RECONCILER_INTERVAL": "200ms", "RECONCILER_SETTLE_AFTER": settleAfter.String()}); err != nil {
		t.Fatal(err)
	}
	r.pc = payment.NewTLSClient(st.PaymentURL, st.ClientTLS(identity.NameOps, identity.NamePaymentResource))
	r.create("a", 24, byIndex)

	wctx, stopWork := context.WithCancel(ctx)
	r.stopWork = stopWork
	for i := range 2 {
		cfg := executor.DefaultConfig()
		urls := st.ServiceURLs() // the taps: every token handed out is recorded
		cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = urls["LOCK_SERVER_URL"], urls["PAYMENT_RESOURCE_URL"], urls["RAIL_PROXY_URL"]
		cfg.OwnerID = fmt.Sprintf("executor-%d", i+1)
		cfg.Identity = identity.Files(st.CertsDir, identity.NameExecutor)
		cfg.Workers, cfg.LeaseTTL, cfg.ProxyTimeout = 2, time.Second, 7*time.Second
		cfg.PollInterval, cfg.ReconcileInterval = 50*time.Millisecond, time.Second
		// Stale writers: a frozen worker wakes after its lease has expired.
		cfg.PauseProbability, cfg.Pause, cfg.Seed = 0.3, 1500*time.Millisecond, int64(11+i)
		cfg.LogOutput = r.logs
		ln, err := stack.Listener()
		if err != nil {
			t.Fatal(err)
		}
		cfg.Listener = ln
		r.wg.Go(func() {
			if err := executor.Run(wctx, cfg); err != nil {
				r.errs <- fmt.Errorf("%s: %w", cfg.OwnerID, err)
			}
		})
	}
	r.waitFinal(6)
	return r
}

func byIndex(i int) string { return fmt.Sprintf("acct-%d", i%loadAccounts) }

// create creates n payouts named prefix-NNN on account(i) and returns their ids.
// Across a failover a create may meet the old leader (503); creating is
// idempotent, so it is sent again until it succeeds.
func (r *loadRun) create(prefix string, n int, account func(i int) string) []string {
	r.t.Helper()
	deadline, _ := r.ctx.Deadline()
	var ids []string
	for i := range n {
		p := lockapi.SubmissionRequest{PayoutID: fmt.Sprintf("%s-%03d", prefix, i), AccountID: account(i),
			AmountMinor: int64(100 + 37*i), Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}
		testkit.EventuallyState(r.t, time.Until(deadline), "create "+p.PayoutID, func() (bool, string) {
			cctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
			defer cancel()
			if _, err := r.pc.Create(cctx, p); err != nil {
				return false, err.Error()
			}
			return true, ""
		})
		ids = append(ids, p.PayoutID)
	}
	r.created += n
	return ids
}

// waitFinal waits until at least n payouts are final.
func (r *loadRun) waitFinal(n int) {
	r.t.Helper()
	deadline, _ := r.ctx.Deadline()
	testkit.Eventually(r.t, time.Until(deadline), fmt.Sprintf("%d payouts final", n), func() bool {
		var final int
		err := r.st.Paydb.QueryRow(r.ctx, `SELECT count(*) FROM payout WHERE status IN ('PAID','DECLINED','AMBIGUOUS','NOT_PRESENTED')`).Scan(&final)
		return err == nil && final >= n // an error: the database is switching; ask again
	})
}

// railCalls is the rail-stub's call log.
func (r *loadRun) railCalls() []railstub.Call {
	r.t.Helper()
	calls, err := r.st.Stub.Calls(r.ctx)
	if err != nil {
		r.t.Fatalf("the rail-stub's call log: %v", err)
	}
	return calls
}

// grants reads lockdb's lock_grant as lock name → tokens, through the
// cluster's URL (whichever member leads).
func (r *loadRun) grants() map[string][]int64 {
	r.t.Helper()
	out := map[string][]int64{}
	deadline, _ := r.ctx.Deadline()
	testkit.EventuallyState(r.t, time.Until(deadline), "read lock_grant", func() (bool, string) {
		clear(out)
		rows, err := r.st.Lockdb.Query(r.ctx, `SELECT lock_name, token FROM lock_grant ORDER BY lock_name, token`)
		if err != nil {
			return false, err.Error()
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			var token int64
			if err := rows.Scan(&name, &token); err != nil {
				return false, err.Error()
			}
			out[name] = append(out[name], token)
		}
		if err := rows.Err(); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return out
}

func (r *loadRun) stopExecutors() {
	r.stopOnce.Do(func() {
		if r.stopWork == nil {
			return
		}
		r.stopWork()
		r.wg.Wait()
		close(r.errs)
		for err := range r.errs {
			r.t.Errorf("executor: %v", err)
		}
	})
}

// figures is what a run under a fault saw.
type figures struct {
	report invariants.Report
	// fault is when the fault began (the kill, the switchover's start), and
	// recovered when the cluster had a new leader accepting writes.
	fault, recovered time.Time
	// firstCall is the time from the fault to the first rail call after it (a
	// submission admitted by rail-proxy at the new leader's mark).
	firstCall time.Duration
	// pause is the longest time between two consecutive rail calls across the
	// fault (the later after the fault, the earlier before recovery): how long
	// the rail saw no payment.
	pause time.Duration
	// unavailable counts the 503 answers per service from the fault on.
	unavailable map[string]int
	created     int
	// Tokens handed out (recorded in front of lock-server) before the fault and
	// after recovery.
	issuedBefore, issuedAfter int
	// tokensTwice: a lock's token handed out more than once; notAbove: a token
	// handed out after recovery not above its lock's tokens handed out before
	// the fault; grantsLost: a lock_grant row read before the fault missing at
	// the end.
	tokensTwice, notAbove, grantsLost []string
	grantsBefore, grantsAfter         int
	callsAfter                        int
	booksChecked                      bool
}

// finish runs the rest of a run whose fault began at fault and whose cluster
// recovered at recovered: 12 more payouts, every payout final and no attempt
// unresolved, the executors stopped, the reconciler's final pass; then the
// checker judges paydb, lockdb, the rail-stub's call log and the tokens handed
// out. grantsBefore is lock_grant as read before the fault.
func (r *loadRun) finish(fault, recovered time.Time, grantsBefore map[string][]int64) figures {
	r.t.Helper()
	t, ctx, st := r.t, r.ctx, r.st
	deadline, _ := ctx.Deadline()
	r.create("c", 12, byIndex)
	testkit.Eventually(t, time.Until(deadline), "every payout final and no attempt unresolved", func() bool {
		var total, final, open int
		err := st.Paydb.QueryRow(ctx, `SELECT (SELECT count(*) FROM payout),
			(SELECT count(*) FROM payout WHERE status IN ('PAID','DECLINED','AMBIGUOUS','NOT_PRESENTED')),
			(SELECT count(*) FROM rail_submission WHERE outcome IS NULL)`).Scan(&total, &final, &open)
		return err == nil && total > 0 && final == total && open == 0
	})
	r.stopExecutors()
	if _, err := st.FinalPass(ctx, r.rec, settleAfter); err != nil {
		t.Fatal(err)
	}

	f := figures{fault: fault, recovered: recovered, created: r.created, unavailable: map[string]int{}}
	proxyBooks, err := st.ReadMetric(ctx, identity.NameRailProxy, "rail_proxy_books_check_enabled")
	if err != nil {
		t.Fatal(err)
	}
	paymentBooks, err := st.ReadMetric(ctx, identity.NamePaymentResource, "payment_books_check_enabled")
	if err != nil {
		t.Fatal(err)
	}
	f.booksChecked = proxyBooks == 1 && paymentBooks == 1
	calls := r.railCalls()
	h, err := invariants.Load(ctx, st.Paydb, st.Lockdb, calls)
	if err != nil {
		t.Fatal(err)
	}
	h.Issued = st.IssuedTokens()
	f.report = invariants.Evaluate(h, invariants.Options{FencingEnabled: true, RequireSettled: true, Reconciled: true,
		IssuedRecorded: true, BooksBound: true})

	for _, c := range calls {
		if c.ReceivedAt.After(fault) {
			f.callsAfter++
			if d := c.ReceivedAt.Sub(fault); f.firstCall == 0 || d < f.firstCall {
				f.firstCall = d
			}
		}
	}
	at := make([]time.Time, 0, len(calls))
	for _, c := range calls {
		at = append(at, c.ReceivedAt)
	}
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(at); i++ {
		if at[i].After(fault) && at[i-1].Before(recovered) {
			f.pause = max(f.pause, at[i].Sub(at[i-1]))
		}
	}
	for _, a := range st.Answers(fault, time.Time{}) {
		if a.Status == 503 {
			f.unavailable[a.Service]++
		}
	}
	seen := map[string]int{}
	before := map[string]int64{}
	for _, it := range h.Issued {
		seen[fmt.Sprintf("%s/%d", it.LockName, it.Token)]++
		if it.At.Before(fault) {
			f.issuedBefore++
			before[it.LockName] = max(before[it.LockName], it.Token)
		}
	}
	for _, it := range h.Issued {
		if it.At.After(recovered) {
			f.issuedAfter++
			if it.Token <= before[it.LockName] {
				f.notAbove = append(f.notAbove, fmt.Sprintf("%s token %d to %s (%d before the fault)", it.LockName, it.Token, it.OwnerID, before[it.LockName]))
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(seen)) {
		if seen[k] > 1 {
			f.tokensTwice = append(f.tokensTwice, fmt.Sprintf("%s handed out %d times", k, seen[k]))
		}
	}
	after := r.grants()
	for lock, tokens := range grantsBefore {
		f.grantsBefore += len(tokens)
		for _, tok := range tokens {
			if !slices.Contains(after[lock], tok) {
				f.grantsLost = append(f.grantsLost, fmt.Sprintf("%s token %d", lock, tok))
			}
		}
	}
	for _, tokens := range after {
		f.grantsAfter += len(tokens)
	}
	sort.Strings(f.grantsLost)
	return f
}

// judgedRuns and fencedTotal count the runs requireEveryInvariant judged and
// the stale submissions they fenced, for the package's own verdict.
var judgedRuns, fencedTotal atomic.Int64

// requireEveryInvariant fails the test unless the checker found nothing, every
// invariant was judged and held, the books checks were on, every payout is
// final, and no token was handed out twice, below an earlier one or forgotten.
func requireEveryInvariant(t *testing.T, f figures) {
	t.Helper()
	r := f.report
	if !r.OK() {
		t.Errorf("the checker found violations:\n%s", r.ViolationsText())
	}
	for _, v := range r.NotHeld(1, 2, 3, 4, 5, 6, 7, 8) {
		t.Errorf("invariant %d broken or not judged", v)
	}
	if !f.booksChecked {
		t.Error("the system ran with a books check off: the stack must leave them on")
	}
	if r.Payouts.Total != f.created || r.Payouts.Pending+r.Payouts.Claimed != 0 {
		t.Errorf("payouts %+v, want all %d final", r.Payouts, f.created)
	}
	// "0 stale admissions" means something only if stale writers did submit.
	// Stale writers come from random pauses, so one test may see none; the
	// package fails unless its runs together fenced some (main_test.go).
	judgedRuns.Add(1)
	fencedTotal.Add(int64(r.Submissions.Fenced))
	if r.Submissions.Fenced == 0 {
		t.Log("no submission was FENCED in this run: no stale writer reached rail-proxy's gate")
	}
	if len(f.tokensTwice) > 0 {
		t.Errorf("tokens handed out twice: %v", f.tokensTwice)
	}
	if len(f.notAbove) > 0 {
		t.Errorf("tokens handed out after recovery not above those before the fault: %v", f.notAbove)
	}
	if len(f.grantsLost) > 0 {
		t.Errorf("lock_grant rows read before the fault and gone after it: %v", f.grantsLost)
	}
	// The run did cross the fault: tokens were handed out and the rail was
	// presented payouts after it, by the same processes.
	if f.issuedAfter == 0 || f.callsAfter == 0 {
		t.Errorf("after recovery: %d tokens handed out, %d rail calls; want some of each", f.issuedAfter, f.callsAfter)
	}
}

// logFigures logs a run's figures.
func logFigures(t *testing.T, what string, f figures) {
	t.Helper()
	r := f.report
	var per []string
	for _, svc := range slices.Sorted(maps.Keys(f.unavailable)) {
		per = append(per, fmt.Sprintf("%s %d", svc, f.unavailable[svc]))
	}
	if len(per) == 0 {
		per = []string{"none"}
	}
	t.Logf("%s: new leader accepting writes after %s; first rail call after %s, longest pause between rail calls %s; 503s from the fault on: %s; "+
		"%d payouts, %d rail calls (%d after the fault), %d stale submissions fenced; tokens handed out %d before, %d after (%d twice, %d not above); "+
		"lock_grant rows %d before, %d at the end (%d lost)",
		what, f.recovered.Sub(f.fault).Round(time.Millisecond), f.firstCall.Round(time.Millisecond), f.pause.Round(time.Millisecond), strings.Join(per, ", "),
		r.Payouts.Total, r.RailCalls.Total, f.callsAfter, r.Submissions.Fenced, f.issuedBefore, f.issuedAfter, len(f.tokensTwice), len(f.notAbove),
		f.grantsBefore, f.grantsAfter, len(f.grantsLost))
}
