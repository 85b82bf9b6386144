package hatest

import (
	"context"
	"testing"
	"time"
)

// The leader's machine dies under load. The system runs on the cluster; the
// leader's WAL senders are held until a commit waits for the synchronous
// standby (a commit in flight, neither acknowledged nor refused), then the
// leader's Patroni and every PostgreSQL process are killed with SIGKILL.
// Patroni promotes the synchronous standby once the leader key expires, the
// services follow through the multi-host URL, more payouts are created and
// paid, and the checker judges the ground truth: every invariant holds, no
// token was handed out twice or below an earlier one, no lock_grant row was
// forgotten, no stale submission was admitted. The killed member then rejoins
// (pg_rewind) and the cluster is healthy again for the next test.
func TestKillLeaderUnderLoad(t *testing.T) {
	requireHealthy(t, cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := startLoad(t, ctx, cluster)

	sync, err := cluster.SyncStandby(ctx)
	if err != nil {
		t.Fatal(err)
	}
	grantsBefore := r.grants()
	leader, release, err := cluster.HoldReplication(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if err := cluster.WaitCommitWaiting(ctx, leader.Name); err != nil {
		t.Fatal(err)
	}
	fault := time.Now()
	// Should the test stop early, the killed member still rejoins, so that the
	// next test finds the cluster whole (a running member refuses the start).
	t.Cleanup(func() { _ = cluster.StartMember(context.Background(), leader.Name) })
	if err := cluster.Kill(ctx, leader.Name); err != nil {
		t.Fatal(err)
	}
	newLeader, err := cluster.WaitLeader(ctx, leader.Name)
	if err != nil {
		t.Fatal(err)
	}
	recovered := time.Now()
	if newLeader.Name != sync.Name {
		t.Errorf("Patroni promoted %s, not the synchronous standby %s", newLeader.Name, sync.Name)
	}
	// The killed member rejoins while the run goes on.
	if err := cluster.StartMember(ctx, leader.Name); err != nil {
		t.Fatal(err)
	}

	f := r.finish(fault, recovered, grantsBefore)
	requireEveryInvariant(t, f)
	logFigures(t, "kill -9 of leader "+leader.Name+", "+newLeader.Name+" promoted", f)
	requireHealthy(t, cluster)
}
