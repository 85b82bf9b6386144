package railproxy

import (
	"context"
	"testing"
	"time"
)

// The group statement itself, on real paydb: while another transaction holds
// acct-x's mark row (SELECT … FOR UPDATE) and another is creating acct-new's,
// a group containing them and others returns at once — the others decided and
// committed, the held accounts' members Alone with nothing written for them and
// their marks untouched. A group of one whose row is held is Alone too (the
// worker never waits for it). Admitted alone once released, they get one by
// one's verdicts.
func TestGroupLeavesHeldAccountsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, pool := groupTestStore(t)
	mk := groupTestSub
	for _, acct := range []string{"acct-x", "acct-y"} {
		if _, err := store.Admit(ctx, mk("seed-"+acct, acct, 10), true, false, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	releaseX := heldRow(t, pool, "acct-x")
	releaseNew := creatingRow(t, pool, "acct-new")

	subs := []Submission{mk("p-x1", "acct-x", 11), mk("p-y1", "acct-y", 11), mk("p-n1", "acct-new", 3),
		mk("p-x2", "acct-x", 12), mk("p-y2", "acct-y", 9), mk("p-w1", "acct-w", 1)}
	res, fellBack := groupStatement(t, store, subs)
	if fellBack != nil {
		t.Errorf("the group fell back: %v", fellBack)
	}
	want := []struct {
		alone bool
		v     Verdict
		mark  int64
	}{{true, 0, 0}, {false, Admitted, 0}, {true, 0, 0}, {true, 0, 0}, {false, Fenced, 11}, {false, Admitted, 0}}
	for i, r := range res {
		if r.Alone != want[i].alone || r.Err != nil || r.Admission.Verdict != want[i].v || r.Admission.HighestToken != want[i].mark {
			t.Errorf("member %d (%s %s) while acct-x and acct-new are held: alone=%v %+v %v; want alone=%v verdict %d mark %d",
				i, subs[i].PayoutID, subs[i].AccountID, r.Alone, r.Admission, r.Err, want[i].alone, want[i].v, want[i].mark)
		}
	}
	// Committed while the rows are still held; nothing of the Alone members.
	for p, n := range map[string]int{"p-x1": 0, "p-x2": 0, "p-n1": 0, "p-y1": 1, "p-y2": 1, "p-w1": 1} {
		if rs := rowsOf(t, pool, p); len(rs) != n {
			t.Errorf("%s: %d rows while acct-x and acct-new are held, want %d", p, len(rs), n)
		}
	}
	if m := mark(t, pool, "acct-x"); m != 10 {
		t.Errorf("acct-x's mark %d while held, want 10", m)
	}

	// A group of one.
	one, fellBack := groupStatement(t, store, []Submission{mk("p-x3", "acct-x", 13)})
	if fellBack != nil || len(one) != 1 || !one[0].Alone {
		t.Errorf("a group of one whose row is held: %+v %v, want Alone", one, fellBack)
	}
	if rs := rowsOf(t, pool, "p-x3"); len(rs) != 0 {
		t.Errorf("p-x3: %d rows, want none", len(rs))
	}

	// Released: admitted alone, in arrival order, with one by one's verdicts.
	releaseX()
	releaseNew()
	for _, c := range []struct {
		sub  Submission
		v    Verdict
		mark int64
	}{{subs[0], Admitted, 0}, {subs[2], Admitted, 0}, {subs[3], Admitted, 0}, {mk("p-x3", "acct-x", 13), Admitted, 0}} {
		a, err := store.Admit(ctx, c.sub, true, false, time.Minute)
		if err != nil || a.Verdict != c.v || a.HighestToken != c.mark {
			t.Errorf("%s alone: %+v %v, want verdict %d", c.sub.PayoutID, a, err, c.v)
		}
	}
	for acct, want := range map[string]int64{"acct-x": 13, "acct-y": 11, "acct-new": 3, "acct-w": 1} {
		if m := mark(t, pool, acct); m != want {
			t.Errorf("%s: mark %d, want %d", acct, m, want)
		}
	}
}

// A forwardable attempt of a member's payout that another transaction has
// inserted and not committed (another account's submission of the same payout)
// makes the group's INSERT wait at most its lock bound: the statement fails
// with lock_not_available, nothing is written, and every member is Alone —
// admitted on its own, within its own bound, never on what is left of another's.
func TestGroupWithAHeldPayoutLeavesEveryMemberAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, pool := groupTestStore(t)
	mk := groupTestSub
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id,
	        idempotency_key, amount_minor, currency, beneficiary) VALUES ('p-shared', 'acct-q', 1, 'w', 'k', 1, 'EUR', 'b')`); err != nil {
		t.Fatal(err)
	}
	subs := []Submission{mk("p-y1", "acct-y", 1), mk("p-shared", "acct-k", 1), mk("p-z1", "acct-z", 1)}
	res, fellBack := groupStatement(t, store, subs)
	if !lockNotAvailable(fellBack) {
		t.Errorf("fell back for %v, want lock_not_available", fellBack)
	}
	for i, r := range res {
		if !r.Alone {
			t.Errorf("member %d: %+v %v, want Alone", i, r.Admission, r.Err)
		}
	}
	if n := countRows(t, pool); n != 0 {
		t.Errorf("%d rows written by the group that fell back, want none", n)
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for i, v := range []Verdict{Admitted, Duplicate, Admitted} {
		a, err := store.Admit(ctx, subs[i], true, false, time.Minute)
		if err != nil || a.Verdict != v {
			t.Errorf("member %d alone: %+v %v, want verdict %d", i, a, err, v)
		}
	}
}

// groupStatement runs the group statement once for subs, on a connection of its
// own, within a bound no test machine reaches: a statement that waits for a held
// row runs out, and the test fails on the verdicts, not by hanging. The tests
// that use it are about held rows and submit made-up payouts with no payout row:
// the books check is off (groupStatementBooks turns it on).
func groupStatement(t *testing.T, store *Store, subs []Submission) ([]MemberResult, error) {
	t.Helper()
	return groupStatementBooks(t, store, subs, false)
}

// groupStatementBooks is groupStatement with the books check as books says.
func groupStatementBooks(t *testing.T, store *Store, subs []Submission, books bool) ([]MemberResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := store.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.release()
	return store.admitGroupConn(ctx, conn, subs, true, books, time.Minute)
}
