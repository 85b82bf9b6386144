package hatest

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// etcd, Patroni's store, is lost under load. A leader that cannot renew its key
// demotes itself once retry_timeout runs out: its PostgreSQL restarts read-only,
// and every member is then a standby — no server accepts writes. The services
// must answer 503 within their bounds and write nothing: rail-proxy refuses a
// payout claimed while the cluster was healthy with RAIL_UNAVAILABLE stage
// intent_commit and leaves no row (nothing could be written), and the rail is
// presented nothing admitted after the demotion. Once etcd is back Patroni
// elects a leader again, the system pays on, and the checker judges the run.
func TestEtcdLostUnderLoad(t *testing.T) {
	requireHealthy(t, cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := startLoad(t, ctx, cluster)
	grantsBefore := r.grants()
	hand := claimByHand(t, ctx, r, "hand-etcd")
	leader, err := cluster.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}

	fault := time.Now()
	t.Cleanup(func() { // a test that fails half-way leaves etcd running for the next one
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = cluster.StartEtcd(ctx) // refused when it runs
	})
	if err := cluster.StopEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	// The leader demotes itself; then no member accepts writes.
	testkit.EventuallyState(t, 2*time.Minute, "every member read-only", func() (bool, string) {
		for _, m := range cluster.Names() {
			var inRecovery bool
			if err := queryMember(ctx, cluster, m, "postgres", `SELECT pg_is_in_recovery()`, nil, &inRecovery); err != nil {
				return false, fmt.Sprintf("%s: %v", m, err)
			}
			if !inRecovery {
				return false, m + " accepts writes"
			}
		}
		return true, ""
	})
	demoted := time.Now()

	got := hand.submit(t, ctx, r.st)
	lockAns, payAns := probeWrites(t, ctx, r.st, "probe-etcd")
	for _, p := range []struct {
		what string
		a    answered
		code string
	}{{"rail-proxy", got, lockapi.CodeRailUnavailable}, {"lock-server", lockAns, lockapi.CodeUnavailable}, {"payment-resource", payAns, lockapi.CodeUnavailable}} {
		if p.a.status != http.StatusServiceUnavailable || p.a.code != p.code {
			t.Errorf("%s with every member read-only answered %d %s (%v); want 503 %s", p.what, p.a.status, p.a.code, p.a.err, p.code)
		}
	}
	if got.stage != "intent_commit" {
		t.Errorf("rail-proxy's 503 has stage %q; want intent_commit", got.stage)
	}
	// Nothing was written: no server could take it (read on the demoted leader).
	var rows int
	if err := queryMember(ctx, cluster, leader.Name, databaseOf(t, r.st.PaydbURL),
		`SELECT count(*)::int FROM rail_submission WHERE payout_id = $1`, []any{hand.payout.PayoutID}, &rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("%d rail_submission rows for %s, refused while every member was read-only; want none", rows, hand.payout.PayoutID)
	}
	if n := len(callsFor(railCalls(t, ctx, r.st), hand.payout.PayoutID)); n != 0 {
		t.Fatalf("the rail was presented %s %d times while no member accepted writes", hand.payout.PayoutID, n)
	}

	back := time.Now()
	if err := cluster.StartEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	recovered := waitAcknowledged(t, ctx, cluster)
	newLeader, err := cluster.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	requireAdmittedBefore(t, ctx, r.st, demoted, back)
	hand.handOver(t, ctx, r)
	r.create("probe-etcd", 1, func(int) string { return "acct-probe-etcd" })

	f := r.finish(fault, recovered, grantsBefore)
	requireEveryInvariant(t, f)
	requirePresentedOnceAfter(t, ctx, r, hand)
	unavailable := unavailableBy(r.st, demoted, back)
	firstToken, firstCall := firstWrites(t, ctx, r.st, back)
	logFigures(t, "etcd stopped (leader "+leader.Name+"), "+newLeader.Name+" leads after", f)
	t.Logf("etcd stopped → every member read-only %s; rail-proxy 503 %s stage %s after %s, lock-server 503 after %s, payment-resource 503 after %s; "+
		"503s while read-only: lock-server %d, payment-resource %d, rail-proxy %d; etcd started (down %s) → writes acknowledged %s, "+
		"→ first token handed out %s, → first rail call %s",
		demoted.Sub(fault).Round(time.Millisecond), got.code, got.stage, got.took.Round(time.Millisecond), lockAns.took.Round(time.Millisecond),
		payAns.took.Round(time.Millisecond), unavailable["lock-server"], unavailable["payment-resource"], unavailable["rail-proxy"],
		back.Sub(fault).Round(time.Millisecond), recovered.Sub(back).Round(time.Millisecond), since(back, firstToken), since(back, firstCall))
	requireHealthy(t, cluster)
}
