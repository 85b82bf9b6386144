package railproxy

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// The group statement with the books check on (paydb's rail_admit_group_books_by,
// docs/contracts/rail-proxy.md#group-admission-rail_proxy_max_group): the
// payout rows are written with books_test.go's helpers, in the shape
// payment-resource writes them.

// The function paydb runs names the books checks in lockapi's one order: the
// literals of its CASE, read from the installed function's source, are
// lockapi.BooksMismatchOrder().
func TestGroupBooksFollowLockapisOrder(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.PaydbURL(t))
	var src string
	if err := pool.QueryRow(context.Background(),
		`SELECT prosrc FROM pg_proc WHERE proname = 'rail_admit_group_books_by'`).Scan(&src); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range regexp.MustCompile(`THEN '([a-z_]+)'`).FindAllStringSubmatch(src, -1) {
		names = append(names, m[1])
	}
	if !slices.Equal(names, lockapi.BooksMismatchOrder()) {
		t.Fatalf("rail_admit_group_books_by checks %v, lockapi.BooksMismatchOrder is %v", names, lockapi.BooksMismatchOrder())
	}
}

// A member failing checks k, k+1, … of lockapi.BooksMismatchOrder is refused
// naming k, in a group as one by one, for every k; a booked member of the same
// group is admitted. The refused members' accounts had no mark row and get none:
// a group of only unbooked members for a new account creates no mark row.
func TestGroupBooksNameTheFirstFailingCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, pool := groupTestStore(t)
	order := lockapi.BooksMismatchOrder()
	var subs []Submission
	for k := range order {
		for _, path := range []string{"group", "alone"} {
			p := newPayout(fmt.Sprintf("p-%s-%d", path, k), fmt.Sprintf("acct-%s-%d", path, k))
			bookBroken(t, pool, p, 9, order[k:]...)
			if path == "alone" {
				a, err := store.Admit(ctx, presented(p, 9, "worker-1"), true, true, time.Minute)
				if err != nil || a.Verdict != Unbooked || a.Mismatch != order[k] {
					t.Errorf("one by one, failing %v: %+v %v; want unbooked, %s", order[k:], a, err, order[k])
				}
				continue
			}
			subs = append(subs, presented(p, 9, "worker-1"))
		}
	}
	ok := newPayout("p-group-booked", "acct-group-booked")
	book(t, pool, booked(ok, 9, "worker-1"))
	subs = append(subs, presented(ok, 9, "worker-1"))

	res, fellBack := groupStatementBooks(t, store, subs, true)
	if fellBack != nil {
		t.Fatalf("the group fell back: %v", fellBack)
	}
	for k, r := range res[:len(order)] {
		if r.Alone || r.Err != nil || r.Admission.Verdict != Unbooked || r.Admission.Mismatch != order[k] ||
			r.Admission.PassedFence {
			t.Errorf("in a group, failing %v: alone=%v %+v %v; want unbooked, %s", order[k:], r.Alone, r.Admission, r.Err, order[k])
		}
		if rs := rowsOf(t, pool, subs[k].PayoutID); len(rs) != 1 || outcomeOf(rs[0]) != lockapi.OutcomeUnbooked || rs[0].ResolvedAt == nil {
			t.Errorf("rows of %s: %+v; want one UNBOOKED, resolved", subs[k].PayoutID, rs)
		}
	}
	if r := res[len(order)]; r.Err != nil || r.Admission.Verdict != Admitted {
		t.Errorf("the booked member: %+v %v; want admitted", r.Admission, r.Err)
	}
	var marks []string
	rows, err := pool.Query(ctx, `SELECT account_id FROM rail_high_water ORDER BY account_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			t.Fatal(err)
		}
		marks = append(marks, a)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(marks, []string{"acct-group-booked"}) {
		t.Errorf("mark rows %v; want only the booked member's account", marks)
	}
	var interrupts int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM rail_submission WHERE outcome = 'UNBOOKED' AND interrupt_at IS NOT NULL`).
		Scan(&interrupts); err != nil || interrupts != 0 {
		t.Errorf("%d UNBOOKED rows with an interrupt_at (%v); want none: they are not intents", interrupts, err)
	}
}

// The mark moves, and a mark row is created, only for members that pass the
// books; the fence verdict comes first. In one group: a new account's unbooked
// members create nothing, and its booked member creates the row at its own token
// even after a higher unbooked one; an existing account's unbooked member above
// the mark leaves it, so a later booked member below that token still passes;
// and an unbooked member at or below the mark is FENCED, not UNBOOKED.
func TestGroupBooksMoveMarksOnlyForBookedMembers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, pool := groupTestStore(t)
	seed := newPayout("p-seed", "acct-e")
	book(t, pool, booked(seed, 10, "worker-1"))
	if a, err := store.Admit(ctx, presented(seed, 10, "worker-1"), true, true, time.Minute); err != nil || a.Verdict != Admitted {
		t.Fatalf("seed: %+v %v", a, err)
	}
	bookedSub := func(id, acct string, tok int64) Submission {
		p := newPayout(id, acct)
		book(t, pool, booked(p, tok, "worker-1"))
		return presented(p, tok, "worker-1")
	}
	unbooked := func(id, acct string, tok int64) Submission { // nobody created it
		return presented(newPayout(id, acct), tok, "worker-1")
	}
	subs := []Submission{
		unbooked("p-n1a", "acct-n1", 5),  // 0 a new account, only unbooked members
		unbooked("p-n1b", "acct-n1", 7),  // 1
		unbooked("p-n2a", "acct-n2", 9),  // 2 a new account: unbooked, higher than its booked member
		bookedSub("p-n2b", "acct-n2", 4), // 3 creates acct-n2's row at 4
		unbooked("p-n2c", "acct-n2", 8),  // 4 passes the fence (8 > 4), refused by the books
		unbooked("p-e1", "acct-e", 12),   // 5 above the mark, refused: the mark stays 10
		bookedSub("p-e2", "acct-e", 11),  // 6 passes 10: the mark becomes 11
		unbooked("p-e3", "acct-e", 3),    // 7 at or below the mark: FENCED, whatever the books say
		bookedSub("p-e4", "acct-e", 11),  // 8 booked, but 11 is the mark now: FENCED
	}
	res, fellBack := groupStatementBooks(t, store, subs, true)
	if fellBack != nil {
		t.Fatalf("the group fell back: %v", fellBack)
	}
	want := []struct {
		v        Verdict
		mismatch string
		mark     int64
	}{
		{Unbooked, lockapi.MismatchNotFound, 0}, {Unbooked, lockapi.MismatchNotFound, 0},
		{Unbooked, lockapi.MismatchNotFound, 0}, {Admitted, "", 0}, {Unbooked, lockapi.MismatchNotFound, 0},
		{Unbooked, lockapi.MismatchNotFound, 0}, {Admitted, "", 0}, {Fenced, "", 11}, {Fenced, "", 11},
	}
	for i, r := range res {
		if r.Alone || r.Err != nil || r.Admission.Verdict != want[i].v || r.Admission.Mismatch != want[i].mismatch ||
			r.Admission.HighestToken != want[i].mark {
			t.Errorf("member %d (%s %s %d): alone=%v %+v %v; want verdict %d mismatch %q mark %d", i, subs[i].PayoutID,
				subs[i].AccountID, subs[i].Token, r.Alone, r.Admission, r.Err, want[i].v, want[i].mismatch, want[i].mark)
		}
	}
	var n1 int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM rail_high_water WHERE account_id = 'acct-n1'`).Scan(&n1); err != nil || n1 != 0 {
		t.Errorf("acct-n1, only unbooked members: %d mark rows (%v); want none", n1, err)
	}
	for acct, m := range map[string]int64{"acct-n2": 4, "acct-e": 11} {
		if got := mark(t, pool, acct); got != m {
			t.Errorf("%s: mark %d, want %d", acct, got, m)
		}
	}
}

// With the books check on, the group still never waits for a row another
// transaction holds: while one transaction holds acct-x's mark row, another is
// creating acct-new's and acct-ghost's, and a third holds the payout row of a
// member (payment-resource re-claiming it, not yet committed), the group returns
// at once. acct-x's members are left alone, even the unbooked one (the fence
// verdict, which comes first, needs that mark), as is acct-new's booked member,
// whose row is to be created; acct-ghost's members, all unbooked, are decided
// (no row to create for them: one by one would not wait either), and so is every
// other member — the one whose payout row is held judged by the row as
// committed, which is read without a lock. Released, the members left alone are
// admitted one by one with their own verdicts.
func TestGroupBooksLeavesHeldAccountsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, pool := groupTestStore(t)
	bookedSub := func(id, acct string, tok int64) Submission {
		p := newPayout(id, acct)
		book(t, pool, booked(p, tok, "worker-1"))
		return presented(p, tok, "worker-1")
	}
	unbooked := func(id, acct string, tok int64) Submission {
		return presented(newPayout(id, acct), tok, "worker-1")
	}
	for _, acct := range []string{"acct-x", "acct-y"} {
		if a, err := store.Admit(ctx, bookedSub("seed-"+acct, acct, 10), true, true, time.Minute); err != nil || a.Verdict != Admitted {
			t.Fatalf("seeding %s: %+v %v", acct, a, err)
		}
	}
	subs := []Submission{
		bookedSub("p-x1", "acct-x", 11),   // 0 held: alone
		unbooked("p-x2", "acct-x", 12),    // 1 held: alone, though unbooked
		bookedSub("p-y1", "acct-y", 11),   // 2 admitted; its payout row held by a re-claim
		unbooked("p-y2", "acct-y", 13),    // 3 unbooked
		bookedSub("p-n1", "acct-new", 3),  // 4 being created, booked: alone
		unbooked("p-g1", "acct-ghost", 2), // 5 being created, unbooked: decided
		bookedSub("p-w1", "acct-w", 1),    // 6 a new account nobody else touches: created, admitted
	}
	releaseX := heldRow(t, pool, "acct-x")
	releaseNew := creatingRow(t, pool, "acct-new")
	// Four transactions held open: two on a pool of their own, so that the
	// test's reads still find a connection.
	holders := pgtest.Pool(t, pool.Config().ConnString())
	releaseGhost := creatingRow(t, holders, "acct-ghost")
	releaseClaim := openTx(t, holders, `UPDATE payout SET fence_token = 20, updated_at = now() WHERE payout_id = 'p-y1'`)

	res, fellBack := groupStatementBooks(t, store, subs, true)
	if fellBack != nil {
		t.Fatalf("the group fell back (it waited for a held row): %v", fellBack)
	}
	want := []struct {
		alone    bool
		v        Verdict
		mismatch string
	}{
		{true, 0, ""}, {true, 0, ""}, {false, Admitted, ""}, {false, Unbooked, lockapi.MismatchNotFound},
		{true, 0, ""}, {false, Unbooked, lockapi.MismatchNotFound}, {false, Admitted, ""},
	}
	for i, r := range res {
		if r.Alone != want[i].alone || r.Err != nil || r.Admission.Verdict != want[i].v || r.Admission.Mismatch != want[i].mismatch {
			t.Errorf("member %d (%s %s) while rows are held: alone=%v %+v %v; want alone=%v verdict %d mismatch %q", i,
				subs[i].PayoutID, subs[i].AccountID, r.Alone, r.Admission, r.Err, want[i].alone, want[i].v, want[i].mismatch)
		}
	}
	// Committed while the rows are still held; nothing of the members left alone.
	for p, n := range map[string]int{"p-x1": 0, "p-x2": 0, "p-n1": 0, "p-y1": 1, "p-y2": 1, "p-g1": 1, "p-w1": 1} {
		if rs := rowsOf(t, pool, p); len(rs) != n {
			t.Errorf("%s: %d rows while the rows are held, want %d", p, len(rs), n)
		}
	}
	if m := mark(t, pool, "acct-x"); m != 10 {
		t.Errorf("acct-x's mark %d while held, want 10", m)
	}

	// A group of one whose mark row is held is left alone too.
	one, fellBack := groupStatementBooks(t, store, []Submission{bookedSub("p-x3", "acct-x", 13)}, true)
	if fellBack != nil || len(one) != 1 || !one[0].Alone {
		t.Errorf("a group of one whose row is held: %+v %v, want alone", one, fellBack)
	}

	releaseX()
	releaseNew()
	releaseGhost()
	releaseClaim()
	for _, c := range []struct {
		sub      Submission
		v        Verdict
		mismatch string
	}{{subs[0], Admitted, ""}, {subs[1], Unbooked, lockapi.MismatchNotFound}, {subs[4], Admitted, ""}} {
		a, err := store.Admit(ctx, c.sub, true, true, time.Minute)
		if err != nil || a.Verdict != c.v || a.Mismatch != c.mismatch {
			t.Errorf("%s alone: %+v %v, want verdict %d mismatch %q", c.sub.PayoutID, a, err, c.v, c.mismatch)
		}
	}
	var ghost int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM rail_high_water WHERE account_id = 'acct-ghost'`).Scan(&ghost); err != nil || ghost != 0 {
		t.Errorf("acct-ghost: %d mark rows (%v); want none", ghost, err)
	}
	for acct, want := range map[string]int64{"acct-x": 11, "acct-y": 11, "acct-new": 3, "acct-w": 1} {
		if m := mark(t, pool, acct); m != want {
			t.Errorf("%s: mark %d, want %d", acct, m, want)
		}
	}
}

// presented is p presented with token by owner, as the handler builds it.
func presented(p payout, token int64, owner string) Submission {
	return Submission{PayoutID: p.PayoutID, AccountID: p.AccountID, Token: token, OwnerID: owner,
		IdempotencyKey: fmt.Sprintf("%s:%d", p.PayoutID, token), AmountMinor: p.AmountMinor, Currency: p.Currency,
		Beneficiary: p.Beneficiary}
}
