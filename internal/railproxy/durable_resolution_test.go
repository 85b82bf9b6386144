package railproxy

import (
	"context"
	"net/http"
	"testing"

	"lock.dev/internal/pgcluster"
	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// For the resolving write: it runs with synchronous_commit
// raised whatever paydb's default (here lowered to off), so its commit waits for
// the synchronous standby; when that wait is cancelled, the outcome — committed on
// the primary only — is logged as such (resolution_not_durable), the caller gets
// the rail's answer, and nothing is written twice or mistaken for another
// writer's resolution. The same whatever client_min_messages the role, the
// database or the URL sets (pgtest.QuietPlaces): at error PostgreSQL would not
// send the cancelled-wait warning, so the resolving write raises it.
func TestResolutionWaitsForTheStandbyAndSaysWhenItWasCancelled(t *testing.T) {
	pair := pgtest.Pair(t, pgcluster.PairOptions{Sync: true})
	pool := pgtest.Pool(t, pair.URL("paydb"))
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "ALTER DATABASE paydb SET synchronous_commit = off"); err != nil {
		t.Fatal(err)
	}
	for _, quiet := range pgtest.QuietPlaces {
		paydbURL := pgtest.Quiet(t, pair, "paydb", quiet)
		for _, maxGroup := range []int{1, 64} {
			hold := newHoldingRail(t)
			cfg := testConfig(paydbURL, hold.URL)
			cfg.MaxGroup = maxGroup
			px := startProxy(t, cfg)
			p := newPayout("p-resolve-"+quiet+"-"+map[int]string{1: "one", 64: "group"}[maxGroup], "acct-resolve-"+quiet)
			done := make(chan answer, 1)
			go func() { done <- trySubmit(px.URL, int64(maxGroup), p) }()
			hold.waitCalls(t, 1) // admitted and committed: the rail holds the call
			if err := pair.HoldStandby(); err != nil {
				t.Fatal(err)
			}
			hold.release()
			a := cancelSyncWait(t, pair, done) // the resolving write's commit waits for the standby
			if a.Err != nil || a.Status != http.StatusOK || a.str("railReference") != "RS-"+p.PayoutID {
				t.Fatalf("quiet %s, max group %d: answer %d %v %v; want 200 ACKED", quiet, maxGroup, a.Status, a.Body, a.Err)
			}
			rs, err := tryRowsOf(pool, p.PayoutID)
			if err != nil || len(rs) != 1 || outcomeOf(rs[0]) != lockapi.OutcomeAcked {
				t.Fatalf("quiet %s, max group %d: rows %+v %v; want one ACKED", quiet, maxGroup, rs, err)
			}
			if n := len(px.Logs.events("resolution_not_durable")); n != 1 {
				t.Errorf("quiet %s, max group %d: %d resolution_not_durable events, want 1", quiet, maxGroup, n)
			}
			for series, want := range map[string]float64{
				`rail_submission_total{outcome="acked"}`: 1,
				"rail_resolution_late_total":             0,
			} {
				if v := metric(t, px, series); v != want {
					t.Errorf("quiet %s, max group %d: %s = %v, want %v", quiet, maxGroup, series, v, want)
				}
			}
			if err := px.Stop(); err != nil {
				t.Fatal(err)
			}
		}
	}
}
