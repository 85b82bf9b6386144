package railproxy

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// A mark row another transaction holds decides nothing for the other accounts of
// a group (docs/contracts/rail-proxy.md#group-admission-rail_proxy_max_group): while a transaction
// on another connection holds acct-x's row (SELECT … FOR UPDATE, a replica
// paused between its statement and its COMMIT) and another is creating
// acct-new's row, a group with members of those accounts and of others commits
// the others' verdicts and rows while both are still held; the held accounts'
// members are admitted once their rows are free, with the verdicts one by one
// gives. Only Store.AdmitGroup and paydb are used, so the test runs against any
// group implementation.
func TestGroupCommitsOthersWhileAMarkRowIsHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, pool := groupTestStore(t)
	mk := groupTestSub
	for _, acct := range []string{"acct-x", "acct-y", "acct-z"} {
		if _, err := store.Admit(ctx, mk("seed-"+acct, acct, 10), true, false, time.Minute); err != nil {
			t.Fatal(err)
		}
	}

	releaseX := heldRow(t, pool, "acct-x")
	releaseNew := creatingRow(t, pool, "acct-new")

	subs := []Submission{
		mk("p-y1", "acct-y", 11),  // admitted
		mk("p-x1", "acct-x", 11),  // held: admitted once free
		mk("p-z1", "acct-z", 12),  // admitted
		mk("p-x2", "acct-x", 10),  // held: fenced by p-x1's token once free
		mk("p-n1", "acct-new", 5), // being created: admitted once free
		mk("p-z2", "acct-z", 12),  // fenced by p-z1
		mk("p-w1", "acct-w", 1),   // a new account nobody else touches: created, admitted
		mk("p-y1", "acct-y", 13),  // a second attempt of p-y1: duplicate
	}
	type result struct{ res []MemberResult }
	done := make(chan result, 1)
	// Made-up payouts, no payout row: the books check is off, this is about held
	// mark rows.
	go func() { done <- result{store.AdmitGroup(ctx, subs, true, false, time.Minute)} }()

	// The free accounts' rows are committed while acct-x's and acct-new's are
	// still held (both transactions above are open until released below).
	free := map[string]string{"p-y1": "NULL,DUPLICATE", "p-z1": "NULL", "p-z2": "FENCED", "p-w1": "NULL"}
	eventually(t, 30*time.Second, "the free accounts' rows committed while acct-x's row is held", func() bool {
		for p, want := range free {
			rs, err := tryRowsOf(pool, p)
			if err != nil {
				return false
			}
			got := ""
			for i, r := range rs {
				if i > 0 {
					got += ","
				}
				got += outcomeOf(r)
			}
			if got != want {
				return false
			}
		}
		return true
	})
	for _, p := range []string{"p-x1", "p-x2", "p-n1"} {
		if rs := rowsOf(t, pool, p); len(rs) != 0 {
			t.Errorf("%s: %d rows while its account's mark row is held, want none yet", p, len(rs))
		}
	}
	if m := mark(t, pool, "acct-x"); m != 10 {
		t.Errorf("acct-x's mark %d while held, want 10", m)
	}

	// Released: the held members are admitted with one by one's verdicts.
	releaseX()
	releaseNew()
	var got []MemberResult
	select {
	case r := <-done:
		got = r.res
	case <-time.After(30 * time.Second):
		t.Fatal("the group did not finish within 30 s of the rows' release")
	}
	want := []struct {
		v    Verdict
		mark int64
	}{{Admitted, 0}, {Admitted, 0}, {Admitted, 0}, {Fenced, 11}, {Admitted, 0}, {Fenced, 12}, {Admitted, 0}, {Duplicate, 0}}
	for i, r := range got {
		if r.Err != nil || r.Admission.Verdict != want[i].v || r.Admission.HighestToken != want[i].mark {
			t.Errorf("member %d (%s %s): %+v %v, want verdict %d mark %d", i, subs[i].PayoutID, subs[i].AccountID,
				r.Admission, r.Err, want[i].v, want[i].mark)
		}
	}
	for acct, want := range map[string]int64{"acct-x": 11, "acct-y": 13, "acct-z": 12, "acct-new": 5, "acct-w": 1} {
		if m := mark(t, pool, acct); m != want {
			t.Errorf("%s: mark %d, want %d", acct, m, want)
		}
	}
}

// heldRow holds acct's mark row (SELECT … FOR UPDATE) in a transaction of its
// own, as a replica paused between its statement and its COMMIT does, until
// release (or the test's end).
func heldRow(t *testing.T, pool beginner, acct string) (release func()) {
	t.Helper()
	return openTx(t, pool, `SELECT highest_token FROM rail_high_water WHERE account_id = $1 FOR UPDATE`, acct)
}

// creatingRow inserts acct's mark row in a transaction of its own and leaves it
// uncommitted, as a replica creating the account does, until release (or the
// test's end).
func creatingRow(t *testing.T, pool beginner, acct string) (release func()) {
	t.Helper()
	return openTx(t, pool, `INSERT INTO rail_high_water (account_id, highest_token, updated_at) VALUES ($1, 1, now())`, acct)
}

type beginner interface {
	Begin(context.Context) (pgx.Tx, error)
}

// openTx runs sql in a transaction it leaves open; release rolls it back.
func openTx(t *testing.T, pool beginner, sql string, args ...any) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	released := false
	release = func() {
		if !released {
			released = true
			_ = tx.Rollback(ctx)
		}
	}
	t.Cleanup(release)
	return release
}

// Through the running service, real paydb, the default RAIL_PROXY_MAX_GROUP:
// while another transaction holds acct-x's mark row, a submission for acct-y is
// answered with its own verdict (200, then 409 FENCED_OUT for a stale token)
// before the submission for acct-x, which is still waiting for its own row, is
// answered. Released, acct-x's submission completes with its own verdict (or,
// had its row been held past its own bound, 503 with nothing presented). Held
// past acct-x's bound, only acct-x's submission fails: 503 RAIL_UNAVAILABLE
// stage intent_commit, the rail never called, no row written — and acct-y is
// answered meanwhile.
func TestHeldMarkRowDelaysOnlyItsOwnAccount(t *testing.T) {
	t.Parallel()
	paydbURL := pgtest.PaydbURL(t)
	rail := startStub(t, 0)
	cfg := testConfig(paydbURL, rail.URL)
	if cfg.MaxGroup != DefaultMaxGroup {
		t.Fatalf("test config's RAIL_PROXY_MAX_GROUP is %d, want the default %d", cfg.MaxGroup, DefaultMaxGroup)
	}
	px := startProxy(t, cfg)
	pool := pgtest.Pool(t, paydbURL)
	ctx := context.Background()
	for _, acct := range []string{"acct-x", "acct-y"} {
		if a := submit(t, px.URL, 10, newPayout("seed-"+acct, acct)); a.Status != 200 {
			t.Fatalf("seeding %s: %d %v", acct, a.Status, a.Body)
		}
	}
	// waitingForLock: some paydb backend waits for a row lock — the submission
	// for acct-x has reached paydb and waits for its row.
	waitingForLock := func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		     WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	}
	answered := func(ch <-chan answer) bool {
		select {
		case a := <-ch:
			t.Errorf("acct-x's submission was answered (%d %v) while its row is held, before acct-y's", a.Status, a.Body)
			return true
		default:
			return false
		}
	}

	t.Run("released", func(t *testing.T) {
		release := heldRow(t, pool, "acct-x")
		px1 := newPayout("p-x1", "acct-x")
		xDone := make(chan answer, 1)
		go func() { xDone <- trySubmit(px.URL, 11, px1) }()
		eventually(t, 30*time.Second, "acct-x's submission waiting for its row", waitingForLock)

		if a := submit(t, px.URL, 11, newPayout("p-y1", "acct-y")); a.Status != 200 || a.str("outcome") != lockapi.OutcomeAcked {
			t.Errorf("acct-y while acct-x's row is held: %d %v, want 200 ACKED", a.Status, a.Body)
		}
		if a := submit(t, px.URL, 5, newPayout("p-y2", "acct-y")); a.Status != 409 || a.code() != lockapi.CodeFencedOut {
			t.Errorf("acct-y with a stale token while acct-x's row is held: %d %v, want 409 FENCED_OUT", a.Status, a.Body)
		}
		if answered(xDone) {
			return
		}
		release()
		a := <-xDone
		switch {
		case a.Err != nil:
			t.Fatalf("acct-x: %v", a.Err)
		case a.Status == 200:
			if rs := rowsOf(t, pool, px1.PayoutID); len(rs) != 1 || outcomeOf(rs[0]) != lockapi.OutcomeAcked {
				t.Errorf("acct-x answered 200, rows %+v", rs)
			}
		case a.Status == 503 && a.code() == lockapi.CodeRailUnavailable && a.str("stage") == "intent_commit":
			// Its own bound passed before the row was released.
			if n := rail.callsFor(t, px1.PayoutID); n != 0 {
				t.Errorf("acct-x answered 503 but the rail was called %d times", n)
			}
		default:
			t.Errorf("acct-x after release: %d %v, want 200 (or 503 intent_commit past its own bound)", a.Status, a.Body)
		}
	})

	t.Run("held past its bound", func(t *testing.T) {
		release := heldRow(t, pool, "acct-x")
		defer release()
		px2 := newPayout("p-x2", "acct-x")
		xDone := make(chan answer, 1)
		go func() { xDone <- trySubmit(px.URL, 20, px2) }()
		eventually(t, 30*time.Second, "acct-x's submission waiting for its row", waitingForLock)
		if a := submit(t, px.URL, 20, newPayout("p-y3", "acct-y")); a.Status != 200 {
			t.Errorf("acct-y while acct-x's row is held: %d %v, want 200", a.Status, a.Body)
		}
		if answered(xDone) {
			return
		}
		// The row stays held until acct-x's submission is answered.
		a := <-xDone
		if a.Err != nil || a.Status != 503 || a.code() != lockapi.CodeRailUnavailable || a.str("stage") != "intent_commit" {
			t.Errorf("acct-x held past its bound: %d %v %v, want 503 RAIL_UNAVAILABLE stage intent_commit", a.Status, a.Body, a.Err)
		}
		if n := rail.callsFor(t, px2.PayoutID); n != 0 {
			t.Errorf("the rail was called %d times for acct-x's unadmitted submission", n)
		}
		release()
		if rs := rowsOf(t, pool, px2.PayoutID); len(rs) != 0 {
			t.Errorf("acct-x's unadmitted submission left rows %+v", rs)
		}
		if m := mark(t, pool, "acct-x"); m != 11 && m != 10 {
			t.Errorf("acct-x's mark %d, want it untouched by the unadmitted token 20", m)
		}
	})
}

// groupTestStore is a Store on a fresh paydb of its own (4 connections) and a
// pool on the same database for the test's own transactions: the ones that hold
// mark rows while a group runs.
func groupTestStore(t *testing.T) (*Store, *pgxpool.Pool) {
	t.Helper()
	url := pgtest.PaydbURL(t)
	store, err := OpenStore(context.Background(), url, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	return store, pgtest.Pool(t, url)
}

// groupTestSub is a submission of payout p for acct with token tok.
func groupTestSub(p, acct string, tok int64) Submission {
	return Submission{PayoutID: p, AccountID: acct, Token: tok, OwnerID: "w", IdempotencyKey: p, AmountMinor: 1,
		Currency: "EUR", Beneficiary: "b"}
}
