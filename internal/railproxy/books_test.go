package railproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// The books tests (docs/contracts/books.md): with RAIL_PROXY_BOOKS_CHECK on, the
// gate admits a submission only when payment-resource's payout row holds it
// CLAIMED by this token and owner, with the same account, amount, currency and
// beneficiary. The payout rows are written here in the shape payment-resource
// writes them (created PENDING with a PENDING history row, then claimed:
// status CLAIMED, fence_token, claimed_by, and a CLAIMED history row).

// booksConfig is testConfig with the books check on, admitting one by one
// (maxGroup 1) or in groups.
func booksConfig(dbURL, railURL string, maxGroup int) Config {
	cfg := testConfig(dbURL, railURL)
	cfg.BooksCheck = true
	cfg.MaxGroup = maxGroup
	return cfg
}

// startBooks starts a rail-stub, a fresh paydb and a proxy checking the books
// (booksConfig) in front of them.
func startBooks(t *testing.T, maxGroup int) (*stub, *pgxpool.Pool, *proxy) {
	t.Helper()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	return rail, pgtest.Pool(t, dbURL), startProxy(t, booksConfig(dbURL, rail.URL, maxGroup))
}

// ledger is a payout row as the books hold it.
type ledger struct {
	payout
	Status string // PENDING, CLAIMED, or a final status
	Token  int64  // fence_token
	Owner  string // claimed_by; "" is NULL
}

// booked is the row that books p for a claim by owner under token: the one a
// submission of p with that token and owner passes.
func booked(p payout, token int64, owner string) ledger {
	return ledger{payout: p, Status: "CLAIMED", Token: token, Owner: owner}
}

// book writes r as payment-resource would: the payout created PENDING, then,
// unless r is PENDING, moved to r's status, fence token and owner; one history
// row per move.
func book(t testing.TB, db dbq, r ledger) {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Exec(ctx, `
		WITH p AS (INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary)
		           VALUES ($1, $2, $3, $4, $5) RETURNING payout_id)
		INSERT INTO payout_history (payout_id, status, fence_token) SELECT payout_id, 'PENDING', 0 FROM p`,
		r.PayoutID, r.AccountID, r.AmountMinor, r.Currency, r.Beneficiary); err != nil {
		t.Fatal(err)
	}
	if r.Status == "PENDING" {
		return
	}
	if _, err := db.Exec(ctx, `
		WITH m AS (UPDATE payout SET status = $2, fence_token = $3, claimed_by = NULLIF($4, ''), updated_at = now()
		            WHERE payout_id = $1 RETURNING payout_id, status, fence_token, claimed_by)
		INSERT INTO payout_history (payout_id, status, fence_token, owner_id) SELECT * FROM m`,
		r.PayoutID, r.Status, r.Token, r.Owner); err != nil {
		t.Fatal(err)
	}
}

// reclaim is payment-resource's claim of an already claimed payout under a
// higher token (claimSQL's condition), with its history row.
func reclaim(t testing.TB, db dbq, payoutID string, token int64, owner string) {
	t.Helper()
	tag, err := db.Exec(context.Background(), `
		WITH m AS (UPDATE payout SET status = 'CLAIMED', fence_token = $2, claimed_by = $3, updated_at = now()
		            WHERE payout_id = $1 AND status IN ('PENDING','CLAIMED') AND fence_token < $2
		        RETURNING payout_id, status, fence_token, claimed_by)
		INSERT INTO payout_history (payout_id, status, fence_token, owner_id) SELECT * FROM m`, payoutID, token, owner)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("re-claim of %s under %d: %v (%d rows)", payoutID, token, err, tag.RowsAffected())
	}
}

// present submits p with token as owner (submit's headers, another owner).
func present(t testing.TB, baseURL string, token int64, owner string, p payout) answer {
	t.Helper()
	a, err := tryPresent(baseURL, token, owner, p)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	return a
}

// tryPresent is present for a goroutine other than the test's.
func tryPresent(baseURL string, token int64, owner string, p payout) (answer, error) {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set(lockapi.HeaderFencingToken, strconv.FormatInt(token, 10))
	h.Set(lockapi.HeaderOwnerID, owner)
	h.Set(lockapi.HeaderIdempotencyKey, p.PayoutID+":"+strconv.FormatInt(token, 10))
	return tryPost(context.Background(), baseURL, h, p.body())
}

// breaks makes a row that books a submission fail exactly one books check,
// named as in lockapi.BooksMismatchOrder. not_found: no row at all.
var breaks = map[string]func(r *ledger) (write bool){
	lockapi.MismatchNotFound: func(*ledger) bool { return false },
	// A payout already final, claimed by this very token and owner.
	lockapi.MismatchNotClaimed: func(r *ledger) bool { r.Status = "PAID"; return true },
	lockapi.MismatchToken:      func(r *ledger) bool { r.Token--; return true },
	lockapi.MismatchOwner:      func(r *ledger) bool { r.Owner = "worker-2"; return true },
	lockapi.MismatchAccount:    func(r *ledger) bool { r.AccountID += "-other"; return true },
	lockapi.MismatchAmount:     func(r *ledger) bool { r.AmountMinor++; return true },
	lockapi.MismatchCurrency:   func(r *ledger) bool { r.Currency = "USD"; return true },
	// Compared exactly, as stored: the same IBAN written with spaces is another
	// beneficiary to the gate.
	lockapi.MismatchBeneficiary: func(r *ledger) bool { r.Beneficiary = "NL91 ABNA 0417 1643 00"; return true },
}

// bookBroken writes the row for p (token, worker-1) with the checks in failing
// broken, and reports whether it wrote one.
func bookBroken(t testing.TB, db dbq, p payout, token int64, failing ...string) {
	t.Helper()
	r := booked(p, token, "worker-1")
	write := true
	for _, f := range failing {
		write = breaks[f](&r) && write
	}
	if write {
		book(t, db, r)
	}
}

// The one-by-one statement's CASE is built from booksChecks; its names are the
// one order of lockapi, and every check can be broken on its own.
func TestBooksChecksFollowTheMismatchOrder(t *testing.T) {
	t.Parallel()
	var names []string
	for _, k := range booksChecks {
		names = append(names, k.name)
	}
	if !slices.Equal(names, lockapi.BooksMismatchOrder()) {
		t.Fatalf("booksChecks %v, lockapi.BooksMismatchOrder %v", names, lockapi.BooksMismatchOrder())
	}
	at := -1
	for _, k := range booksChecks {
		i := strings.Index(admitBooksSQL, "WHEN "+k.fails+" THEN '"+k.name+"'")
		if i <= at {
			t.Fatalf("admitBooksSQL does not test %s (%s) after the checks before it:\n%s", k.name, k.fails, admitBooksSQL)
		}
		at = i
	}
	for _, n := range lockapi.BooksMismatchOrder() {
		if breaks[n] == nil {
			t.Errorf("no way to break %s", n)
		}
	}
}

// Each books check refuses at the gate on its own: 409 NOT_IN_BOOKS naming it,
// exactly one UNBOOKED row (resolved at once), no rail call, the account's mark
// unchanged, rail_submission_total{outcome="unbooked"} and its duration counted
// once, and unbooked_submission at WARN with the beneficiary masked. One by one
// and in groups alike.
func TestBooksRefuseEachMismatchAtTheGate(t *testing.T) {
	t.Parallel()
	for _, maxGroup := range []int{1, DefaultMaxGroup} {
		t.Run(fmt.Sprintf("maxGroup=%d", maxGroup), func(t *testing.T) {
			t.Parallel()
			rail, db, p := startBooks(t, maxGroup)

			for i, kind := range lockapi.BooksMismatchOrder() {
				acct := "acct-" + kind
				// The account has a mark of 5, from a booked submission.
				seed := newPayout("p-seed-"+kind, acct)
				book(t, db, booked(seed, 5, "worker-1"))
				if a := submit(t, p.URL, 5, seed); a.Status != http.StatusOK {
					t.Fatalf("%s: the booked seed: %+v", kind, a)
				}
				before := metric(t, p, `rail_submission_total{outcome="unbooked"}`)
				beforeDur := metric(t, p, `rail_submission_duration_seconds_count{outcome="unbooked"}`)

				sub := newPayout("p-"+kind, acct)
				bookBroken(t, db, sub, 7, kind)
				a := submit(t, p.URL, 7, sub)
				if a.Status != http.StatusConflict || a.code() != lockapi.CodeNotInBooks || a.str("mismatch") != kind ||
					a.int("presentedToken") != 7 || a.int("submissionId") <= 0 {
					t.Fatalf("%s: %+v", kind, a)
				}
				rs := rowsOf(t, db, sub.PayoutID)
				if len(rs) != 1 || outcomeOf(rs[0]) != lockapi.OutcomeUnbooked || rs[0].ID != a.int("submissionId") ||
					rs[0].Token != 7 || rs[0].ResolvedAt == nil {
					t.Fatalf("%s: rows %+v", kind, rs)
				}
				if n := rail.callsFor(t, sub.PayoutID); n != 0 {
					t.Fatalf("%s: the rail was called %d times", kind, n)
				}
				if got := mark(t, db, acct); got != 5 {
					t.Fatalf("%s: mark %d, want 5", kind, got)
				}
				if v := metric(t, p, `rail_submission_total{outcome="unbooked"}`); v != before+1 {
					t.Fatalf("%s: rail_submission_total{unbooked} %v, was %v", kind, v, before)
				}
				if v := metric(t, p, `rail_submission_duration_seconds_count{outcome="unbooked"}`); v != beforeDur+1 {
					t.Fatalf("%s: rail_submission_duration_seconds_count{unbooked} %v, was %v", kind, v, beforeDur)
				}
				ev := p.Logs.events("unbooked_submission")
				if len(ev) != i+1 {
					t.Fatalf("%s: %d unbooked_submission lines, want %d", kind, len(ev), i+1)
				}
				e := ev[i]
				if e["level"] != "WARN" || e["payoutId"] != sub.PayoutID || e["accountId"] != acct || e["ownerId"] != "worker-1" ||
					e["mismatch"] != kind || fmt.Sprint(e["presentedToken"]) != "7" ||
					e["beneficiary"] != lockapi.MaskBeneficiary(sub.Beneficiary) {
					t.Fatalf("%s: unbooked_submission %v", kind, e)
				}
			}
			if logs := p.Logs.String(); strings.Contains(logs, "NL91ABNA0417164300") {
				t.Fatal("a log line carries a beneficiary in full")
			}
			// An account without a mark row gets none from a refused submission.
			lone := newPayout("p-lone", "acct-lone")
			if a := submit(t, p.URL, 3, lone); a.code() != lockapi.CodeNotInBooks {
				t.Fatalf("unbooked on an account without a mark: %+v", a)
			}
			var n int
			if err := db.QueryRow(context.Background(), `SELECT count(*) FROM rail_high_water WHERE account_id = 'acct-lone'`).Scan(&n); err != nil || n != 0 {
				t.Fatalf("mark rows of acct-lone: %d (%v)", n, err)
			}
		})
	}
}

// A submission failing checks k, k+1, … names the first: k. For every k of the
// order, on an account without a mark row.
func TestBooksNameTheFirstFailingCheck(t *testing.T) {
	t.Parallel()
	rail, db, p := startBooks(t, 1)
	order := lockapi.BooksMismatchOrder()
	for k := range order {
		sub := newPayout(fmt.Sprintf("p-first-%d", k), fmt.Sprintf("acct-first-%d", k))
		bookBroken(t, db, sub, 9, order[k:]...)
		a := submit(t, p.URL, 9, sub)
		if a.code() != lockapi.CodeNotInBooks || a.str("mismatch") != order[k] {
			t.Errorf("failing %v: %+v", order[k:], a)
		}
	}
	if calls := rail.calls(t); len(calls) != 0 {
		t.Fatalf("the rail was called: %+v", calls)
	}
}

// The fence verdict comes before the books: with fencing on, a token at or below
// the mark is FENCED_OUT whatever the books say, the mark unchanged; with fencing
// off the fence is skipped and the books refuse an unbooked stale token.
func TestBooksAfterTheFence(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, booksConfig(dbURL, rail.URL, 1))
	seed := newPayout("p-mark", "acct-order")
	book(t, db, booked(seed, 10, "worker-1"))
	if a := submit(t, p.URL, 10, seed); a.Status != http.StatusOK {
		t.Fatalf("seed: %+v", a)
	}
	for _, token := range []int64{9, 10} {
		sub := newPayout(fmt.Sprintf("p-stale-%d", token), "acct-order") // booked nowhere
		a := submit(t, p.URL, token, sub)
		if a.code() != lockapi.CodeFencedOut || a.int("highestToken") != 10 || a.int("presentedToken") != token {
			t.Fatalf("unbooked token %d under mark 10: %+v", token, a)
		}
		if rs := rowsOf(t, db, sub.PayoutID); len(rs) != 1 || outcomeOf(rs[0]) != lockapi.OutcomeFenced {
			t.Fatalf("rows of %s: %+v", sub.PayoutID, rs)
		}
	}
	// Booked by another token, presented with a stale one: the fence answers too.
	other := newPayout("p-stale-booked", "acct-order")
	book(t, db, booked(other, 11, "worker-1"))
	if a := submit(t, p.URL, 8, other); a.code() != lockapi.CodeFencedOut {
		t.Fatalf("stale token on a payout booked under 11: %+v", a)
	}
	if got := mark(t, db, "acct-order"); got != 10 {
		t.Fatalf("mark %d, want 10", got)
	}
	if ev := p.Logs.events("unbooked_submission"); len(ev) != 0 {
		t.Fatalf("unbooked_submission for fenced submissions: %v", ev)
	}

	// Fencing off: no fence verdict, so the books answer a stale unbooked token,
	// and a stale booked one is admitted without lowering the mark.
	cfg := booksConfig(dbURL, rail.URL, 1)
	cfg.FencingEnabled = false
	off := startProxy(t, cfg)
	if a := submit(t, off.URL, 4, newPayout("p-off-unbooked", "acct-order")); a.code() != lockapi.CodeNotInBooks ||
		a.str("mismatch") != lockapi.MismatchNotFound {
		t.Fatalf("fencing off, unbooked stale token: %+v", a)
	}
	stale := newPayout("p-off-booked", "acct-order")
	book(t, db, booked(stale, 4, "worker-1"))
	if a := submit(t, off.URL, 4, stale); a.Status != http.StatusOK {
		t.Fatalf("fencing off, booked stale token: %+v", a)
	}
	if got := mark(t, db, "acct-order"); got != 10 {
		t.Fatalf("mark %d after fencing off, want 10", got)
	}
	if calls := rail.calls(t); len(calls) != 2 || calls[0].Reference != "p-mark" || calls[1].Reference != "p-off-booked" {
		t.Fatalf("rail calls: %+v", calls)
	}
}

// A booked submission is admitted and forwarded as booked, and it advances the
// mark; the same payout, once final, is NOT_IN_BOOKS (not_claimed) to any later
// token.
func TestBooksAdmitBookedAndRefuseFinal(t *testing.T) {
	t.Parallel()
	rail, db, p := startBooks(t, 1)
	sub := newPayout("p-ok", "acct-ok")
	book(t, db, booked(sub, 7, "worker-1"))
	a := submit(t, p.URL, 7, sub)
	if a.Status != http.StatusOK || a.str("outcome") != lockapi.OutcomeAcked {
		t.Fatalf("booked: %+v", a)
	}
	if got := mark(t, db, "acct-ok"); got != 7 {
		t.Fatalf("mark %d, want 7", got)
	}
	calls := rail.calls(t)
	if len(calls) != 1 || calls[0].Reference != sub.PayoutID || calls[0].AccountID != sub.AccountID ||
		calls[0].AmountMinor != sub.AmountMinor || calls[0].Currency != sub.Currency || calls[0].Beneficiary != sub.Beneficiary {
		t.Fatalf("rail calls: %+v", calls)
	}
	// payment-resource posts it PAID.
	if _, err := db.Exec(context.Background(), `UPDATE payout SET status = 'PAID', rail_reference = $2 WHERE payout_id = $1`,
		sub.PayoutID, a.str("railReference")); err != nil {
		t.Fatal(err)
	}
	r := present(t, p.URL, 8, "worker-1", sub)
	if r.code() != lockapi.CodeNotInBooks || r.str("mismatch") != lockapi.MismatchNotClaimed {
		t.Fatalf("a final payout presented again: %+v", r)
	}
	if got := mark(t, db, "acct-ok"); got != 7 {
		t.Fatalf("mark %d after the refused final payout, want 7", got)
	}
	if n := rail.callsFor(t, sub.PayoutID); n != 1 {
		t.Fatalf("rail calls of the final payout: %d", n)
	}
}

// A payout re-claimed under a newer token and presented again (the executor's
// reconcile pass) passes the books and is DUPLICATE_SUBMISSION, whose first*
// members describe the first attempt as it was presented — taken from its row,
// so an earlier presentation with another beneficiary (made through a gate that
// did not check the books) shows.
func TestBooksReclaimedPayoutIsDuplicateWithTheFirstAttempt(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, booksConfig(dbURL, rail.URL, 1))

	honest := newPayout("p-again", "acct-again")
	book(t, db, booked(honest, 7, "worker-1"))
	first := submit(t, p.URL, 7, honest)
	if first.Status != http.StatusOK {
		t.Fatalf("first: %+v", first)
	}
	reclaim(t, db, honest.PayoutID, 8, "worker-1")
	d := submit(t, p.URL, 8, honest)
	if d.code() != lockapi.CodeDuplicateSubmission || d.int("firstSubmissionId") != first.int("submissionId") ||
		d.str("firstOutcome") != lockapi.OutcomeAcked || d.str("firstRailReference") != first.str("railReference") ||
		d.str("firstAccountId") != honest.AccountID || d.int("firstAmountMinor") != honest.AmountMinor ||
		d.str("firstCurrency") != honest.Currency || d.str("firstBeneficiary") != honest.Beneficiary {
		t.Fatalf("re-claimed and presented again: %+v", d)
	}

	// The insider's presentation, through a gate without the books check, under
	// the genuine lease but to another beneficiary; then the honest one.
	cfg := testConfig(dbURL, rail.URL) // books off
	insiderGate := startProxy(t, cfg)
	victim := newPayout("p-victim", "acct-victim")
	book(t, db, booked(victim, 3, "worker-1"))
	redirected := victim
	redirected.Beneficiary = "GB33BUKB20201555555555"
	if a := submit(t, insiderGate.URL, 3, redirected); a.Status != http.StatusOK {
		t.Fatalf("the insider's presentation: %+v", a)
	}
	reclaim(t, db, victim.PayoutID, 4, "worker-1")
	d = submit(t, p.URL, 4, victim)
	if d.code() != lockapi.CodeDuplicateSubmission || d.str("firstBeneficiary") != redirected.Beneficiary ||
		d.str("firstAccountId") != victim.AccountID || d.int("firstAmountMinor") != victim.AmountMinor ||
		d.str("firstCurrency") != victim.Currency || d.str("firstOutcome") != lockapi.OutcomeAcked {
		t.Fatalf("the honest presentation after the insider's: %+v", d)
	}
}

// The audit trail's entries carry what each attempt presented: account, amount,
// currency and beneficiary, an UNBOOKED attempt's too.
func TestAuditTrailCarriesWhatWasPresented(t *testing.T) {
	t.Parallel()
	_, db, p := startBooks(t, 1)
	sub := newPayout("p-trail", "acct-trail")
	book(t, db, booked(sub, 2, "worker-1"))
	wrong := sub
	wrong.AmountMinor, wrong.Beneficiary = 99999999, "GB33BUKB20201555555555"
	if a := submit(t, p.URL, 1, wrong); a.code() != lockapi.CodeNotInBooks || a.str("mismatch") != lockapi.MismatchToken {
		t.Fatalf("wrong: %+v", a)
	}
	if a := submit(t, p.URL, 2, sub); a.Status != http.StatusOK {
		t.Fatalf("booked: %+v", a)
	}
	resp, err := testHTTP.Get(p.URL + "/v1/rail/submissions?payoutId=p-trail")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list lockapi.SubmissionList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	if len(list.Submissions) != 2 {
		t.Fatalf("trail: %+v", list)
	}
	for i, want := range []struct {
		p       payout
		outcome string
	}{{wrong, lockapi.OutcomeUnbooked}, {sub, lockapi.OutcomeAcked}} {
		e := list.Submissions[i]
		if e.AccountID != want.p.AccountID || e.AmountMinor != want.p.AmountMinor || e.Currency != want.p.Currency ||
			e.Beneficiary != want.p.Beneficiary || e.Outcome == nil || *e.Outcome != want.outcome {
			t.Errorf("entry %d: %+v, want %+v %s", i, e, want.p, want.outcome)
		}
	}
}

// RAIL_PROXY_BOOKS_CHECK: on by default; off, the start-up log says
// books_not_checked at ERROR, rail_proxy_books_check_enabled is 0, and a payout
// nobody booked is admitted and forwarded as before. On, the gauge is 1 and
// nothing is logged.
func TestBooksCheckSwitch(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if _, cfg, err := ParseConfigTo(nil, env(nil), io.Discard); err != nil || !cfg.BooksCheck {
		t.Fatalf("default: %v %v", cfg.BooksCheck, err)
	}
	if _, cfg, err := ParseConfigTo(nil, env(map[string]string{"RAIL_PROXY_BOOKS_CHECK": "false"}), io.Discard); err != nil || cfg.BooksCheck {
		t.Fatalf("false: %v %v", cfg.BooksCheck, err)
	}
	if _, _, err := ParseConfigTo(nil, env(map[string]string{"RAIL_PROXY_BOOKS_CHECK": "sometimes"}), io.Discard); err == nil ||
		!strings.Contains(err.Error(), "RAIL_PROXY_BOOKS_CHECK") {
		t.Fatalf("a bad value: %v", err)
	}

	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	off := startProxy(t, testConfig(dbURL, rail.URL))
	if ev := off.Logs.events("books_not_checked"); len(ev) != 1 || ev[0]["level"] != "ERROR" || ev[0]["service"] != "rail-proxy" ||
		ev[0]["setting"] != "RAIL_PROXY_BOOKS_CHECK" {
		t.Fatalf("books_not_checked: %v", ev)
	}
	if v := metric(t, off, "rail_proxy_books_check_enabled"); v != 0 {
		t.Fatalf("rail_proxy_books_check_enabled off = %v", v)
	}
	if a := submit(t, off.URL, 5, newPayout("p-nobody", "acct-sw")); a.Status != http.StatusOK {
		t.Fatalf("books off, a payout nobody booked: %+v", a)
	}
	if got := mark(t, db, "acct-sw"); got != 5 {
		t.Fatalf("mark %d, want 5", got)
	}
	on := startProxy(t, booksConfig(dbURL, rail.URL, DefaultMaxGroup))
	if ev := on.Logs.events("books_not_checked"); len(ev) != 0 {
		t.Fatalf("books_not_checked with the check on: %v", ev)
	}
	if v := metric(t, on, "rail_proxy_books_check_enabled"); v != 1 {
		t.Fatalf("rail_proxy_books_check_enabled on = %v", v)
	}
	if a := submit(t, on.URL, 6, newPayout("p-nobody-2", "acct-sw")); a.code() != lockapi.CodeNotInBooks {
		t.Fatalf("books on, a payout nobody booked: %+v", a)
	}
}

// Booked and unbooked submissions race on one account, each booked one
// presented twice at once, the highest token of all unbooked. Replayed in
// submission_id order (the order the account's mark row serialised them in),
// every verdict is the one the rules give: FENCED at or below the mark, then
// UNBOOKED for exactly the unbooked, ACKED above the mark for the booked, which
// alone move it. Each payout has at most one forwardable row, the rail saw each
// booked payout at most once and no unbooked one, and the mark ends at the
// highest booked token.
func TestBooksHoldUnderRacingSubmissions(t *testing.T) {
	t.Parallel()
	for _, maxGroup := range []int{1, DefaultMaxGroup} {
		t.Run(fmt.Sprintf("maxGroup=%d", maxGroup), func(t *testing.T) {
			t.Parallel()
			rail, db, p := startBooks(t, maxGroup)
			const acct, n = "acct-race", 48
			// The mark row exists before the race: every admission then waits
			// for it, so submission_id order is the order of their verdicts.
			seed := newPayout("p-race-0", acct)
			book(t, db, booked(seed, 1, "worker-1"))
			if a := submit(t, p.URL, 1, seed); a.Status != http.StatusOK {
				t.Fatalf("seed: %+v", a)
			}
			order := lockapi.BooksMismatchOrder()
			type presented struct {
				p      payout
				token  int64
				unbook string // the mismatch it is to be refused with; "" when booked
			}
			var subs []presented
			for i := 2; i <= n+1; i++ {
				s := presented{p: newPayout(fmt.Sprintf("p-race-%d", i), acct), token: int64(i)}
				if i%2 == 1 { // odd tokens, n+1 the highest of all, are unbooked
					s.unbook = order[i%len(order)]
					bookBroken(t, db, s.p, s.token, s.unbook)
				} else {
					book(t, db, booked(s.p, s.token, "worker-1"))
				}
				subs = append(subs, s)
			}
			type result struct {
				s presented
				a answer
			}
			// In a shuffled order, a booked payout's two copies one after the
			// other, taken by a bounded number of senders: as many at once as
			// the package's other races, so that every admission stays within
			// its bound on a loaded machine.
			queue := make(chan presented, 2*len(subs))
			rng := rand.New(rand.NewPCG(22, 9))
			for _, i := range rng.Perm(len(subs)) {
				queue <- subs[i]
				if subs[i].unbook == "" {
					queue <- subs[i]
				}
			}
			close(queue)
			results := make(chan result, 2*len(subs))
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() {
					for s := range queue {
						a, err := tryPresent(p.URL, s.token, "worker-1", s.p)
						if err != nil {
							a.Err = err
						}
						results <- result{s, a}
					}
				})
			}
			wg.Wait()
			close(results)
			for r := range results {
				switch {
				case r.a.Err != nil:
					t.Fatalf("%s: %v", r.s.p.PayoutID, r.a.Err)
				case r.s.unbook != "" && r.a.code() == lockapi.CodeNotInBooks && r.a.str("mismatch") != r.s.unbook:
					t.Errorf("%s: mismatch %s, want %s", r.s.p.PayoutID, r.a.str("mismatch"), r.s.unbook)
				case r.s.unbook != "" && r.a.code() != lockapi.CodeNotInBooks && r.a.code() != lockapi.CodeFencedOut:
					t.Errorf("unbooked %s answered %+v", r.s.p.PayoutID, r.a)
				case r.s.unbook == "" && r.a.Status != http.StatusOK && r.a.code() != lockapi.CodeFencedOut &&
					r.a.code() != lockapi.CodeDuplicateSubmission:
					t.Errorf("booked %s answered %+v", r.s.p.PayoutID, r.a)
				}
			}

			unbooked := map[string]bool{}
			for _, s := range subs {
				unbooked[s.p.PayoutID] = s.unbook != ""
			}
			rows, err := db.Query(context.Background(), `SELECT payout_id, presented_token, outcome FROM rail_submission
				WHERE account_id = $1 AND submission_id > (SELECT min(submission_id) FROM rail_submission WHERE payout_id = 'p-race-0')
				ORDER BY submission_id`, acct)
			if err != nil {
				t.Fatal(err)
			}
			replay := int64(1)
			forwardable := map[string]int{}
			perPayout := map[string]int{}
			for rows.Next() {
				var (
					id      string
					token   int64
					outcome *string
				)
				if err := rows.Scan(&id, &token, &outcome); err != nil {
					t.Fatal(err)
				}
				o := "NULL"
				if outcome != nil {
					o = *outcome
				}
				perPayout[id]++
				switch {
				case token <= replay:
					if o != lockapi.OutcomeFenced {
						t.Errorf("%s token %d under mark %d: %s, want FENCED", id, token, replay, o)
					}
				case unbooked[id]:
					if o != lockapi.OutcomeUnbooked {
						t.Errorf("unbooked %s token %d above mark %d: %s, want UNBOOKED", id, token, replay, o)
					}
				default:
					if o != lockapi.OutcomeAcked {
						t.Errorf("booked %s token %d above mark %d: %s, want ACKED", id, token, replay, o)
					}
					replay = token
				}
				if o == lockapi.OutcomeAcked || o == "NULL" {
					forwardable[id]++
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			rows.Close()
			if got := mark(t, db, acct); got != n || replay != n {
				t.Fatalf("mark %d (replayed %d), want %d: the highest booked token", got, replay, n)
			}
			for id, c := range forwardable {
				if c > 1 || unbooked[id] {
					t.Errorf("%s: %d forwardable rows (unbooked %v)", id, c, unbooked[id])
				}
			}
			calls := map[string]int{}
			for _, c := range rail.calls(t) {
				calls[c.Reference]++
			}
			for _, s := range subs {
				// A booked payout is forwarded once, or not at all when a higher
				// booked token passed the fence before both its copies.
				if c := calls[s.p.PayoutID]; c != forwardable[s.p.PayoutID] || c > 1 || s.unbook != "" && c != 0 {
					t.Errorf("%s: %d rail calls, %d forwardable rows (unbooked %v)", s.p.PayoutID, c, forwardable[s.p.PayoutID], s.unbook != "")
				}
				if s.unbook != "" && perPayout[s.p.PayoutID] != 1 {
					t.Errorf("unbooked %s: %d rows, want 1", s.p.PayoutID, perPayout[s.p.PayoutID])
				}
			}
		})
	}
}

// The fence verdict is given against the mark as it is now, not as the
// statement's snapshot saw it: the admission waits for a mark row another
// admission holds, and judges the value that admission committed. Here the holder
// raises the mark from 10 to 20 while an unbooked submission with 15 waits: it
// is FENCED_OUT under 20, not UNBOOKED under 10. On an account whose first mark
// row another admission is inserting, the upsert waits and compares.
func TestBooksJudgeTheMarkAsItIsNow(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	ctx := context.Background()
	store, err := OpenStore(ctx, dbURL, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	sub := func(id string, token int64) Submission {
		return Submission{PayoutID: id, AccountID: "acct-now", Token: token, OwnerID: "w", IdempotencyKey: id,
			AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}
	}
	book(t, db, booked(payout{PayoutID: "p-now-0", AccountID: "acct-now", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}, 10, "w"))
	if a, err := store.Admit(ctx, sub("p-now-0", 10), true, true, time.Minute); err != nil || a.Verdict != Admitted {
		t.Fatalf("seed: %+v %v", a, err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `UPDATE rail_high_water SET highest_token = 20 WHERE account_id = 'acct-now'`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		a   Admission
		err error
	}
	done := make(chan result, 1)
	go func() {
		a, err := store.Admit(ctx, sub("p-now-1", 15), true, true, time.Minute)
		done <- result{a, err}
	}()
	var early *result
	eventually(t, 10*time.Second, "the unbooked admission to wait for the held mark row", func() bool {
		select {
		case r := <-done:
			early = &r
			return true
		default:
		}
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%rail_high_water%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	if early != nil {
		t.Fatalf("the admission did not wait for the held mark row: %+v %v", early.a, early.err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.a.Verdict != Fenced || r.a.HighestToken != 20 {
		t.Fatalf("token 15 after the mark became 20: %+v %v, want FENCED under 20", r.a, r.err)
	}

	// An account with no mark row has nothing to lock: a booked submission is
	// arbitrated by the upsert, which waits for a concurrent first admission's
	// row and compares with it.
	book(t, db, booked(payout{PayoutID: "p-first-row", AccountID: "acct-new", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}, 15, "w"))
	tx, err = db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO rail_high_water (account_id, highest_token, updated_at) VALUES ('acct-new', 20, now())`); err != nil {
		t.Fatal(err)
	}
	go func() {
		s := sub("p-first-row", 15)
		s.AccountID = "acct-new"
		a, err := store.Admit(ctx, s, true, true, time.Minute)
		done <- result{a, err}
	}()
	early = nil
	eventually(t, 10*time.Second, "the booked admission to wait for the uncommitted first mark row", func() bool {
		select {
		case r := <-done:
			early = &r
			return true
		default:
		}
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%rail_high_water%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	if early != nil {
		t.Fatalf("the admission did not wait for the first mark row: %+v %v", early.a, early.err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r = <-done
	if r.err != nil || r.a.Verdict != Fenced || r.a.HighestToken != 20 || r.a.PassedFence {
		t.Fatalf("booked token 15 against a first mark of 20: %+v %v, want FENCED under 20", r.a, r.err)
	}
	if got := mark(t, db, "acct-new"); got != 20 {
		t.Fatalf("mark %d, want 20", got)
	}
}
