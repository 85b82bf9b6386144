package hatest

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/invariants"
	"lock.dev/internal/patroni"
	"lock.dev/internal/railstub"
	"lock.dev/internal/testkit"
)

// The control: the same kill of the leader under load, on a cluster whose
// replication is asynchronous (Patroni's synchronous_mode off, any lag allowed
// on failover) — the configuration docs/operations/high-availability.md warns
// against. The leader's WAL senders are held; payouts created now, on an
// account of their own, exist on the leader alone, and one of them reaches the
// rail: its intent row and mark, its payout row and its lease's grant were all
// acknowledged and none reached the replica. Then the leader is killed and
// Patroni promotes the replica. The checker must say so — proof that the
// checks of the tests above can fail, and that the guarantee rests on
// synchronous replication. The cluster is the control's own (two members) and
// is removed at the end.
func TestControlAsyncFailoverIsCaught(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var logs strings.Builder
	opts := clusterOptions
	opts.Nodes, opts.Async, opts.Log = 2, true, &logs
	async, err := patroni.Start(ctx, opts)
	if err != nil {
		t.Fatalf("start an asynchronous Patroni cluster: %v\n%s", err, logs.String())
	}
	t.Cleanup(func() {
		if err := async.Stop(); err != nil {
			t.Errorf("stop the asynchronous cluster: %v", err)
		}
	})
	r := startLoad(t, ctx, async)

	grantsBefore := r.grants()
	leader, release, err := async.HoldReplication(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	held := r.create("held", 4, func(int) string { return "acct-held" })
	deadline, _ := ctx.Deadline()
	testkit.Eventually(t, time.Until(deadline), "a payout created while replication is held to reach the rail", func() bool {
		return slices.ContainsFunc(r.railCalls(), func(c railstub.Call) bool { return slices.Contains(held, c.Reference) })
	})
	fault := time.Now()
	if err := async.Kill(ctx, leader.Name); err != nil {
		t.Fatal(err)
	}
	newLeader, err := async.WaitLeader(ctx, leader.Name)
	if err != nil {
		t.Fatal(err)
	}
	recovered := time.Now()

	f := r.finish(fault, recovered, grantsBefore)
	rep := f.report
	if rep.OK() {
		t.Fatal("the checker found nothing after an asynchronous failover that lost acknowledged commits")
	}
	caught := rep.Count(invariants.CheckCallWithoutIntent) + rep.Count(invariants.CheckTokenIssuedTwice) +
		rep.Count(invariants.CheckTokenWithoutGrant) + rep.Count(invariants.CheckStaleAdmission)
	if caught == 0 {
		t.Errorf("no rail call without an intent row, no token handed out twice or lost, no stale admission; only:\n%s", rep.ViolationsText())
	}
	t.Logf("violations after the asynchronous failover from %s to %s (as expected):\n%s", leader.Name, newLeader.Name, rep.ViolationsText())
	logFigures(t, "control: kill -9 of leader "+leader.Name+" on an asynchronous cluster", f)
}
