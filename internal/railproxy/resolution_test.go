package railproxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"lock.dev/internal/pgcluster"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/serve"
	"lock.dev/lockapi"
)

// A COMMIT whose answer was lost and that lands between the background
// resolving write's lookup (no row) and its question to the backend (past its
// transaction?) is not taken for one that never happened: the row is resolved
// UNSENT — what the caller was told, nothing presented — counted once, late.
// The intent is inserted by a transaction the test holds open on a real paydb
// backend; the test seam afterNoRow commits it right after a lookup found no
// row, so the COMMIT lands exactly in that window.
func TestLostCommitLandingAfterTheLookupIsResolved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	store, err := OpenStore(ctx, dbURL, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)

	// The admission transaction whose COMMIT's answer was lost: its backend
	// holds it open (idle in transaction) until the hook commits it.
	conn, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := conn.QueryRow(ctx, `INSERT INTO rail_submission
	        (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency, beneficiary, interrupt_at)
	 VALUES ('p-late-commit', 'acct-late', 1, 'worker-1', 'p-late-commit:1', 125000, 'EUR', 'NL91ABNA0417164300',
	         clock_timestamp() + interval '1 minute')
	 RETURNING submission_id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	pid := conn.Conn().PgConn().PID()

	logs := &syncBuffer{}
	logger, err := serve.NewLogger(logs, "rail-proxy", "debug")
	if err != nil {
		t.Fatal(err)
	}
	var (
		landed  atomic.Bool
		hookErr = make(chan error, 1)
	)
	a := &admitter{store: store, metrics: newMetrics(prometheus.NewRegistry(), true, false), logger: logger,
		interruptAfter: 20 * time.Second,
		hooks: &hooks{afterNoRow: func(res resolution) {
			if res.id != id || landed.Swap(true) {
				return
			}
			// The lost COMMIT lands now: after the lookup found no row.
			if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
				hookErr <- err
			}
		}}}
	sub := Submission{PayoutID: "p-late-commit", AccountID: "acct-late", Token: 1}
	a.resolveLater(sub, resolution{id: id, outcome: lockapi.OutcomeUnsent, unsureBackend: pid}, time.Now(), metricUnavailable, nil)

	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { a.active.Wait(); close(done) }()
	select {
	case <-done:
	case <-wctx.Done():
		t.Fatal("the background resolving write never ended")
	}
	select {
	case err := <-hookErr:
		t.Fatalf("committing the held intent: %v", err)
	default:
	}
	if !landed.Load() {
		t.Fatal("the COMMIT never landed: no lookup found the row missing")
	}
	rs := rowsOf(t, db, "p-late-commit")
	if len(rs) != 1 || outcomeOf(rs[0]) != lockapi.OutcomeUnsent {
		t.Fatalf("rows %+v: want the intent resolved UNSENT (the caller was told nothing was presented), not left to the janitor", rs)
	}
	if ev := logs.filter(func(m map[string]any) bool {
		msg, _ := m["msg"].(string)
		return strings.Contains(msg, "does not exist")
	}); len(ev) != 0 {
		t.Errorf("the intent was taken for never written: %v", ev)
	}
	if v := counterValue(t, a.metrics.lateResolutions); v != 1 {
		t.Errorf("rail_resolution_late_total = %v, want 1", v)
	}
	if v := counterValue(t, a.metrics.submissions.WithLabelValues(metricUnavailable)); v != 1 {
		t.Errorf(`rail_submission_total{outcome="unavailable"} = %v, want 1`, v)
	}
}

// Through the running service: an admission COMMIT whose answer is lost and
// that lands only while the proxy resolves it in the background — right after a
// lookup found no row — leaves the caller's answer (503 intent_commit: nothing
// presented) and the audit trail in agreement: the row is UNSENT, counted once,
// and the payout is admitted again with a newer token (not refused as a
// duplicate of an intent the janitor would have made TIMEOUT).
func TestLateLostCommitAnswerAndAuditRowAgree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	fwd, viaURL := newPGForwarder(t, dbURL)
	cfg := testConfig(viaURL, rail.URL)

	type armed struct {
		logs    *syncBuffer
		release func()
	}
	var (
		ready   atomic.Pointer[armed] // set before the submission
		landed  atomic.Bool
		hookErr = make(chan error, 1)
	)
	cfg.hooks = &hooks{afterNoRow: func(res resolution) {
		r := ready.Load()
		if r == nil || res.unsureBackend == 0 || len(r.logs.filter(func(m map[string]any) bool {
			msg, _ := m["msg"].(string)
			return strings.HasPrefix(msg, "resolving write failed; retrying it in the background")
		})) == 0 || landed.Swap(true) {
			return
		}
		// The background write's lookup found no row: the held COMMIT lands now,
		// and the hook returns once the row is committed and its backend past it.
		r.release()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		for {
			var n int
			var over bool
			err := db.QueryRow(wctx, `SELECT (SELECT count(*) FROM rail_submission WHERE submission_id = $1), `+
				`NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $2 AND state IS DISTINCT FROM 'idle')`,
				res.id, int64(res.unsureBackend)).Scan(&n, &over)
			if err != nil {
				hookErr <- err
				return
			}
			if n == 1 && over {
				return
			}
			select {
			case <-wctx.Done():
				hookErr <- errors.New("the released COMMIT did not land")
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}}
	p := startProxy(t, cfg)
	release := fwd.armHold()
	t.Cleanup(release)
	ready.Store(&armed{logs: p.Logs, release: release})

	a := submit(t, p.URL, 1, newPayout("p-late", "acct-late"))
	if a.Status != http.StatusServiceUnavailable || a.code() != lockapi.CodeRailUnavailable || a.str("stage") != "intent_commit" {
		t.Fatalf("answer: %+v", a)
	}
	eventually(t, 30*time.Second, "the background resolving write to end", func() bool {
		return len(p.Logs.filter(func(m map[string]any) bool {
			msg, _ := m["msg"].(string)
			return m["late"] == true || strings.Contains(msg, "does not exist") || strings.HasPrefix(msg, "resolving write still failing")
		})) > 0
	})
	select {
	case err := <-hookErr:
		t.Fatalf("hook: %v", err)
	default:
	}
	if !landed.Load() {
		t.Fatal("the COMMIT never landed in the background write's window")
	}
	rs := rowsOf(t, db, "p-late")
	if len(rs) != 1 || outcomeOf(rs[0]) != lockapi.OutcomeUnsent {
		t.Fatalf("rows %+v: the caller was told nothing was presented; want the row UNSENT", rs)
	}
	for series, want := range map[string]float64{
		`rail_submission_total{outcome="unavailable"}`: 1,
		"rail_resolution_late_total":                   1,
	} {
		if v := metric(t, p, series); v != want {
			t.Errorf("%s = %v, want %v", series, v, want)
		}
	}
	if c := rail.calls(t); len(c) != 0 {
		t.Fatalf("rail calls: %+v", c)
	}
	if a := submit(t, p.URL, 2, newPayout("p-late", "acct-late")); a.Status != http.StatusOK {
		t.Fatalf("resubmission with a newer token: %+v; want 200 (nothing was presented)", a)
	}
}

// A resolving write whose COMMIT waits for a stalled synchronous standby past
// the write's deadline: the deadline gives up on the answer, and the cancel it
// sends ends the wait, so the row is resolved on the primary after all. The
// background retry finds the row saying exactly what it was writing: that is
// the proxy's own late resolution — counted (rail_resolution_late_total, the
// submission as acked), logged as submission_resolved late, and, since its
// durability cannot be confirmed while the standby is stalled, as
// resolution_not_durable — never as a disagreement between the audit trail and
// the caller's answer.
func TestResolutionCommittedAfterItsDeadlineIsCountedAsLate(t *testing.T) {
	pair := pgtest.Pair(t, pgcluster.PairOptions{Sync: true})
	pool := pgtest.Pool(t, pair.URL("paydb"))
	hold := newHoldingRail(t)
	px := startProxy(t, testConfig(pair.URL("paydb"), hold.URL))
	p := newPayout("p-after-deadline", "acct-after-deadline")
	done := make(chan answer, 1)
	go func() { done <- trySubmit(px.URL, 1, p) }()
	hold.waitCalls(t, 1) // admitted and committed: the rail holds the call
	if err := pair.HoldStandby(); err != nil {
		t.Fatal(err)
	}
	var releaseOnce sync.Once
	releaseStandby := func() { releaseOnce.Do(pair.ReleaseStandby) }
	t.Cleanup(releaseStandby)
	hold.release()
	a := <-done
	if a.Err != nil || a.Status != http.StatusOK || a.str("railReference") != "RS-"+p.PayoutID {
		t.Fatalf("answer %d %v %v; want 200 ACKED", a.Status, a.Body, a.Err)
	}
	isEnd := func(m map[string]any) bool {
		msg, _ := m["msg"].(string)
		return m["late"] == true && m["event"] == "submission_resolved" || strings.HasPrefix(msg, "the row was resolved by someone else")
	}
	eventually(t, 30*time.Second, "the background resolving write to end", func() bool { return len(px.Logs.filter(isEnd)) > 0 })
	releaseStandby()
	if ev := px.Logs.filter(func(m map[string]any) bool {
		// The test cluster runs with fsync off, the test's made-up payout with
		// the books check off, and the proxy without identity: each says so at
		// ERROR at start-up.
		return m["level"] == "ERROR" && m["event"] != "unsafe_non_durable_db" && m["event"] != "books_not_checked" &&
			m["event"] != "auth_disabled"
	}); len(ev) != 0 {
		t.Errorf("ERROR lines: %v", ev)
	}
	rs, err := tryRowsOf(pool, p.PayoutID)
	if err != nil || len(rs) != 1 || outcomeOf(rs[0]) != lockapi.OutcomeAcked {
		t.Fatalf("rows %+v %v; want one ACKED", rs, err)
	}
	end := px.Logs.filter(isEnd)
	if len(end) != 1 || end[0]["event"] != "submission_resolved" || end[0]["committedAfterDeadline"] != true {
		t.Errorf("the late write's line: %v; want submission_resolved, late, committedAfterDeadline", end)
	}
	nd := px.Logs.events("resolution_not_durable")
	if len(nd) != 1 || nd[0]["late"] != true || fmt.Sprint(nd[0]["outcome"]) != lockapi.OutcomeAcked {
		t.Errorf("resolution_not_durable: %v; want one, late", nd)
	}
	for series, want := range map[string]float64{
		`rail_submission_total{outcome="acked"}`:     1,
		`rail_submission_total{outcome="ambiguous"}`: 0,
		"rail_resolution_late_total":                 1,
		"rail_resolution_not_durable_total":          1,
	} {
		if v := metric(t, px, series); v != want {
			t.Errorf("%s = %v, want %v", series, v, want)
		}
	}

	// The check itself: its COMMIT waits for the standby, so it fails while the
	// standby is held and succeeds once it has caught up.
	store, err := OpenStore(context.Background(), pair.URL("paydb"), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := pair.HoldStandby(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	err = store.ConfirmDurable(ctx)
	cancel()
	pair.ReleaseStandby()
	if err == nil {
		t.Error("ConfirmDurable with the standby held = nil; want an error (not known durable)")
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := store.ConfirmDurable(ctx); err != nil {
		t.Errorf("ConfirmDurable with the standby caught up: %v", err)
	}
}

// counterValue reads one counter of an admitter's metrics.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
