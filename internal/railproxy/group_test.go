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

// histEvent is one step of a random history: a submission; payment-resource's
// moves of some payouts (moves); or (neither) the resolution of every open
// intent — to UNSENT for some payouts (so they may be submitted again), ACKED
// for the others — as rail calls would between admissions.
type histEvent struct {
	sub   *Submission
	moves []payoutMove
	// want is, for a submission of a books history, the books check its
	// presentation was drawn to fail first, by lockapi.BooksMismatchOrder ("" when
	// drawn to pass); flaws is how many checks it was drawn to fail.
	want  string
	flaws int
}

// payoutMove is a payout row as payment-resource leaves it: created (PENDING),
// claimed by a holder (CLAIMED, with its token and owner), or final (PAID).
type payoutMove struct {
	Payout, Account, Owner, Currency, Beneficiary, Status string
	Token, Amount                                         int64
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

// randomBooksHistory is randomHistory with the books: payouts are created,
// claimed by newer holders (some by another owner), re-claimed, left PENDING or
// made final between admissions, and each submission presents either a payout
// exactly as booked or one drawn to fail some of the books checks — a payout
// nobody created, another token, owner, account, amount, currency or
// beneficiary, often several at once, so that the first in
// lockapi.BooksMismatchOrder is the one to name.
func randomBooksHistory(r *rand.Rand, n int) []histEvent {
	accounts := []string{"acct-a", "acct-b", "acct-c", "acct-d", "acct-e"}
	beneficiaries := []string{"NL91ABNA0417164300", "DE89370400440532013000"}
	top := map[string]int64{}
	books := map[string]payoutMove{}
	var ids []string
	var h []histEvent
	for len(h) < n {
		switch {
		case r.IntN(12) == 0:
			h = append(h, histEvent{})
			continue
		case len(ids) == 0 || r.IntN(10) == 0:
			var moves []payoutMove
			for range 1 + r.IntN(4) {
				var m payoutMove
				if len(ids) > 0 && r.IntN(3) == 0 {
					m = books[ids[r.IntN(len(ids))]] // re-claimed, or made final
				} else {
					acct := accounts[r.IntN(len(accounts))]
					m = payoutMove{Payout: fmt.Sprintf("p-%d", len(ids)), Account: acct, Currency: "EUR",
						Beneficiary: beneficiaries[r.IntN(2)], Amount: 100 + r.Int64N(1000), Status: "PENDING"}
					ids = append(ids, m.Payout)
				}
				switch x := r.IntN(10); {
				case x < 7 && m.Status != "PAID": // a newer holder claims it
					top[m.Account] += 1 + r.Int64N(2)
					m.Status, m.Token, m.Owner = "CLAIMED", top[m.Account], "w-"+m.Account
					if r.IntN(6) == 0 {
						m.Owner = "w-other"
					}
				case x < 9 && m.Status != "PENDING":
					m.Status = "PAID"
				}
				books[m.Payout] = m
				moves = append(moves, m)
			}
			h = append(h, histEvent{moves: moves})
			continue
		}
		var sub Submission
		want, flaws := "", 0
		if r.IntN(7) == 0 { // a payout nobody created
			acct := accounts[r.IntN(len(accounts))]
			p := fmt.Sprintf("ghost-%d", r.IntN(n/8+1))
			sub = Submission{PayoutID: p, AccountID: acct, Token: max(1, top[acct]-r.Int64N(3)+r.Int64N(3)),
				OwnerID: "w-" + acct, AmountMinor: 100, Currency: "EUR", Beneficiary: beneficiaries[0]}
			want, flaws = lockapi.MismatchNotFound, 1
		} else {
			m := books[ids[r.IntN(len(ids))]]
			sub = Submission{PayoutID: m.Payout, AccountID: m.Account, Token: m.Token, OwnerID: m.Owner,
				AmountMinor: m.Amount, Currency: m.Currency, Beneficiary: m.Beneficiary}
			if m.Status == "PENDING" { // nobody's claim to present: some holder's token
				sub.Token, sub.OwnerID = max(1, top[m.Account]), "w-"+m.Account
			}
			// Drawn to fail: a first check, each as likely, and some of the later
			// ones too.
			failed := map[string]bool{}
			if r.IntN(2) == 0 {
				checks := []string{lockapi.MismatchToken, lockapi.MismatchOwner, lockapi.MismatchAccount,
					lockapi.MismatchAmount, lockapi.MismatchCurrency, lockapi.MismatchBeneficiary}
				first := r.IntN(len(checks))
				failed[checks[first]] = true
				for _, c := range checks[first+1:] {
					if r.IntN(2) == 0 {
						failed[c] = true
					}
				}
			}
			if failed[lockapi.MismatchAccount] {
				for sub.AccountID == m.Account {
					sub.AccountID = accounts[r.IntN(len(accounts))]
				}
			}
			if failed[lockapi.MismatchToken] {
				// A stale holder's, a replayed older one's, or a newer one's.
				for sub.Token == m.Token {
					sub.Token = max(1, top[sub.AccountID]-r.Int64N(4)+r.Int64N(3))
				}
			}
			if failed[lockapi.MismatchOwner] {
				sub.OwnerID = "w-intruder"
			}
			if failed[lockapi.MismatchAmount] {
				sub.AmountMinor += 1 + r.Int64N(50)
			}
			if failed[lockapi.MismatchCurrency] {
				sub.Currency = "USD"
			}
			if failed[lockapi.MismatchBeneficiary] {
				sub.Beneficiary = beneficiaries[1]
				if m.Beneficiary == beneficiaries[1] {
					sub.Beneficiary = beneficiaries[0]
				}
			}
			if m.Status != "CLAIMED" {
				failed[lockapi.MismatchNotClaimed] = true
			}
			for _, c := range lockapi.BooksMismatchOrder() {
				if failed[c] && want == "" {
					want = c
				}
			}
			flaws = len(failed)
		}
		sub.IdempotencyKey = fmt.Sprintf("%s:%d", sub.PayoutID, sub.Token)
		h = append(h, histEvent{sub: &sub, want: want, flaws: flaws})
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
	Mismatch     string
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
// by one through Admit, today's path), with the books check as books says. A
// group never spans a resolution event or payment-resource's moves.
func runHistory(t *testing.T, h []histEvent, size int, fencing, books bool) historyResult {
	t.Helper()
	res, _ := runHistoryHolding(t, h, size, fencing, books, nil)
	return res
}

// movePayouts writes payment-resource's moves as it writes them: a payout is
// created (INSERT, PENDING), claimed (status CLAIMED, fence_token, claimed_by)
// or made final (status PAID, rail_reference).
func movePayouts(ctx context.Context, t *testing.T, db dbq, moves []payoutMove) {
	t.Helper()
	for _, m := range moves {
		if _, err := db.Exec(ctx, `INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary)
		        VALUES ($1, $2, $3, $4, $5) ON CONFLICT (payout_id) DO NOTHING`,
			m.Payout, m.Account, m.Amount, m.Currency, m.Beneficiary); err != nil {
			t.Fatal(err)
		}
		var err error
		switch m.Status {
		case "CLAIMED":
			_, err = db.Exec(ctx, `UPDATE payout SET status='CLAIMED', fence_token=$2, claimed_by=$3, updated_at=now()
			         WHERE payout_id=$1`, m.Payout, m.Token, m.Owner)
		case "PAID":
			_, err = db.Exec(ctx, `UPDATE payout SET status='PAID', rail_reference='r-'||payout_id, updated_at=now()
			         WHERE payout_id=$1`, m.Payout)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// runHistoryHolding is runHistory where, with hold set, each group meets a
// random few of the accounts' mark rows held by another transaction (locked,
// updated but not committed, or being created): the group decides its other
// members, the rows are released, and the members it left Alone are admitted
// one by one in arrival order, as the dispatcher does. It returns the order in
// which the submissions were decided: h with each group's Alone members moved
// after its decided ones.
//
// With books, a member of an account another transaction is creating is decided
// all the same when the group's members of that account are all refused by the
// books: no mark row is to be created for them, and one by one would not have
// waited for one either.
func runHistoryHolding(t *testing.T, h []histEvent, size int, fencing, books bool, hold *rand.Rand) (historyResult, []histEvent) {
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
			return store.AdmitGroup(ctx, subs, fencing, books, time.Minute)
		}
		accounts := []string{"acct-a", "acct-b", "acct-c", "acct-d", "acct-e"}
		held := map[string]bool{}
		marked := map[string]bool{} // accounts with a committed mark row
		for _, a := range accounts {
			marked[a] = mark(t, store.pool, a) != 0
		}
		tx, err := store.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		for range hold.IntN(3) {
			acct := accounts[hold.IntN(len(accounts))]
			q := `SELECT highest_token FROM rail_high_water WHERE account_id = $1 FOR UPDATE`
			if hold.IntN(2) == 0 { // updated and not committed, or created and not committed
				q = `INSERT INTO rail_high_water AS h (account_id, highest_token, updated_at) VALUES ($1, 1, now())
				     ON CONFLICT (account_id) DO UPDATE SET updated_at = h.updated_at`
			}
			tag, err := tx.Exec(ctx, q, acct)
			if err != nil {
				t.Fatal(err)
			}
			// A FOR UPDATE of an account with no row yet holds nothing.
			held[acct] = held[acct] || tag.RowsAffected() > 0
		}
		conn, err := store.acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out, fellBack := store.admitGroupConn(ctx, conn, subs, fencing, books, time.Minute)
		conn.release()
		if fellBack != nil {
			t.Fatalf("a group meeting held mark rows fell back: %v", fellBack)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		for i, r := range out {
			acct := subs[i].AccountID
			if books && held[acct] && !marked[acct] && !r.Alone && r.Err == nil && r.Admission.Verdict == Unbooked {
				continue // an account being created, none of whose members the books hold
			}
			if r.Alone != held[acct] {
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
				a, err := store.Admit(ctx, pending[i], fencing, books, time.Minute)
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
		if e.moves != nil {
			flush()
			decided = append(decided, e)
			movePayouts(ctx, t, store.pool, e.moves)
			continue
		}
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
			a, err := store.Admit(ctx, *e.sub, fencing, books, time.Minute)
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
		v := verdictView{Verdict: a.Verdict, ID: rank[a.SubmissionID], PassedFence: a.PassedFence, HighestToken: a.HighestToken,
			Mismatch: a.Mismatch}
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

// Random histories admitted through groups of 1, 2, 7 and 64 give the
// verdicts, rows and marks of the same history admitted one by one in the same
// order — with fencing on and off, and with the books check off and on. With
// the books, payouts are created, claimed and made final between admissions,
// and members are booked or refused by the books for every mismatch, often
// failing several checks at once: both paths must refuse the same members,
// name the same mismatch — the first failing check in
// lockapi.BooksMismatchOrder, as the history drew it — leave the same marks
// (none created or moved by a refused member) and write the same rows.
func TestGroupAdmissionEqualsOneByOne(t *testing.T) {
	t.Parallel()
	for _, books := range []bool{false, true} {
		for _, fencing := range []bool{true, false} {
			for seed := range uint64(2) {
				t.Run(fmt.Sprintf("books=%v/fencing=%v/seed=%d", books, fencing, seed), func(t *testing.T) {
					t.Parallel()
					var h []histEvent
					if books {
						h = randomBooksHistory(rand.New(rand.NewPCG(seed, 30)), 240)
					} else {
						h = randomHistory(rand.New(rand.NewPCG(seed, 10)), 240)
					}
					want := runHistory(t, h, 0, fencing, books)
					counts := map[Verdict]int{}
					for _, v := range want.Verdicts {
						counts[v.Verdict]++
					}
					if fencing && (counts[Admitted] == 0 || counts[Fenced] == 0 || counts[Duplicate] == 0) {
						t.Fatalf("the history does not exercise every verdict: %v", counts)
					}
					if books {
						checkBooksVerdicts(t, h, want.Verdicts, fencing)
					}
					for _, size := range []int{1, 2, 7, 64} {
						got := runHistory(t, h, size, fencing, books)
						if diff := compareHistory(want, got); diff != "" {
							t.Errorf("groups of %d differ from one by one:\n%s", size, diff)
						}
					}
				})
			}
		}
	}
}

// checkBooksVerdicts checks the one-by-one verdicts of a books history against
// what the history drew: a member drawn to pass the books is never UNBOOKED; one
// drawn to fail is FENCED or UNBOOKED naming the first failing check in
// lockapi.BooksMismatchOrder. And the history exercises what it is for: every
// mismatch, members failing several checks, and (fencing on) fenced members the
// books refuse too.
func checkBooksVerdicts(t *testing.T, h []histEvent, verdicts []verdictView, fencing bool) {
	t.Helper()
	named := map[string]int{}
	several, fencedUnbooked, i := 0, 0, 0
	for _, e := range h {
		if e.sub == nil {
			continue
		}
		v := verdicts[i]
		i++
		switch {
		case e.want == "" && v.Verdict == Unbooked:
			t.Errorf("%+v, drawn to pass the books: unbooked (%s)", *e.sub, v.Mismatch)
		case e.want != "" && v.Verdict == Fenced:
			fencedUnbooked++
		case e.want != "" && (v.Verdict != Unbooked || v.Mismatch != e.want):
			t.Errorf("%+v, drawn to fail %d checks, first %s: verdict %d mismatch %q", *e.sub, e.flaws, e.want, v.Verdict, v.Mismatch)
		case e.want != "":
			named[v.Mismatch]++
			if e.flaws > 1 {
				several++
			}
		}
	}
	for _, m := range lockapi.BooksMismatchOrder() {
		if named[m] == 0 {
			t.Errorf("no member refused for %s: %v", m, named)
		}
	}
	if several == 0 || fencing && fencedUnbooked == 0 {
		t.Errorf("%d members refused failing several checks, %d fenced whom the books refuse too; want some of each", several, fencedUnbooked)
	}
}

// Groups meeting mark rows other transactions hold: each group decides its
// members whose rows are free exactly as one by one would in arrival order, and
// the members it leaves Alone, admitted one by one after it, get one by one's
// verdicts too — the history equals the one-by-one admission of the order in
// which the submissions were decided — with fencing on and off, the books check
// off and on.
func TestGroupAdmissionMeetingHeldRowsEqualsOneByOne(t *testing.T) {
	t.Parallel()
	for _, books := range []bool{false, true} {
		for _, fencing := range []bool{true, false} {
			t.Run(fmt.Sprintf("books=%v/fencing=%v", books, fencing), func(t *testing.T) {
				t.Parallel()
				h := randomHistory(rand.New(rand.NewPCG(7, 10)), 240)
				if books {
					h = randomBooksHistory(rand.New(rand.NewPCG(7, 30)), 240)
				}
				for _, size := range []int{2, 7, 64} {
					got, order := runHistoryHolding(t, h, size, fencing, books, rand.New(rand.NewPCG(uint64(size), 20)))
					want := runHistory(t, order, 0, fencing, books)
					if diff := compareHistory(want, got); diff != "" {
						t.Errorf("groups of %d meeting held rows differ from one by one in their order of decision:\n%s", size, diff)
					}
				}
			})
		}
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
	// Made-up payouts, no payout row: the books check is off, this is about the
	// group's own earlier members.
	res := store.AdmitGroup(ctx, []Submission{mk("p1", "a", 5), mk("p2", "a", 5), mk("p3", "a", 4), mk("p1", "a", 6),
		mk("p4", "a", 7)}, true, false, time.Minute)
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
	// Made-up payouts, no payout row: the books check is off, this is about a
	// member PostgreSQL refuses.
	res := store.AdmitGroup(ctx, subs, true, false, time.Minute)
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

// The group statement never scans a table, with the books check off or on.
// rail_admit_group's plans are generic, made at a connection's first calls —
// often on tables whose statistics say "empty" (a fresh paydb) — and kept for
// the life of the connection; a sequential scan chosen then would read the whole
// of rail_high_water, rail_submission or payout on every group once they have
// grown. (Seen failing with the function's SET enable_seqscan = off removed: 40
// scans of rail_high_water and 20 of rail_submission, and with the books 20 of
// payout too.)
func TestGroupAdmissionNeverScansSequentially(t *testing.T) {
	t.Parallel()
	for _, books := range []bool{false, true} {
		t.Run(fmt.Sprintf("books=%v", books), func(t *testing.T) {
			t.Parallel()
			groupNeverScans(t, books)
		})
	}
}

func groupNeverScans(t *testing.T, books bool) {
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
	tables := []string{"rail_high_water", "rail_submission", "payout"}
	for _, table := range tables {
		// No ANALYZE behind the test's back: it would make PostgreSQL plan again.
		exec(`ALTER TABLE ` + table + ` SET (autovacuum_enabled = false)`)
		// Statistics that say "empty", as a fresh paydb's first VACUUM leaves
		// them: the planner's cheapest way to read an empty table is to scan it.
		exec(`VACUUM ANALYZE ` + table)
	}
	tok := int64(0)
	group := func(round int) {
		t.Helper()
		subs := make([]Submission, 6)
		for i := range subs {
			tok++
			subs[i] = Submission{PayoutID: fmt.Sprintf("p-%d-%d", round, i), AccountID: fmt.Sprintf("a%d", i%3), Token: tok,
				OwnerID: "w", IdempotencyKey: "k", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}
		}
		if books {
			// Booked as claimed, in one INSERT (an UPDATE of its own, planned on
			// "empty" statistics, could be the scan counted).
			exec(fmt.Sprintf(`INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary, status,
			        fence_token, claimed_by)
			      SELECT 'p-%d-' || i, 'a' || (i %% 3), 1, 'EUR', 'b', 'CLAIMED', %d + i, 'w' FROM generate_series(0, 5) i`,
				round, tok-5))
		}
		for i, r := range store.AdmitGroup(ctx, subs, true, books, time.Minute) {
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
	exec(`INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary, status, fence_token, claimed_by)
	      SELECT 'filler-' || g, 'filler-' || g, 1, 'EUR', 'b', 'PAID', 1, 'w' FROM generate_series(1, 20000) g`)
	seqScans := func() map[string]int64 {
		t.Helper()
		exec(`SELECT pg_stat_force_next_flush()`)
		exec(`SELECT pg_stat_clear_snapshot()`)
		out := map[string]int64{}
		for _, table := range tables {
			var n int64
			if err := store.pool.QueryRow(ctx, `SELECT seq_scan FROM pg_stat_user_tables WHERE relname = $1`, table).Scan(&n); err != nil {
				t.Fatal(err)
			}
			out[table] = n
		}
		return out
	}
	s0 := seqScans()
	for round := 8; round < 28; round++ {
		group(round)
	}
	s1 := seqScans()
	for _, table := range tables {
		if s1[table] != s0[table] {
			t.Errorf("20 groups on grown tables scanned %s %d times sequentially, want 0", table, s1[table]-s0[table])
		}
	}
}
