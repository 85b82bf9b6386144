package reconcile_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/internal/identity"
	"lock.dev/internal/reconcile"
	"lock.dev/internal/stack"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// ambiguousMix makes AMBIGUOUS payouts of the three kinds a statement settles:
// dropped replies (the rail accepted: PAID), declines answered past the read
// timeout (DECLINED), and calls that never reached the rail (NOT_PRESENTED). It
// needs a stack whose rail-proxy has RAIL_READ_TIMEOUT 300ms.
func (e *env) ambiguousMix(t testing.TB, prefix string, paid, declined, absent int) {
	t.Helper()
	n := 0
	next := func() lockapi.SubmissionRequest {
		n++
		return payoutReq(fmt.Sprintf("%s-%03d", prefix, n), fmt.Sprintf("acct-%d", n%5), int64(1000+n))
	}
	e.chaos(t, 0, 0, 1)
	for range paid {
		if got := e.drive(t, e.st.ProxyURL, next()); got != lockapi.StatusAmbiguous {
			t.Fatalf("a dropped reply was posted %s", got)
		}
	}
	e.chaos(t, 600, 1, 0)
	for range declined {
		if got := e.drive(t, e.st.ProxyURL, next()); got != lockapi.StatusAmbiguous {
			t.Fatalf("a late decline was posted %s", got)
		}
	}
	e.chaos(t, 0, 0, 0)
	void := e.blackholeProxy(t)
	for range absent {
		if got := e.drive(t, void, next()); got != lockapi.StatusAmbiguous {
			t.Fatalf("a call that never reached the rail was posted %s", got)
		}
	}
}

var fastProxy = map[string]map[string]string{"rail-proxy": {"RAIL_READ_TIMEOUT": "300ms"}}

// Two reconcilers started together on one paydb settle each payout
// once: one ledger entry per PAID payout, and the settles both reconcilers count
// add up to the payouts settled — as does payment-resource's own count.
func TestTwoReconcilersSettleEachPayoutOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stack.Options{Env: fastProxy})
	const paid, declined, absent = 6, 4, 2
	e.ambiguousMix(t, "p", paid, declined, absent)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	settings := map[string]string{"RECONCILER_INTERVAL": "20ms", "RECONCILER_SETTLE_AFTER": "1s"}
	var recs [2]*stack.Reconciler
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i := range recs {
		wg.Go(func() {
			r, err := e.st.StartReconciler(ctx, settings)
			if err != nil {
				errs <- err
				return
			}
			recs[i] = r
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	deadline, _ := ctx.Deadline()
	testkit.Eventually(t, time.Until(deadline), "no AMBIGUOUS payout left", func() bool {
		return e.count(t, `SELECT count(*) FROM payout WHERE status = 'AMBIGUOUS'`) == 0
	})
	// A few more passes each, so that a second settle would have had its chance.
	for _, r := range recs {
		before := metric(t, r, `reconciler_pass_total{result="completed"}`)
		testkit.Eventually(t, time.Minute, "three more completed passes", func() bool {
			return metric(t, r, `reconciler_pass_total{result="completed"}`) >= before+3
		})
	}

	want := map[string]int{"PAID": paid, "DECLINED": declined, "NOT_PRESENTED": absent}
	for status, n := range want {
		if got := e.count(t, `SELECT count(*) FROM payout WHERE status = $1`, status); got != n {
			t.Errorf("%d payouts %s, want %d", got, status, n)
		}
		label := strings.ToLower(status)
		var sum float64
		for _, r := range recs {
			sum += metric(t, r, fmt.Sprintf(`reconciler_settled_total{to=%q}`, label))
		}
		if sum != float64(n) {
			t.Errorf("reconciler_settled_total{to=%s} summed over both reconcilers = %v, want %d", label, sum, n)
		}
		pr, err := e.st.ReadMetric(ctx, identity.NamePaymentResource, fmt.Sprintf(`payout_settle_total{outcome=%q}`, label))
		if err != nil || pr != float64(n) {
			t.Errorf("payment-resource's payout_settle_total{outcome=%s} = %v (%v), want %d", label, pr, err, n)
		}
	}
	if l, p := e.count(t, `SELECT count(*) FROM ledger_entry`), e.count(t, `SELECT count(*) FROM payout WHERE status = 'PAID'`); l != p || l != paid {
		t.Errorf("%d ledger entries for %d PAID payouts, want %d each", l, p, paid)
	}
	if n := e.count(t, `SELECT count(*) FROM payout_settlement`); n != paid+declined+absent {
		t.Errorf("%d settlement records, want %d", n, paid+declined+absent)
	}
	if got := e.exceptions(t); len(got) != 0 {
		t.Errorf("exceptions %v, want none", got)
	}
}

func metric(t testing.TB, r *stack.Reconciler, series string) float64 {
	t.Helper()
	v, err := r.Metric(context.Background(), series)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// While another session holds the pass lock, a pass is skipped: it imports,
// settles and records nothing. Once the lock is free the next pass does the work.
func TestPassSkippedWhileAnotherHoldsTheLock(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stack.Options{})
	if got := e.drive(t, e.st.ProxyURL, payoutReq("p-1", "acct-1", 10)); got != lockapi.StatusPaid {
		t.Fatalf("p-1 posted %s", got)
	}
	ctx := context.Background()
	other, err := pgx.Connect(ctx, e.st.PaydbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	key := reconcile.PassLockKey
	if _, err := other.Exec(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		t.Fatal(err)
	}
	rep, err := reconcile.Pass(ctx, e.cfg)
	if err != nil || !rep.Skipped || rep.Imported != 0 {
		t.Fatalf("pass while the lock is held: %+v %v, want skipped", rep, err)
	}
	if n := e.count(t, `SELECT count(*) FROM rail_statement_line`); n != 0 {
		t.Fatalf("a skipped pass imported %d lines", n)
	}
	if _, err := other.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
		t.Fatal(err)
	}
	if rep := e.pass(t); rep.Imported != 1 {
		t.Fatalf("pass after the lock was freed imported %d lines, want 1", rep.Imported)
	}
	// A one-off pass closes its pool, which would free a lock it kept. A running
	// reconciler keeps its connections, so its completed pass is where a kept lock
	// would show. Its next pass is an hour away, so none is in progress when the
	// locks are counted. pg_locks is the cluster's: tests running alongside hold
	// the same key in their own databases, so only this database's locks count.
	r, err := e.st.StartReconciler(ctx, map[string]string{"RECONCILER_INTERVAL": "1h"})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the running reconciler to complete a pass", func() bool {
		return metric(t, r, `reconciler_pass_total{result="completed"}`) >= 1
	})
	var held int
	if err := other.QueryRow(ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&held); err != nil || held != 0 {
		t.Fatalf("%d advisory locks held after the pass (err %v), want 0: the pass must give its lock back", held, err)
	}
}
