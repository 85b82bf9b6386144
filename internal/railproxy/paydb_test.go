package railproxy

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/internal/testkit"
	"lock.dev/internal/testkit/faultproxy"
	"lock.dev/lockapi"
)

// pgForwarder is the test kit's TCP fault proxy between the proxy and
// PostgreSQL: paydb becomes unreachable (every connection closed, new ones
// refused), hangs, or one COMMIT is lost on the way in or on the way out.
type pgForwarder struct{ *faultproxy.Proxy }

// commitMsg is a simple-protocol Query message carrying "COMMIT": how the
// admission transaction's COMMIT travels.
var commitMsg = []byte("Q\x00\x00\x00\x0bCOMMIT\x00")

func newPGForwarder(t testing.TB, dbURL string) (*pgForwarder, string) {
	p, viaURL := testkit.FaultProxyURL(t, dbURL)
	return &pgForwarder{p}, viaURL
}

// setDown(true) puts paydb out of reach: every connection closed, new ones
// refused, until setDown(false).
func (f *pgForwarder) setDown(down bool) {
	if down {
		f.Down()
	} else {
		f.Forward()
	}
}

// setStall(true) makes paydb hang: connections stay open and nothing is
// answered (a black-holed host, a stuck server). setStall(false) ends it: the
// connections it held are closed (their clients see paydb gone and connect
// again), and new ones are relayed.
func (f *pgForwarder) setStall(stall bool) {
	if stall {
		f.Stall()
	} else {
		f.Forward()
	}
}

// armHold arms a lost answer: the next COMMIT's answer is lost (the proxy's
// side of the connection is closed) and the COMMIT itself is held until
// release is called, when it lands.
func (f *pgForwarder) armHold() (release func()) {
	held := make(chan struct{})
	var once sync.Once
	f.Arm(faultproxy.Fault{Match: commitMsg, Deliver: true, Release: held})
	return func() { once.Do(func() { close(held) }) }
}

// arm arms a fault on the next COMMIT: "before" drops it; "after" delivers it
// and loses its answer ("after-down": and paydb goes out of reach, as setDown;
// "after-stall": and paydb hangs, as setStall). With "after" the COMMIT lands
// a moment after the proxy's side is closed, as when the connection breaks in
// front of a server that has yet to read it: the proxy must not take the row it
// does not find yet for one never written.
func (f *pgForwarder) arm(fault string) {
	lost := faultproxy.Fault{Match: commitMsg, Deliver: true}
	switch fault {
	case "before":
		f.Arm(faultproxy.Fault{Match: commitMsg})
	case "after":
		lost.Delay = 100 * time.Millisecond
		f.Arm(lost)
	case "after-down":
		lost.Then = faultproxy.Down
		f.Arm(lost)
	case "after-stall":
		lost.Then = faultproxy.Stall
		f.Arm(lost)
	default:
		panic("pgForwarder: unknown fault " + fault)
	}
}

// paydb out of reach is 503 RAIL_UNAVAILABLE
// stage intent_commit, no row, no rail call; readiness is DOWN (db) while liveness
// stays UP; when paydb is back, the same payout is admitted.
func TestPaydbUnreachable(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	fwd, viaURL := newPGForwarder(t, dbURL)
	p := startProxy(t, testConfig(viaURL, rail.URL))
	if a := get(t, p.URL+"/readyz"); a.Status != http.StatusOK {
		t.Fatalf("readiness before: %+v", a)
	}

	fwd.setDown(true)
	a := submit(t, p.URL, 3, newPayout("p-nodb", "acct-nodb"))
	if a.Status != http.StatusServiceUnavailable || a.code() != lockapi.CodeRailUnavailable || a.str("stage") != "intent_commit" {
		t.Fatalf("answer: %+v", a)
	}
	if _, ok := a.Body["submissionId"]; ok {
		t.Fatalf("no row exists, yet the answer names one: %+v", a.Body)
	}
	if n := countRows(t, db); n != 0 {
		t.Fatalf("%d rows written", n)
	}
	if c := rail.calls(t); len(c) != 0 {
		t.Fatalf("rail calls: %+v", c)
	}
	if ev := p.Logs.events("rail_unavailable"); len(ev) != 1 || ev[0]["stage"] != "intent_commit" {
		t.Fatalf("rail_unavailable: %v", ev)
	}
	ready := get(t, p.URL+"/readyz")
	comps, _ := ready.Body["components"].(map[string]any)
	dbc, _ := comps["db"].(map[string]any)
	if ready.Status != http.StatusServiceUnavailable || dbc["status"] != "DOWN" {
		t.Fatalf("readiness with paydb down: %+v", ready.Body)
	}
	if live := get(t, p.URL+"/livez"); live.Status != http.StatusOK {
		t.Fatalf("liveness: %+v", live)
	}
	// The audit read is a plain 503 UNAVAILABLE.
	if a := get(t, p.URL+"/v1/rail/submissions?payoutId=p-nodb"); a.Status != http.StatusServiceUnavailable || a.code() != lockapi.CodeUnavailable {
		t.Fatalf("audit read: %+v", a)
	}

	fwd.setDown(false)
	if a := submit(t, p.URL, 3, newPayout("p-nodb", "acct-nodb")); a.Status != http.StatusOK {
		t.Fatalf("after paydb is back: %+v", a)
	}
}

// A COMMIT whose answer is lost: the intent may exist. This process knows it
// opened no socket, so when the row turns out to exist it resolves it UNSENT and
// names it; when the COMMIT never arrived there is no row. Either way: 503
// intent_commit and no rail call.
func TestIntentCommitLost(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	fwd, viaURL := newPGForwarder(t, dbURL)
	cfg := testConfig(viaURL, rail.URL)
	// The answer names the row only when the UNSENT write lands within the
	// bound; 250 ms is too short a promise on a loaded test machine.
	cfg.hooks = &hooks{unsentAnswerBound: 10 * time.Second}
	p := startProxy(t, cfg)

	fwd.arm("after")
	a := submit(t, p.URL, 1, newPayout("p-lost-answer", "acct-lost"))
	if a.Status != http.StatusServiceUnavailable || a.str("stage") != "intent_commit" || a.int("submissionId") <= 0 {
		t.Fatalf("commit answer lost: %+v\nlogs: %v", a, p.Logs.String())
	}
	rs := rowsOf(t, db, "p-lost-answer")
	if len(rs) != 1 || outcomeOf(rs[0]) != "UNSENT" || rs[0].ID != a.int("submissionId") {
		t.Fatalf("rows: %+v", rs)
	}

	fwd.arm("before")
	a = submit(t, p.URL, 2, newPayout("p-lost-commit", "acct-lost"))
	if a.Status != http.StatusServiceUnavailable || a.str("stage") != "intent_commit" {
		t.Fatalf("commit lost: %+v", a)
	}
	if _, ok := a.Body["submissionId"]; ok {
		t.Fatalf("no row exists, yet the answer names one: %+v", a.Body)
	}
	if rs := rowsOf(t, db, "p-lost-commit"); len(rs) != 0 {
		t.Fatalf("rows: %+v", rs)
	}
	if c := rail.calls(t); len(c) != 0 {
		t.Fatalf("rail calls: %+v", c)
	}
	// Neither left the payout blocked: an UNSENT row is outside the unique index.
	if a := submit(t, p.URL, 3, newPayout("p-lost-answer", "acct-lost")); a.Status != http.StatusOK {
		t.Fatalf("resubmission: %+v", a)
	}
}

// The admission transaction is bounded by 2 s in all, waiting for a pool
// connection included: a fence blocked on the account's row lock, and a second
// submission waiting for the only pool connection, both answer 503
// intent_commit, write nothing and call nothing.
func TestAdmissionBound(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	cfg := testConfig(dbURL, rail.URL)
	cfg.PaydbMaxConns = 1
	p := startProxy(t, cfg)
	if a := submit(t, p.URL, 1, newPayout("p-b0", "acct-b")); a.Status != http.StatusOK {
		t.Fatalf("warm-up: %+v", a)
	}
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SELECT 1 FROM rail_high_water WHERE account_id = 'acct-b' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	answers := make([]answer, 2)
	for i := range 2 {
		if i == 1 {
			// The second comes once the first holds the only pool connection,
			// its fence waiting on the row lock.
			eventually(t, 10*time.Second, "the first submission to wait on the row lock", func() bool {
				var n int
				err := db.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'").Scan(&n)
				return err == nil && n > 0
			})
		}
		wg.Go(func() {
			answers[i] = trySubmit(p.URL, int64(10+i), newPayout("p-b"+string(rune('1'+i)), "acct-b"))
		})
	}
	wg.Wait()
	for i, a := range answers {
		if a.Status != http.StatusServiceUnavailable || a.str("stage") != "intent_commit" {
			t.Fatalf("submission %d: %+v", i, a)
		}
	}
	_ = tx.Rollback(ctx)
	if n := countRows(t, db); n != 1 {
		t.Fatalf("%d rows, want only the warm-up's", n)
	}
	if n := len(rail.calls(t)); n != 1 {
		t.Fatalf("%d rail calls, want only the warm-up's", n)
	}
	if got := mark(t, db, "acct-b"); got != 1 {
		t.Fatalf("mark %d, want 1 (nothing committed)", got)
	}
}
