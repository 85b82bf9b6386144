package hatest

import (
	"context"
	"testing"
	"time"
)

// A planned switchover under load: `patronictl switchover --force` hands the
// leadership to the synchronous standby while the system pays. The old leader
// stops (its fast shutdown ends commits waiting for the standby, which the
// services must not take for acknowledged), the standby is promoted, the old
// leader rejoins as a standby, and the checker judges the ground truth: every
// invariant holds, no token handed out twice or below an earlier one, no
// lock_grant row forgotten.
func TestSwitchoverUnderLoad(t *testing.T) {
	requireHealthy(t, cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := startLoad(t, ctx, cluster)

	leader, err := cluster.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sync, err := cluster.SyncStandby(ctx)
	if err != nil {
		t.Fatal(err)
	}
	grantsBefore := r.grants()
	fault := time.Now()
	// Switchover returns once the candidate leads and commits a write.
	if err := cluster.Switchover(ctx, sync.Name); err != nil {
		t.Fatal(err)
	}
	recovered := time.Now()

	f := r.finish(fault, recovered, grantsBefore)
	requireEveryInvariant(t, f)
	logFigures(t, "switchover from "+leader.Name+" to "+sync.Name, f)
	requireHealthy(t, cluster)
}
