package railproxy

import (
	"context"
	"net/http"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// interruptWindow is interrupt_at − submitted_at of a payout's rows, nil for a
// row that has none.
func interruptWindow(t *testing.T, db dbq, payoutID string) []*time.Duration {
	t.Helper()
	rs, err := db.Query(context.Background(), `SELECT (extract(epoch FROM interrupt_at - submitted_at) * 1000)::bigint
	  FROM rail_submission WHERE payout_id = $1 ORDER BY submission_id`, payoutID)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []*time.Duration
	for rs.Next() {
		var ms *int64
		if err := rs.Scan(&ms); err != nil {
			t.Fatal(err)
		}
		if ms == nil {
			out = append(out, nil)
			continue
		}
		d := time.Duration(*ms) * time.Millisecond
		out = append(out, &d)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Replicas with different timeouts on one paydb. Replica A reads the rail for up
// to 30 s (so its RAIL_PROXY_INTERRUPTED_AFTER is 37 s); replica B has the
// default timeouts and the shortest bound they allow (9 s), and sweeps every 100
// ms. The rail holds A's call for 10 s — past B's own bound. B's janitor judges
// the row by the interrupt_at A gave it, not by its own bound, so A's call ends
// ACKED, never TIMEOUT. FENCED rows carry no interrupt_at.
func TestReplicasKeepTheirOwnInterruptAt(t *testing.T) {
	t.Parallel()
	hold := newHoldingRail(t)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	slow := testConfig(dbURL, hold.URL)
	slow.RailReadTimeout = 30 * time.Second
	slow.InterruptedAfter = slow.InFlightBound() + InterruptMargin
	slow.JanitorInterval = 100 * time.Millisecond
	quick := testConfig(dbURL, hold.URL)
	quick.InterruptedAfter = quick.InFlightBound() + InterruptMargin
	quick.JanitorInterval = 100 * time.Millisecond
	a := startProxy(t, slow)
	b := startProxy(t, quick)

	done := make(chan answer, 1)
	go func() { done <- trySubmit(a.URL, 5, newPayout("p-slow", "acct-slow")) }()
	hold.waitCalls(t, 1)
	if w := interruptWindow(t, db, "p-slow"); len(w) != 1 || w[0] == nil ||
		*w[0] < slow.InterruptedAfter-50*time.Millisecond || *w[0] > slow.InterruptedAfter+50*time.Millisecond {
		t.Fatalf("interrupt_at − submitted_at of A's intent: %v, want A's own %s", w, slow.InterruptedAfter)
	}
	if f := submit(t, b.URL, 5, newPayout("p-slow-replay", "acct-slow")); f.code() != lockapi.CodeFencedOut {
		t.Fatalf("replay: %+v", f)
	}
	if w := interruptWindow(t, db, "p-slow-replay"); len(w) != 1 || w[0] != nil {
		t.Fatalf("a FENCED row has interrupt_at %v, want NULL", w)
	}

	time.Sleep(quick.InterruptedAfter + time.Second) // B's janitor sweeps all along
	if rs := rowsOf(t, db, "p-slow"); len(rs) != 1 || rs[0].Outcome != nil {
		t.Fatalf("A's call, still in flight, was resolved: %+v", rs)
	}
	hold.release()
	ans := <-done
	if ans.Status != http.StatusOK || ans.str("railReference") != "RS-p-slow" {
		t.Fatalf("A's answer: %+v", ans)
	}
	if rs := rowsOf(t, db, "p-slow"); len(rs) != 1 || outcomeOf(rs[0]) != "ACKED" {
		t.Fatalf("rows: %+v", rs)
	}
	for name, p := range map[string]*proxy{"A": a, "B": b} {
		if ev := p.Logs.events("rail_ambiguous"); len(ev) != 0 {
			t.Errorf("replica %s logged rail_ambiguous: %v", name, ev)
		}
	}
}
