package executor_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/executor"
	"lock.dev/internal/identity"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// 200 payouts over 20 accounts, 4 executors, no chaos →
// every payout PAID, exactly one rail call per payout, and the ledger's debits add
// up to what the rail accepted.
func TestEndToEndEveryPayoutPaidOnce(t *testing.T) {
	t.Parallel()
	const n, accounts, executors = 200, 20, 4
	st, _ := startStack(t, nil)
	created := createPayouts(t, st, "e2e", n, accounts)
	var ex []*runningExecutor
	for i := range executors {
		ex = append(ex, startExecutor(t, st, fmt.Sprintf("exec-%d", i), func(c *executor.Config) {
			c.Workers = 4
			c.LeaseTTL = 3 * time.Second
		}))
	}
	rows := waitSettled(t, st, "e2e", n, 3*time.Minute)

	calls := railCalls(t, st)
	entries := ledger(t, st, "e2e")
	var accepted, debited int64
	for _, c := range calls {
		for _, call := range c {
			if call.Result == "ACCEPTED" {
				accepted += call.AmountMinor
			}
		}
	}
	for _, p := range created {
		r := rows[p.PayoutID]
		if r.status != lockapi.StatusPaid {
			t.Errorf("%s is %s, want PAID", p.PayoutID, r.status)
			continue
		}
		c := calls[p.PayoutID]
		if len(c) != 1 {
			t.Errorf("%s reached the rail %d times, want exactly once", p.PayoutID, len(c))
			continue
		}
		if c[0].AmountMinor != p.AmountMinor || c[0].AccountID != p.AccountID || c[0].Beneficiary != p.Beneficiary {
			t.Errorf("%s: the rail was presented %+v, want the payout's own fields", p.PayoutID, c[0])
		}
		if r.railReference == nil || *r.railReference != c[0].RailReference {
			t.Errorf("%s: rail reference %v, the rail says %q", p.PayoutID, r.railReference, c[0].RailReference)
		}
		e := entries[p.PayoutID]
		if len(e) != 1 || e[0].amount != -p.AmountMinor || e[0].token != r.fenceToken {
			t.Errorf("%s: ledger %+v, want one debit of %d posted with token %d", p.PayoutID, e, p.AmountMinor, r.fenceToken)
			continue
		}
		debited += -e[0].amount
	}
	if len(calls) != n {
		t.Errorf("the rail saw %d distinct payouts, want %d", len(calls), n)
	}
	if debited != accepted {
		t.Errorf("the ledger debits %d, the rail accepted %d", debited, accepted)
	}
	var paid float64
	for _, r := range ex {
		got := paidCount(t, r, "paid")
		if got == 0 {
			t.Errorf("executor %s paid nothing; the four did not share the work", r.owner)
		}
		paid += got
	}
	if paid != n {
		t.Errorf(`executor_payout_total{result="paid"} sums to %v over the executors, want %d`, paid, n)
	}
}

// staleSetup is the stale writer made the way docs/contracts/executor.md says: executor A
// claims P with T1 and freezes between its last lease check and its submission;
// its lease expires.
func staleSetup(t *testing.T, prefix string, extra int) (st stackT, a *runningExecutor, gateA *gate, p string, t1 int64) {
	t.Helper()
	return staleSetupOn(t, nil, prefix, extra)
}

// reclaimFrozen starts executor B, whose reconcile pass re-claims the stale P
// and freezes right before B's own submission; it returns B, its gate, and B's
// token, checked above A's t1.
func reclaimFrozen(t *testing.T, st stackT, p string, t1 int64) (*runningExecutor, *gate, int64) {
	t.Helper()
	gateB := newGate(p)
	b := startExecutor(t, st, "fresh-b", func(c *executor.Config) {
		c.Workers = 1
		// B's lease is frozen while it waits at its gate for A: long enough to
		// outlast that wait on a loaded machine, so B still holds it to post.
		c.LeaseTTL = 3 * time.Second
		c.PauseProbability = 1
		c.PauseHook = gateB.hook
	})
	gateB.waitEntered(t, "executor B")
	t2 := payout(t, st, p).fenceToken
	if t2 <= t1 {
		t.Fatalf("B claimed P with %d, not above A's %d", t2, t1)
	}
	return b, gateB, t2
}

// staleSetupOn is staleSetup on a system started with env.
func staleSetupOn(t *testing.T, env map[string]map[string]string, prefix string, extra int) (st stackT, a *runningExecutor, gateA *gate, p string, t1 int64) {
	t.Helper()
	s, _ := startStack(t, env)
	ps := createPayouts(t, s, prefix, 1+extra, 1) // one account; P is the oldest
	p = ps[0].PayoutID
	gateA = newGate(p)
	a = startExecutor(t, s, "stale-a", func(c *executor.Config) {
		c.Workers = 1
		c.LeaseTTL = time.Second
		c.ReconcileInterval = -1 // A must not reconcile its own stale claim
		c.PauseProbability = 1
		c.PauseHook = gateA.hook
	})
	gateA.waitEntered(t, "executor A")
	row := payout(t, s, p)
	if row.status != lockapi.StatusClaimed || row.claimedBy == nil || *row.claimedBy != "stale-a" {
		t.Fatalf("P is %s by %v, want CLAIMED by stale-a", row.status, row.claimedBy)
	}
	waitLeaseExpired(t, s, ps[0].AccountID)
	return s, a, gateA, p, row.fenceToken
}

// checkPaidOnce: one rail call for P, P PAID with the reference the rail gave, one
// ledger entry posted with P's final token.
func checkPaidOnce(t *testing.T, st stackT, p string) payoutRow {
	t.Helper()
	row := payout(t, st, p)
	calls := railCalls(t, st)[p]
	if len(calls) != 1 {
		t.Fatalf("P reached the rail %d times, want exactly once", len(calls))
	}
	if row.status != lockapi.StatusPaid || row.railReference == nil || *row.railReference != calls[0].RailReference {
		t.Fatalf("P is %s with reference %v; the rail accepted it as %q", row.status, row.railReference, calls[0].RailReference)
	}
	e := ledger(t, st, p)[p]
	if len(e) != 1 || e[0].amount != -row.amount || e[0].token != row.fenceToken {
		t.Fatalf("P's ledger %+v, want one debit of %d with token %d", e, row.amount, row.fenceToken)
	}
	return row
}

// A wakes after B's submission. A is FENCED_OUT at the
// proxy and posts nothing.
func TestStaleWriterWakesAfterNewHolderSubmitted(t *testing.T) {
	t.Parallel()
	st, a, gateA, p, t1 := staleSetup(t, "s1", 0)

	// B takes the account through the reconcile pass, re-claims P and submits it.
	b := startExecutor(t, st, "fresh-b", func(c *executor.Config) { c.Workers = 1; c.LeaseTTL = time.Second })
	testkit.EventuallyState(t, 30*time.Second, "B to pay P", func() (bool, string) {
		r := payout(t, st, p)
		return r.status == lockapi.StatusPaid, r.status
	})
	gateA.release()
	testkit.EventuallyState(t, 30*time.Second, "A's stale submission", func() (bool, string) {
		return paidCount(t, a, "fenced") == 1, fmt.Sprint(attempts(t, st, p))
	})
	for _, r := range []string{"paid", "declined", "ambiguous", "duplicate"} {
		if v := paidCount(t, a, r); v != 0 {
			t.Errorf("A counted %v %s", v, r)
		}
	}
	if v := a.metric(t, "executor_pause_total"); v != 1 {
		t.Errorf("A counted %v pauses, want 1", v)
	}
	a.stop(t) // A's cycle is over once Run returns
	b.stop(t)

	row := checkPaidOnce(t, st, p)
	if row.fenceToken <= t1 {
		t.Fatalf("P was paid under token %d, not above A's %d", row.fenceToken, t1)
	}
	got := fmt.Sprint(attempts(t, st, p))
	want := fmt.Sprintf("[ACKED@%d(fresh-b) FENCED@%d(stale-a)]", row.fenceToken, t1)
	if got != want {
		t.Fatalf("P's attempts %s, want %s", got, want)
	}
	if a.logs.contains(`"event":"payout_posted"`) || a.logs.contains(`"event":"post_refused"`) {
		t.Fatalf("A posted after being fenced out:\n%s", a.logs.String())
	}
}

// A wakes before B submits. A's submission reaches the
// rail; B gets DUPLICATE_SUBMISSION and adopts the first outcome.
//
// rail-proxy's books check is off here: this is what the fence and the
// duplicate check alone make of a superseded holder. With the books on, A's
// submission is refused NOT_IN_BOOKS (token) — P is claimed under B's token —
// and never reaches the rail (TestNotInBooksForANewerClaimIsFencedOut).
func TestStaleWriterWakesBeforeNewHolderSubmits(t *testing.T) {
	t.Parallel()
	st, a, gateA, p, t1 := staleSetupOn(t, booksOff, "s2", 0)

	// B re-claims P through the reconcile pass, finds nothing on record, and
	// freezes right before its own submission.
	b, gateB, t2 := reclaimFrozen(t, st, p, t1)
	gateA.release()
	testkit.EventuallyState(t, 30*time.Second, "A's submission to be accepted", func() (bool, string) {
		as := attempts(t, st, p)
		return len(as) == 1 && as[0].outcome != nil && *as[0].outcome == lockapi.OutcomeAcked, fmt.Sprint(as)
	})
	gateB.release()
	testkit.EventuallyState(t, 30*time.Second, "B to adopt the first outcome", func() (bool, string) {
		r := payout(t, st, p)
		return r.status == lockapi.StatusPaid, r.status
	})
	testkit.EventuallyState(t, 30*time.Second, "B to count the duplicate", func() (bool, string) {
		return paidCount(t, b, "duplicate") == 1, ""
	})
	a.stop(t)
	b.stop(t)

	row := checkPaidOnce(t, st, p)
	if row.fenceToken != t2 {
		t.Fatalf("P was posted under token %d, want B's %d", row.fenceToken, t2)
	}
	got := fmt.Sprint(attempts(t, st, p))
	want := fmt.Sprintf("[ACKED@%d(stale-a) DUPLICATE@%d(fresh-b)]", t1, t2)
	if got != want {
		t.Fatalf("P's attempts %s, want %s", got, want)
	}
	// A's own post, if it tried one after noticing nothing, was refused at fence
	// point (a): B's claim superseded it.
	if a.logs.contains(`"event":"payout_posted"`) {
		t.Fatalf("A's stale post was accepted:\n%s", a.logs.String())
	}
}

// B works another payout P2 of the same account and
// submits it first; A's stale submission of P is FENCED_OUT; the reconcile pass
// later pays P with a new token.
func TestStaleWriterFencedByAnotherPayoutThenReconciled(t *testing.T) {
	t.Parallel()
	st, a, gateA, p, t1 := staleSetup(t, "s3", 1)
	p2 := strings.Replace(p, "-000", "-001", 1)

	b := startExecutor(t, st, "fresh-b", func(c *executor.Config) {
		c.Workers = 1
		c.LeaseTTL = time.Second
		c.ReconcileInterval = -1 // B works PENDING payouts only: P2, not P
	})
	testkit.EventuallyState(t, 30*time.Second, "B to pay P2", func() (bool, string) {
		r := payout(t, st, p2)
		return r.status == lockapi.StatusPaid, r.status
	})
	t2 := payout(t, st, p2).fenceToken
	gateA.release()
	testkit.EventuallyState(t, 30*time.Second, "A's stale submission to be fenced", func() (bool, string) {
		return paidCount(t, a, "fenced") == 1, fmt.Sprint(attempts(t, st, p))
	})
	if r := payout(t, st, p); r.status != lockapi.StatusClaimed || r.fenceToken != t1 {
		t.Fatalf("after A's fenced submission P is %s with token %d, want still CLAIMED with %d", r.status, r.fenceToken, t1)
	}
	if c := railCalls(t, st)[p]; len(c) != 0 {
		t.Fatalf("A's stale submission reached the rail: %+v", c)
	}

	c := startExecutor(t, st, "reconciler-c", func(c *executor.Config) { c.Workers = 1; c.LeaseTTL = time.Second })
	testkit.EventuallyState(t, 30*time.Second, "the reconcile pass to pay P", func() (bool, string) {
		r := payout(t, st, p)
		return r.status == lockapi.StatusPaid, r.status
	})
	a.stop(t)
	b.stop(t)
	c.stop(t)

	row := checkPaidOnce(t, st, p)
	if row.fenceToken <= t2 {
		t.Fatalf("P was paid under token %d, not above P2's %d", row.fenceToken, t2)
	}
	checkPaidOnce(t, st, p2)
	got := fmt.Sprint(attempts(t, st, p))
	want := fmt.Sprintf("[FENCED@%d(stale-a) ACKED@%d(reconciler-c)]", t1, row.fenceToken)
	if got != want {
		t.Fatalf("P's attempts %s, want %s", got, want)
	}
}

// Rail latency beyond the proxy's read timeout for some
// calls, dropped connections for others (and declines): those end AMBIGUOUS (the
// declines DECLINED), none is submitted again, none is lost, the rest are PAID.
func TestChaosEndsAmbiguousNeverResubmitted(t *testing.T) {
	t.Parallel()
	const readTimeout = 300 * time.Millisecond
	st, _ := startStack(t, map[string]map[string]string{
		"rail-proxy": {"RAIL_READ_TIMEOUT": readTimeout.String()},
	})
	for i := range 2 {
		startExecutor(t, st, fmt.Sprintf("chaos-%d", i), nil)
	}
	ctx := context.Background()
	seed := int64(11)
	phases := []struct {
		prefix               string
		n                    int
		latencyMs            int
		declineRate, dropped float64
	}{
		{"drop", 30, 0, 0.2, 0.4},
		{"slow", 8, 2 * int(readTimeout.Milliseconds()), 0, 0},
		{"calm", 12, 0, 0, 0},
	}
	total := 0
	for _, ph := range phases {
		if _, err := st.Stub.SetChaos(ctx, ph.latencyMs, ph.declineRate, ph.dropped, &seed); err != nil {
			t.Fatal(err)
		}
		createPayouts(t, st, ph.prefix, ph.n, 5)
		waitSettled(t, st, ph.prefix, ph.n, 2*time.Minute)
		total += ph.n
	}

	calls := railCalls(t, st)
	seen := map[string]int{}
	for _, ph := range phases {
		rows := payoutRows(t, st, ph.prefix)
		entries := ledger(t, st, ph.prefix)
		for id, r := range rows {
			c := calls[id]
			if len(c) != 1 {
				t.Errorf("%s reached the rail %d times, want exactly once", id, len(c))
				continue
			}
			call := c[0]
			var want string
			switch {
			case call.Result == "DECLINED":
				want = lockapi.StatusDeclined
			case call.Dropped, time.Duration(call.LatencyMs)*time.Millisecond > readTimeout:
				want = lockapi.StatusAmbiguous
			default:
				want = lockapi.StatusPaid
			}
			seen[want]++
			if call.Dropped {
				seen["dropped"]++
			}
			if r.status != want {
				t.Errorf("%s is %s; the rail's log (%+v) says it should be %s", id, r.status, call, want)
			}
			e := entries[id]
			if want == lockapi.StatusPaid {
				if len(e) != 1 || e[0].amount != -r.amount || r.railReference == nil || *r.railReference != call.RailReference {
					t.Errorf("%s: PAID with reference %v and ledger %+v; the rail says %q", id, r.railReference, e, call.RailReference)
				}
			} else if len(e) != 0 {
				t.Errorf("%s is %s but has ledger entries %+v", id, want, e)
			}
			// One forwardable attempt, resolved as the rail behaved.
			fw := 0
			for _, a := range attempts(t, st, id) {
				if a.outcome != nil && (*a.outcome == lockapi.OutcomeAcked || *a.outcome == lockapi.OutcomeRejected || *a.outcome == lockapi.OutcomeTimeout) {
					fw++
				}
			}
			if fw != 1 {
				t.Errorf("%s has %d forwardable attempts, want 1: %v", id, fw, attempts(t, st, id))
			}
		}
	}
	if len(calls) != total {
		t.Errorf("the rail saw %d distinct payouts, want %d", len(calls), total)
	}
	// The test means something only if every kind of chaos happened.
	if seen["dropped"] == 0 || seen[lockapi.StatusDeclined] == 0 || seen[lockapi.StatusPaid] == 0 ||
		seen[lockapi.StatusAmbiguous] <= seen["dropped"] {
		t.Errorf("chaos mix %v: want drops, slow replies, declines and payments", seen)
	}
}

// An executor killed (SIGKILL) with a payout CLAIMED; the
// reconcile pass of another executor settles it.
func TestKilledExecutorsClaimIsReconciled(t *testing.T) {
	t.Parallel()

	// Killed between claim and submit: nothing reached the rail, so the reconcile
	// pass submits under a new token.
	t.Run("before submitting", func(t *testing.T) {
		t.Parallel()
		st, _ := startStack(t, nil)
		p := createPayouts(t, st, "k1", 1, 1)[0]
		child := startChildExecutor(t, st, map[string]string{
			"EXECUTOR_PAUSE_PROBABILITY": "1",
			"EXECUTOR_PAUSE":             "10m",
		})
		testkit.EventuallyState(t, 30*time.Second, "the doomed executor to claim P", func() (bool, string) {
			r := payout(t, st, p.PayoutID)
			return r.status == lockapi.StatusClaimed, r.status
		})
		t1 := payout(t, st, p.PayoutID).fenceToken
		child.Kill()
		r := startExecutor(t, st, "rescuer", func(c *executor.Config) { c.LeaseTTL = time.Second })
		waitSettled(t, st, "k1", 1, 30*time.Second)
		r.stop(t)
		row := checkPaidOnce(t, st, p.PayoutID)
		as := attempts(t, st, p.PayoutID)
		if len(as) != 1 || as[0].owner != "rescuer" || as[0].token != row.fenceToken || row.fenceToken <= t1 {
			t.Fatalf("attempts %v, P's token %d (doomed claimed with %d); want one ACKED attempt by the rescuer with a newer token", as, row.fenceToken, t1)
		}
	})

	// Killed while its submission was in flight: the proxy finishes the call and
	// records the outcome; the reconcile pass adopts it and submits nothing.
	t.Run("while submitting", func(t *testing.T) {
		t.Parallel()
		st, _ := startStack(t, map[string]map[string]string{
			"rail-proxy": {"RAIL_READ_TIMEOUT": "10s"},
			"rail-stub":  {"RAIL_STUB_LATENCY_MS": "1500"},
		})
		p := createPayouts(t, st, "k2", 1, 1)[0]
		child := startChildExecutor(t, st, nil)
		testkit.EventuallyState(t, 30*time.Second, "the doomed executor's submission to be in flight", func() (bool, string) {
			as := attempts(t, st, p.PayoutID)
			return len(as) == 1 && as[0].outcome == nil, fmt.Sprint(as)
		})
		child.Kill()
		testkit.EventuallyState(t, 30*time.Second, "the proxy to resolve the orphaned attempt", func() (bool, string) {
			as := attempts(t, st, p.PayoutID)
			return len(as) == 1 && as[0].outcome != nil, fmt.Sprint(as)
		})
		if r := payout(t, st, p.PayoutID); r.status != lockapi.StatusClaimed {
			t.Fatalf("P is %s after its executor died mid-flight, want CLAIMED", r.status)
		}
		r := startExecutor(t, st, "rescuer", func(c *executor.Config) { c.LeaseTTL = time.Second })
		waitSettled(t, st, "k2", 1, 30*time.Second)
		testkit.EventuallyState(t, 10*time.Second, "the rescuer to count the adopted payment", func() (bool, string) {
			return paidCount(t, r, "paid") == 1, ""
		})
		r.stop(t)
		checkPaidOnce(t, st, p.PayoutID)
		as := attempts(t, st, p.PayoutID)
		if len(as) != 1 || as[0].owner != "doomed" || as[0].outcome == nil || *as[0].outcome != lockapi.OutcomeAcked {
			t.Fatalf("attempts %v, want only the doomed executor's, ACKED", as)
		}
	})
}

func startChildExecutor(t *testing.T, st stackT, extra map[string]string) interface{ Kill() } {
	t.Helper()
	env := st.ServiceURLs()
	maps.Copy(env, st.WorkloadEnv(identity.NameExecutor))
	for k, v := range map[string]string{
		"EXECUTOR_ADDR":          "127.0.0.1:0",
		"EXECUTOR_OWNER_ID":      "doomed",
		"EXECUTOR_WORKERS":       "1",
		"EXECUTOR_LEASE_TTL":     "1s",
		"EXECUTOR_POLL_INTERVAL": "50ms",
		"LOG_LEVEL":              "debug",
	} {
		env[k] = v
	}
	for k, v := range extra {
		env[k] = v
	}
	c, err := st.StartChild(context.Background(), "executor", env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Kill)
	return c
}
