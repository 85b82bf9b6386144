package railproxy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// histEvent is one step of a random history: a submission, or (sub == nil) the
// resolution of every open intent — to UNSENT for some payouts (so they may be
// submitted again), ACKED for the others — as rail calls would between
// admissions.
type histEvent struct {
	sub *Submission
}

// randomHistory draws n events over a few accounts and a small set of payouts:
// tokens go up and down (replays, stale holders), payouts repeat.
func randomHistory(r *rand.Rand, n int) []histEvent {
	accounts := []string{"acct-a", "acct-b", "acct-c", "acct-d", "acct-e"}
	top := map[string]int64{}
	var h []histEvent
	for range n {
		if r.IntN(12) == 0 {
			h = append(h, histEvent{})
			continue
		}
		acct := accounts[r.IntN(len(accounts))]
		var tok int64
		switch r.IntN(4) {
		case 0, 1: // a newer holder
			top[acct] += 1 + r.Int64N(3)
			tok = top[acct]
		case 2: // a replay of the current token
			tok = max(1, top[acct])
		default: // a stale holder
			tok = max(1, top[acct]-r.Int64N(5))
		}
		p := fmt.Sprintf("p-%d", r.IntN(n/4+1))
		h = append(h, histEvent{sub: &Submission{PayoutID: p, AccountID: acct, Token: tok, OwnerID: "w-" + acct,
			IdempotencyKey: fmt.Sprintf("%s:%d", p, tok), AmountMinor: 100 + r.Int64N(1000), Currency: "EUR",
			Beneficiary: "NL91ABNA0417164300"}})
	}
	return h
}

// verdictView is an admission as the property compares it: ids as ranks (ids
// drawn one by one leave gaps where a duplicate's intent insert drew one).
type verdictView struct {
	Verdict      Verdict
	ID           int
	PassedFence  bool
	HighestToken int64
	FirstID      int
	FirstOutcome string
}

type rowView struct {
	ID                                                 int
	Payout, Account, Owner, Key, Currency, Beneficiary string
	Token, Amount                                      int64
	Outcome, RailReference, DeclineReason              string
	Resolved, HasInterrupt                             bool
}

type historyResult struct {
	Verdicts []verdictView
	Rows     []rowView
	Marks    map[string]int64
}

// runHistory admits h on a fresh paydb, in groups of at most size (size 0: one
// by one through Admit, today's path). A group never spans a resolution event.
func runHistory(t *testing.T, h []histEvent, size int, fencing bool) historyResult {
	t.Helper()
	res, _ := runHistoryHolding(t, h, size, fencing, nil)
	return res
}

// runHistoryHolding is runHistory where, with hold set, each group meets a
// random few of the accounts' mark rows held by another transaction (locked,
// updated but not committed, or being created): the group decides its other
// members, the rows are released, and the members it left Alone are admitted
// one by one in arrival order, as the dispatcher does. It returns the order in
// which the submissions were decided: h with each group's Alone members moved
// after its decided ones.
func runHistoryHolding(t *testing.T, h []histEvent, size int, fencing bool, hold *rand.Rand) (historyResult, []histEvent) {
	t.Helper()
	ctx := context.Background()
	url := pgtest.PaydbURL(t)
	store, err := OpenStore(ctx, url, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var adms []Admission
	var pending []Submission
	var decided []histEvent
	heldInGroup := 0
	admitGroup := func(subs []Submission) []MemberResult {
		if hold == nil {
			return store.AdmitGroup(ctx, subs, fencing, time.Minute)
		}
		accounts := []string{"acct-a", "acct-b", "acct-c", "acct-d", "acct-e"}
		held := map[string]bool{}
		tx, err := store.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		for range hold.IntN(3) {
			acct := accounts[hold.IntN(len(accounts))]
			held[acct] = true
			q := `SELECT highest_token FROM rail_high_water WHERE account_id = $1 FOR UPDATE`
			if hold.IntN(2) == 0 { // updated and not committed, or created and not committed
				q = `INSERT INTO rail_high_water AS h (account_id, highest_token, updated_at) VALUES ($1, 1, now())
				     ON CONFLICT (account_id) DO UPDATE SET updated_at = h.updated_at`
			}
			if _, err := tx.Exec(ctx, q, acct); err != nil {
				t.Fatal(err)
			}
		}
		conn, err := store.acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out, fellBack := store.admitGroupConn(ctx, conn, subs, fencing, time.Minute)
		conn.release()
		if fellBack != nil {
			t.Fatalf("a group meeting held mark rows fell back: %v", fellBack)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		for i, r := range out {
			if r.Alone != held[subs[i].AccountID] {
				t.Fatalf("member %d of %s: alone=%v, its row held=%v", i, subs[i].AccountID, r.Alone, held[subs[i].AccountID])
			}
			if r.Alone {
				heldInGroup++
			}
		}
		return out
	}
	flush := func() {
		for len(pending) > 0 {
			n := min(size, len(pending))
			res := admitGroup(pending[:n])
			var alone []int
			for i, r := range res {
				if r.Alone {
					alone = append(alone, i)
					continue
				}
				if r.Err != nil {
					t.Fatalf("group member %d (%+v): %v", i, pending[i], r.Err)
				}
				adms = append(adms, r.Admission)
				sub := pending[i]
				decided = append(decided, histEvent{sub: &sub})
			}
			for _, i := range alone {
				a, err := store.Admit(ctx, pending[i], fencing, false, time.Minute)
				if err != nil {
					t.Fatalf("group member %d (%+v) alone: %v", i, pending[i], err)
				}
				adms = append(adms, a)
				sub := pending[i]
				decided = append(decided, histEvent{sub: &sub})
			}
			pending = pending[n:]
		}
	}
	for i, e := range h {
		if e.sub == nil {
			flush()
			decided = append(decided, e)
			if _, err := store.pool.Exec(ctx, `UPDATE rail_submission
			   SET outcome = CASE WHEN (hashtext(payout_id) & 3) = 0 THEN 'UNSENT' ELSE 'ACKED' END,
			       rail_reference = CASE WHEN (hashtext(payout_id) & 3) = 0 THEN NULL ELSE 'r-' || payout_id END,
			       resolved_at = clock_timestamp()
			 WHERE outcome IS NULL`); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if size == 0 {
			a, err := store.Admit(ctx, *e.sub, fencing, false, time.Minute)
			if err != nil {
				t.Fatalf("event %d (%+v): %v", i, *e.sub, err)
			}
			adms = append(adms, a)
			decided = append(decided, e)
			continue
		}
		pending = append(pending, *e.sub)
	}
	flush()
	if hold != nil && heldInGroup == 0 {
		t.Fatal("no group met a held mark row")
	}

	rank := map[int64]int{}
	var res historyResult
	rows, err := store.pool.Query(ctx, `SELECT submission_id, payout_id, account_id, owner_id, idempotency_key, currency,
	       beneficiary, presented_token, amount_minor, coalesce(outcome, ''), coalesce(rail_reference, ''),
	       coalesce(decline_reason, ''), resolved_at IS NOT NULL, interrupt_at IS NOT NULL
	  FROM rail_submission ORDER BY submission_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		var r rowView
		if err := rows.Scan(&id, &r.Payout, &r.Account, &r.Owner, &r.Key, &r.Currency, &r.Beneficiary, &r.Token, &r.Amount,
			&r.Outcome, &r.RailReference, &r.DeclineReason, &r.Resolved, &r.HasInterrupt); err != nil {
			t.Fatal(err)
		}
		rank[id] = len(rank) + 1
		r.ID = rank[id]
		res.Rows = append(res.Rows, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, a := range adms {
		v := verdictView{Verdict: a.Verdict, ID: rank[a.SubmissionID], PassedFence: a.PassedFence, HighestToken: a.HighestToken}
		if v.ID == 0 {
			t.Fatalf("admission %+v names no row", a)
		}
		if a.First != nil {
			v.FirstID, v.FirstOutcome = rank[a.First.SubmissionID], deref(a.First.Outcome)
		}
		res.Verdicts = append(res.Verdicts, v)
	}
	res.Marks = map[string]int64{}
	mrows, err := store.pool.Query(ctx, "SELECT account_id, highest_token FROM rail_high_water")
	if err != nil {
		t.Fatal(err)
	}
	for mrows.Next() {
		var a string
		var m int64
		if err := mrows.Scan(&a, &m); err != nil {
			t.Fatal(err)
		}
		res.Marks[a] = m
	}
	if err := mrows.Err(); err != nil {
		t.Fatal(err)
	}
	return res, decided
}

// Random histories admitted through groups of 1, 2, 7
// and 64 give the verdicts, rows and marks of the same history admitted one by
// one in the same order — with fencing on and off.
func TestGroupAdmissionEqualsOneByOne(t *testing.T) {
	t.Parallel()
	for _, fencing := range []bool{true, false} {
		for seed := range uint64(2) {
			t.Run(fmt.Sprintf("fencing=%v/seed=%d", fencing, seed), func(t *testing.T) {
				t.Parallel()
				h := randomHistory(rand.New(rand.NewPCG(seed, 10)), 240)
				want := runHistory(t, h, 0, fencing)
				counts := map[Verdict]int{}
				for _, v := range want.Verdicts {
					counts[v.Verdict]++
				}
				if fencing && (counts[Admitted] == 0 || counts[Fenced] == 0 || counts[Duplicate] == 0) {
					t.Fatalf("the history does not exercise every verdict: %v", counts)
				}
				for _, size := range []int{1, 2, 7, 64} {
					got := runHistory(t, h, size, fencing)
					if diff := compareHistory(want, got); diff != "" {
						t.Errorf("groups of %d differ from one by one:\n%s", size, diff)
					}
				}
			})
		}
	}
}

// Groups meeting mark rows other transactions hold: each group decides its
// members whose rows are free exactly as one by one would in arrival order, and
// the members it leaves Alone, admitted one by one after it, get one by one's
// verdicts too — the history equals the one-by-one admission of the order in
// which the submissions were decided — with fencing on and off.
func TestGroupAdmissionMeetingHeldRowsEqualsOneByOne(t *testing.T) {
	t.Parallel()
	for _, fencing := range []bool{true, false} {
		t.Run(fmt.Sprintf("fencing=%v", fencing), func(t *testing.T) {
			t.Parallel()
			h := randomHistory(rand.New(rand.NewPCG(7, 10)), 240)
			for _, size := range []int{2, 7, 64} {
				got, order := runHistoryHolding(t, h, size, fencing, rand.New(rand.NewPCG(uint64(size), 20)))
				want := runHistory(t, order, 0, fencing)
				if diff := compareHistory(want, got); diff != "" {
					t.Errorf("groups of %d meeting held rows differ from one by one in their order of decision:\n%s", size, diff)
				}
			}
		})
	}
}

func compareHistory(want, got historyResult) string {
	var b strings.Builder
	for i := range max(len(want.Verdicts), len(got.Verdicts)) {
		var w, g verdictView
		if i < len(want.Verdicts) {
			w = want.Verdicts[i]
		}
		if i < len(got.Verdicts) {
			g = got.Verdicts[i]
		}
		if w != g && b.Len() < 4000 {
			fmt.Fprintf(&b, "verdict %d: one by one %+v, grouped %+v\n", i, w, g)
		}
	}
	for i := range max(len(want.Rows), len(got.Rows)) {
		var w, g rowView
		if i < len(want.Rows) {
			w = want.Rows[i]
		}
		if i < len(got.Rows) {
			g = got.Rows[i]
		}
		if w != g && b.Len() < 4000 {
			fmt.Fprintf(&b, "row %d: one by one %+v, grouped %+v\n", i, w, g)
		}
	}
	if !reflect.DeepEqual(want.Marks, got.Marks) {
		fmt.Fprintf(&b, "marks: one by one %v, grouped %v\n", want.Marks, got.Marks)
	}
	return b.String()
}

// Within one group: a later submission of an account meets the mark as the
// earlier ones advanced it, and two submissions of one payout give one intent
// and one DUPLICATE naming it.
func TestGroupSeesItsOwnEarlierMembers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, err := OpenStore(ctx, pgtest.PaydbURL(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	mk := func(p, acct string, tok int64) Submission {
		return Submission{PayoutID: p, AccountID: acct, Token: tok, OwnerID: "w", IdempotencyKey: p, AmountMinor: 1,
			Currency: "EUR", Beneficiary: "b"}
	}
	res := store.AdmitGroup(ctx, []Submission{mk("p1", "a", 5), mk("p2", "a", 5), mk("p3", "a", 4), mk("p1", "a", 6),
		mk("p4", "a", 7)}, true, time.Minute)
	want := []struct {
		v    Verdict
		mark int64
	}{{Admitted, 0}, {Fenced, 5}, {Fenced, 5}, {Duplicate, 0}, {Admitted, 0}}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("member %d: %v", i, r.Err)
		}
		if r.Admission.Verdict != want[i].v || r.Admission.HighestToken != want[i].mark {
			t.Errorf("member %d: %+v, want verdict %d mark %d", i, r.Admission, want[i].v, want[i].mark)
		}
	}
	if f := res[3].Admission.First; f == nil || f.SubmissionID != res[0].Admission.SubmissionID || f.Outcome != nil {
		t.Errorf("the DUPLICATE's first attempt is %+v, want the group's own intent %d, unresolved", f, res[0].Admission.SubmissionID)
	}
	if m := mark(t, store.pool, "a"); m != 7 {
		t.Errorf("mark %d, want 7", m)
	}
}

// One member whose values PostgreSQL refuses (a NUL byte in a
// text column is SQLSTATE 22021) fails alone; the others of its group are
// admitted as they would have been one by one.
func TestGroupMemberPostgresRefusesFailsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, err := OpenStore(ctx, pgtest.PaydbURL(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	subs := make([]Submission, 5)
	for i := range subs {
		subs[i] = Submission{PayoutID: fmt.Sprintf("p%d", i), AccountID: fmt.Sprintf("a%d", i%2), Token: int64(10 + i),
			OwnerID: "w", IdempotencyKey: "k", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}
	}
	subs[2].Beneficiary = "bad\x00byte"
	res := store.AdmitGroup(ctx, subs, true, time.Minute)
	for i, r := range res {
		if i == 2 {
			if r.Err == nil {
				t.Errorf("the member with a NUL byte was admitted: %+v", r.Admission)
			}
			continue
		}
		if r.Err != nil || r.Admission.Verdict != Admitted {
			t.Errorf("member %d: %+v %v; want admitted", i, r.Admission, r.Err)
		}
	}
	if n := countRows(t, store.pool); n != 4 {
		t.Errorf("%d rows, want the 4 good members'", n)
	}
}

// Group resolution reports, per row, whether it changed it: a row resolved
// before (by the janitor, say) is not overwritten and reported false.
func TestResolveGroupReportsRowsItDidNotChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, err := OpenStore(ctx, pgtest.PaydbURL(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var ids []int64
	for i := range 3 {
		a, err := store.Admit(ctx, Submission{PayoutID: fmt.Sprintf("p%d", i), AccountID: "a", Token: int64(i + 1),
			OwnerID: "w", IdempotencyKey: "k", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}, true, false, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, a.SubmissionID)
	}
	if ok, err := store.Resolve(ctx, ids[1], lockapi.OutcomeTimeout, nil, nil); !ok || err != nil {
		t.Fatal(ok, err)
	}
	ref, reason := "r-0", "NO_FUNDS"
	wrote, err := store.ResolveGroup(ctx, []resolution{{id: ids[0], outcome: lockapi.OutcomeAcked, railRef: &ref},
		{id: ids[1], outcome: lockapi.OutcomeAcked, railRef: &ref}, {id: ids[2], outcome: lockapi.OutcomeRejected, reason: &reason},
		{id: 999999, outcome: lockapi.OutcomeUnsent}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, false, true, false}; !reflect.DeepEqual(wrote, want) {
		t.Errorf("wrote %v, want %v", wrote, want)
	}
	for i, want := range []string{lockapi.OutcomeAcked, lockapi.OutcomeTimeout, lockapi.OutcomeRejected} {
		a, err := store.Attempt(ctx, ids[i])
		if err != nil || deref(a.Outcome) != want {
			t.Errorf("row %d: %v %v, want %s", ids[i], deref(a.Outcome), err, want)
		}
	}
}

// The group statement never scans a table. rail_admit_group's plans are
// generic, made at a connection's first calls — often on tables whose statistics
// say "empty" (a fresh paydb) — and kept for the life of the connection; a
// sequential scan chosen then would read the whole of rail_high_water or
// rail_submission on every group once they have grown. (Seen failing with the
// function's SET enable_seqscan = off removed: 40 and 20 scans.)
func TestGroupAdmissionNeverScansSequentially(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, err := OpenStore(ctx, pgtest.PaydbURL(t), 1) // one connection: one backend, its plans, its counters
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	exec := func(sql string) {
		t.Helper()
		if _, err := store.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// No ANALYZE behind the test's back: it would make PostgreSQL plan again.
	exec(`ALTER TABLE rail_high_water SET (autovacuum_enabled = false)`)
	exec(`ALTER TABLE rail_submission SET (autovacuum_enabled = false)`)
	// Statistics that say "empty", as a fresh paydb's first VACUUM leaves them:
	// the planner's cheapest way to read an empty table is to scan it.
	exec(`VACUUM ANALYZE rail_high_water`)
	exec(`VACUUM ANALYZE rail_submission`)
	tok := int64(0)
	group := func(round int) {
		t.Helper()
		subs := make([]Submission, 6)
		for i := range subs {
			tok++
			subs[i] = Submission{PayoutID: fmt.Sprintf("p-%d-%d", round, i), AccountID: fmt.Sprintf("a%d", i%3), Token: tok,
				OwnerID: "w", IdempotencyKey: "k", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}
		}
		for i, r := range store.AdmitGroup(ctx, subs, true, time.Minute) {
			if r.Err != nil || r.Admission.Verdict != Admitted {
				t.Fatalf("round %d member %d: %+v %v", round, i, r.Admission, r.Err)
			}
		}
	}
	// The connection's first groups, on nearly empty tables: plans made here.
	for round := range 8 {
		group(round)
	}
	exec(`INSERT INTO rail_high_water (account_id, highest_token, updated_at)
	      SELECT 'filler-' || g, 1, now() FROM generate_series(1, 20000) g`)
	exec(`INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor,
	             currency, beneficiary, outcome, rail_reference, resolved_at)
	      SELECT 'filler-' || g, 'filler-' || g, 1, 'w', 'k', 1, 'EUR', 'b', 'ACKED', 'r', clock_timestamp()
	        FROM generate_series(1, 20000) g`)
	seqScans := func() (marks, subs int64) {
		t.Helper()
		exec(`SELECT pg_stat_force_next_flush()`)
		exec(`SELECT pg_stat_clear_snapshot()`)
		if err := store.pool.QueryRow(ctx, `SELECT
		        (SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'rail_high_water'),
		        (SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'rail_submission')`).Scan(&marks, &subs); err != nil {
			t.Fatal(err)
		}
		return marks, subs
	}
	m0, s0 := seqScans()
	for round := 8; round < 28; round++ {
		group(round)
	}
	m1, s1 := seqScans()
	if m1 != m0 || s1 != s0 {
		t.Errorf("20 groups on grown tables scanned rail_high_water %d times and rail_submission %d times sequentially, want 0",
			m1-m0, s1-s0)
	}
}
