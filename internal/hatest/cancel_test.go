package hatest

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"lock.dev/internal/identity"
	"lock.dev/internal/patroni"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// A commit whose wait for the synchronous standby was cancelled, then a restart
// of the only member that has it, under load.
//
// With the leader alone (both standbys stopped) a submission's admission COMMIT
// waits. rail-proxy bounds its admission to 2 s; at the bound pgx drops the
// connection with a cancel request, which ends the wait: PostgreSQL has
// committed the intent locally and only warns (docs/operations/high-availability.md).
// rail-proxy must answer 503 RAIL_UNAVAILABLE stage intent_commit, present
// nothing, and resolve the row it cannot vouch for UNSENT — a write whose COMMIT
// waits and is cancelled the same way (docs/contracts/rail-proxy.md, "When paydb
// cannot take the attempt" and "Resolution").
//
// Then the old primary is stopped, and the standbys — which lack that commit —
// are started while it is down: in strict synchronous mode Patroni must not
// promote either (only the last leader and its synchronous standby may, and the
// leader had none). The old primary is started again and leads; the row
// reappears on it and reaches both standbys; the rail never saw that attempt.
// The payout, an UNSENT attempt on record, is the executors' once its lease is
// released: presented once with a newer token. The checker judges the run.
func TestCancelledSyncWaitThenOldPrimaryRestarted(t *testing.T) {
	requireHealthy(t, cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := startLoad(t, ctx, cluster)
	grantsBefore := r.grants()
	hand := claimByHand(t, ctx, r, "hand-cancel")
	paydb := databaseOf(t, r.st.PaydbURL)

	a := leaveLeaderAlone(t, ctx, cluster)
	got := hand.submit(t, ctx, r.st)
	if got.status != http.StatusServiceUnavailable || got.code != lockapi.CodeRailUnavailable || got.stage != "intent_commit" {
		t.Fatalf("submission with the leader alone answered %d %s stage %q; want 503 %s stage intent_commit",
			got.status, got.code, got.stage, lockapi.CodeRailUnavailable)
	}
	// The cancelled wait left the intent committed on the leader alone, and
	// rail-proxy's UNSENT write after it too.
	var onLeader attempt
	testkit.EventuallyState(t, time.Minute, "the refused attempt on the leader, resolved", func() (bool, string) {
		var err error
		onLeader, err = attemptOn(ctx, cluster, a.leader, paydb, hand.payout.PayoutID)
		if err != nil {
			return false, err.Error()
		}
		return onLeader.outcome != "", onLeader.String()
	})
	if onLeader.outcome != lockapi.OutcomeUnsent || onLeader.token != hand.lease.Token() {
		t.Errorf("the refused attempt on the leader alone: %s; want UNSENT with token %d", onLeader, hand.lease.Token())
	}
	if n := len(callsFor(railCalls(t, ctx, r.st), hand.payout.PayoutID)); n != 0 {
		t.Fatalf("the rail was presented %s %d times; its admission was never durable", hand.payout.PayoutID, n)
	}
	// That UNSENT write is on the leader alone too, and rail-proxy says so: its
	// COMMIT's wait was cancelled at its bound, and the check that it reached a
	// standby fails while there is none.
	testkit.EventuallyState(t, time.Minute, "resolution_not_durable for the refused attempt", func() (bool, string) {
		for _, l := range r.logs.Events("resolution_not_durable") {
			if id, _ := l["submissionId"].(float64); int64(id) == onLeader.id && l["outcome"] == lockapi.OutcomeUnsent {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d resolution_not_durable lines, none for submission %d", len(r.logs.Events("resolution_not_durable")), onLeader.id)
	})
	notDurable, err := r.st.ReadMetric(ctx, identity.NameRailProxy, "rail_resolution_not_durable_total")
	if err != nil {
		t.Fatal(err)
	}

	// The old primary goes down; the standbys, which never got the commit, come
	// back while it is down. Neither may take over.
	stopped := time.Now()
	if err := cluster.StopMember(ctx, a.leader); err != nil {
		t.Fatal(err)
	}
	for _, n := range a.standbys {
		if err := cluster.StartMember(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	// Patroni decides once every loop_wait: from the moment both run, watch two
	// full loops and then some.
	var watchUntil time.Time
	for deadline := time.Now().Add(time.Minute); watchUntil.IsZero() || time.Now().Before(watchUntil); time.Sleep(200 * time.Millisecond) {
		ms, err := cluster.Members(ctx) // an error: no member answers yet
		if l, ok := leaderOf(ms); ok {
			t.Fatalf("%s was promoted while the old primary, the only member with the cancelled commit, was down: %v", l.Name, ms)
		}
		if watchUntil.IsZero() && err == nil && running(ms, a.standbys) {
			watchUntil = time.Now().Add(2*clusterOptions.LoopWait + time.Second)
		}
		if watchUntil.IsZero() && time.Now().After(deadline) {
			t.Fatalf("the standbys did not run within a minute: %v (%v)", ms, err)
		}
	}

	if err := cluster.StartMember(ctx, a.leader); err != nil {
		t.Fatal(err)
	}
	recovered := waitAcknowledged(t, ctx, cluster)
	l, err := cluster.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Name != a.leader {
		t.Errorf("%s leads after the restart; want the old primary %s", l.Name, a.leader)
	}
	// The commit reappears on the leader and reaches every standby; still no
	// rail call for the payout.
	for _, m := range cluster.Names() {
		testkit.EventuallyState(t, time.Minute, "the refused attempt on "+m, func() (bool, string) {
			at, err := attemptOn(ctx, cluster, m, paydb, hand.payout.PayoutID)
			if err != nil {
				return false, err.Error()
			}
			return at == onLeader, at.String()
		})
	}
	if n := len(callsFor(railCalls(t, ctx, r.st), hand.payout.PayoutID)); n != 0 {
		t.Fatalf("the rail was presented %s %d times before its lease was handed over", hand.payout.PayoutID, n)
	}
	hand.handOver(t, ctx, r)

	f := r.finish(a.at, recovered, grantsBefore)
	requireEveryInvariant(t, f)
	requirePresentedOnceAfter(t, ctx, r, hand)
	// Resolved by rail-proxy itself, the refused attempt was never an intent
	// left for the janitor: the reconciler's last pass saw none overdue.
	overdue, err := r.rec.Metric(ctx, "reconciler_overdue_intents")
	if err != nil {
		t.Fatal(err)
	}
	if overdue != 0 {
		t.Errorf("reconciler_overdue_intents %v at the end; want 0", overdue)
	}
	logFigures(t, "leader "+a.leader+" alone, a cancelled commit, the old primary restarted", f)
	t.Logf("rail-proxy 503 %s stage %s after %s; the refused attempt on the leader alone: %s; rail_resolution_not_durable_total %v; "+
		"old primary stopped → leading again, writes acknowledged %s; no standby promoted meanwhile",
		got.code, got.stage, got.took.Round(time.Millisecond), onLeader, notDurable, recovered.Sub(stopped).Round(time.Millisecond))
	requireHealthy(t, cluster)
}

// attempt is the one rail_submission row of a payout on one member.
type attempt struct {
	id, token int64
	outcome   string // "" unresolved
}

func (a attempt) String() string {
	o := a.outcome
	if o == "" {
		o = "unresolved"
	}
	return fmt.Sprintf("submission %d token %d %s", a.id, a.token, o)
}

// attemptOn reads payoutID's one rail_submission row on member; an error when
// there is not exactly one.
func attemptOn(ctx context.Context, c *patroni.Cluster, member, db, payoutID string) (attempt, error) {
	var a attempt
	var n int
	err := queryMember(ctx, c, member, db, `SELECT count(*)::int, coalesce(max(submission_id), 0), coalesce(max(presented_token), 0),
		coalesce(max(outcome), '') FROM rail_submission WHERE payout_id = $1`, []any{payoutID}, &n, &a.id, &a.token, &a.outcome)
	if err != nil {
		return a, err
	}
	if n != 1 {
		return a, fmt.Errorf("%d rail_submission rows for %s on %s", n, payoutID, member)
	}
	return a, nil
}

// leaderOf is the member that leads, if one does.
func leaderOf(ms []patroni.Member) (patroni.Member, bool) {
	for _, m := range ms {
		if m.Role == "leader" {
			return m, true
		}
	}
	return patroni.Member{}, false
}

// running: every one of names is a running member.
func running(ms []patroni.Member, names []string) bool {
	n := 0
	for _, m := range ms {
		if slices.Contains(names, m.Name) && (m.State == "running" || m.State == "streaming") {
			n++
		}
	}
	return n == len(names)
}
