package payment_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/payment"
	"lock.dev/lockapi"
)

// Fence point (a), claim: a token not strictly above fence_token — equal
// included — is FENCED_OUT (counted, logged) and changes nothing; a higher token
// re-claims a CLAIMED payout.
func TestClaimFencePointA(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx := context.Background()
	e.create(t, "p-1", "acct-1", 1250)

	p := e.claim(t, "p-1", 5, "exec-a")
	if p.Status != lockapi.StatusClaimed || p.FenceToken != 5 || p.ClaimedBy == nil || *p.ClaimedBy != "exec-a" {
		t.Fatalf("claim answer = %+v, want CLAIMED, fenceToken 5, claimedBy exec-a", p)
	}
	before := e.snapshot(t)
	for _, tc := range []struct {
		token int64
		owner string
	}{{5, "exec-a"}, {5, "exec-b"}, {4, "exec-b"}, {1, "exec-a"}} {
		_, err := e.client.Claim(ctx, "p-1", tc.token, tc.owner)
		prob := asProblem(t, err, http.StatusConflict, lockapi.CodeFencedOut)
		if got := member[int64](t, prob, "presentedToken"); got != tc.token {
			t.Errorf("presentedToken = %d, want %d", got, tc.token)
		}
		if got := member[int64](t, prob, "fenceToken"); got != 5 {
			t.Errorf("fenceToken = %d, want 5", got)
		}
	}
	if after := e.snapshot(t); after != before {
		t.Fatalf("a fenced claim wrote:\nbefore %s\nafter  %s", before, after)
	}

	p = e.claim(t, "p-1", 9, "exec-b")
	if p.Status != lockapi.StatusClaimed || p.FenceToken != 9 || *p.ClaimedBy != "exec-b" {
		t.Fatalf("re-claim answer = %+v, want CLAIMED, fenceToken 9, claimedBy exec-b", p)
	}
	var status, claimedBy string
	var fence int64
	if err := e.db.QueryRow(ctx, "SELECT status, fence_token, claimed_by FROM payout WHERE payout_id='p-1'").Scan(&status, &fence, &claimedBy); err != nil {
		t.Fatal(err)
	}
	if status != "CLAIMED" || fence != 9 || claimedBy != "exec-b" {
		t.Fatalf("row = %s %d %s, want CLAIMED 9 exec-b", status, fence, claimedBy)
	}

	if got := e.metric(t, `lock_fenced_out_total{resource="payout"}`); got != 4 {
		t.Errorf("lock_fenced_out_total = %v, want 4", got)
	}
	if got := e.metric(t, `payout_transition_total{to="claimed"}`); got != 2 {
		t.Errorf("payout_transition_total{to=claimed} = %v, want 2", got)
	}
	logs := e.logs.events(t, "fenced_out")
	if len(logs) != 4 {
		t.Fatalf("%d fenced_out log lines, want 4", len(logs))
	}
	l := logs[1]
	want := map[string]any{"level": "WARN", "service": "payment-resource", "resource": "payout", "payoutId": "p-1",
		"presentedToken": float64(5), "fenceToken": float64(5), "ownerId": "exec-b"}
	for k, v := range want {
		if l[k] != v {
			t.Errorf("fenced_out log %s = %v, want %v (line %v)", k, l[k], v, l)
		}
	}
}

// Fence point (a), post: only the current claimant's token (and owner) posts.
// A stale claimant, a token never used to claim, and a post before any claim
// are all FENCED_OUT and write nothing.
func TestPostOnlyByClaimant(t *testing.T) {
	t.Parallel()
	e := start(t, booksUnchecked) // about who may post; its payouts never went to the rail
	ctx := context.Background()
	e.create(t, "p-1", "acct-1", 1250)
	e.create(t, "p-2", "acct-1", 99)
	paid := lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr("RS-1")}

	// Never claimed: no claimant, so no token is the claimant's.
	_, err := e.client.Post(ctx, "p-2", 1, "exec-a", paid)
	prob := asProblem(t, err, http.StatusConflict, lockapi.CodeFencedOut)
	if got := member[int64](t, prob, "fenceToken"); got != 0 {
		t.Errorf("fenceToken of an unclaimed payout = %d, want 0", got)
	}

	e.claim(t, "p-1", 5, "exec-a")
	e.claim(t, "p-1", 7, "exec-b") // exec-a's lease expired; exec-b took over
	before := e.snapshot(t)
	for _, tc := range []struct {
		name  string
		token int64
		owner string
	}{
		{"stale claimant", 5, "exec-a"},
		{"token never claimed with, higher", 8, "exec-b"},
		{"token never claimed with, lower", 6, "exec-b"},
		{"claimant's token, other owner", 7, "exec-a"},
	} {
		_, err := e.client.Post(ctx, "p-1", tc.token, tc.owner, paid)
		prob := asProblem(t, err, http.StatusConflict, lockapi.CodeFencedOut)
		if got := member[int64](t, prob, "presentedToken"); got != tc.token {
			t.Errorf("%s: presentedToken = %d, want %d", tc.name, got, tc.token)
		}
		if got := member[int64](t, prob, "fenceToken"); got != 7 {
			t.Errorf("%s: fenceToken = %d, want 7", tc.name, got)
		}
	}
	if after := e.snapshot(t); after != before {
		t.Fatalf("a fenced post wrote:\nbefore %s\nafter  %s", before, after)
	}

	p, err := e.client.Post(ctx, "p-1", 7, "exec-b", paid)
	if err != nil {
		t.Fatalf("claimant's post: %v", err)
	}
	if p.Status != lockapi.StatusPaid || p.RailReference == nil || *p.RailReference != "RS-1" || p.FenceToken != 7 {
		t.Fatalf("post answer = %+v, want PAID RS-1 fenceToken 7", p)
	}
	var amount, posted int64
	var account, currency string
	if err := e.db.QueryRow(ctx, "SELECT amount_minor, posted_token, account_id, currency FROM ledger_entry WHERE payout_id='p-1'").
		Scan(&amount, &posted, &account, &currency); err != nil {
		t.Fatalf("ledger entry: %v", err)
	}
	if amount != -1250 || posted != 7 || account != "acct-1" || currency != "EUR" {
		t.Fatalf("ledger entry = %d %d %s %s, want -1250 7 acct-1 EUR", amount, posted, account, currency)
	}
	if got := e.metric(t, `lock_fenced_out_total{resource="payout"}`); got != 5 {
		t.Errorf("lock_fenced_out_total = %v, want 5", got)
	}
	if got := e.metric(t, `payout_transition_total{to="paid"}`); got != 1 {
		t.Errorf("payout_transition_total{to=paid} = %v, want 1", got)
	}
	if n := len(e.logs.events(t, "fenced_out")); n != 5 {
		t.Errorf("%d fenced_out log lines, want 5", n)
	}
	if l := e.logs.events(t, "payout_posted"); len(l) != 1 || l[0]["railReference"] != "RS-1" ||
		l[0]["payoutStatus"] != "PAID" || l[0]["token"] != float64(7) || l[0]["ownerId"] != "exec-b" {
		t.Errorf("payout_posted lines = %v", l)
	}
	if l := e.logs.events(t, "fenced_out"); l[len(l)-1]["claimedBy"] != "exec-b" {
		t.Errorf("fenced_out claimedBy = %v, want exec-b", l[len(l)-1]["claimedBy"])
	}
}

// Final states never move, and the refusals keep the contract's precedence:
// NOT_FOUND, then PAYOUT_FINAL (carrying the status; even a repeated identical
// post, even with a stale token), then FENCED_OUT. DECLINED and AMBIGUOUS write
// no ledger entry.
func TestFinalPayoutsNeverMove(t *testing.T) {
	t.Parallel()
	e := start(t, booksUnchecked) // about final states; its payouts never went to the rail
	ctx := context.Background()
	posts := map[string]lockapi.PostRequest{
		lockapi.StatusPaid:      {Outcome: lockapi.StatusPaid, RailReference: ptr("RS-9")},
		lockapi.StatusDeclined:  {Outcome: lockapi.StatusDeclined, DeclineReason: ptr("insufficient funds")},
		lockapi.StatusAmbiguous: {Outcome: lockapi.StatusAmbiguous},
	}
	for status, req := range posts {
		id := "p-" + strings.ToLower(status)
		e.create(t, id, "acct-1", 500)
		e.claim(t, id, 10, "exec-a")
		p, err := e.client.Post(ctx, id, 10, "exec-a", req)
		if err != nil || p.Status != status {
			t.Fatalf("post %s: %+v, %v", status, p, err)
		}
	}
	before := e.snapshot(t)
	for status, req := range posts {
		id := "p-" + strings.ToLower(status)
		calls := map[string]func() error{
			"claim with a higher token": func() error { _, err := e.client.Claim(ctx, id, 11, "exec-b"); return err },
			"claim with a stale token":  func() error { _, err := e.client.Claim(ctx, id, 3, "exec-b"); return err },
			"repeated identical post":   func() error { _, err := e.client.Post(ctx, id, 10, "exec-a", req); return err },
			"post of another outcome": func() error {
				_, err := e.client.Post(ctx, id, 10, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusDeclined})
				return err
			},
			"post with a stale token": func() error { _, err := e.client.Post(ctx, id, 2, "exec-c", req); return err },
		}
		for name, call := range calls {
			prob := asProblem(t, call(), http.StatusConflict, lockapi.CodePayoutFinal)
			if got := member[string](t, prob, "payoutStatus"); got != status {
				t.Errorf("%s on %s: status member = %q, want %q", name, id, got, status)
			}
		}
	}
	if after := e.snapshot(t); after != before {
		t.Fatalf("a call on a final payout wrote:\nbefore %s\nafter  %s", before, after)
	}
	if n := e.queryInt(t, "SELECT count(*) FROM ledger_entry"); n != 1 {
		t.Fatalf("%d ledger entries, want 1 (the PAID payout's only)", n)
	}
	if got := e.metric(t, `lock_fenced_out_total{resource="payout"}`); got != 0 {
		t.Errorf("PAYOUT_FINAL counted as fenced: lock_fenced_out_total = %v", got)
	}

	// NOT_FOUND comes first.
	_, err := e.client.Claim(ctx, "p-none", 1, "exec-a")
	asProblem(t, err, http.StatusNotFound, lockapi.CodeNotFound)
	_, err = e.client.Post(ctx, "p-none", 1, "exec-a", posts[lockapi.StatusPaid])
	asProblem(t, err, http.StatusNotFound, lockapi.CodeNotFound)
	_, err = e.client.Get(ctx, "p-none")
	asProblem(t, err, http.StatusNotFound, lockapi.CodeNotFound)
}

// A PAID post and its ledger entry commit together or not at all: when the
// ledger insert fails (a trigger refusing it; a ledger row already there), the
// payout stays CLAIMED with nothing of the post, the answer is 500, and nothing
// is counted. Once the ledger accepts, the same post succeeds.
func TestPaidPostAndLedgerAtomic(t *testing.T) {
	t.Parallel()
	e := start(t, booksUnchecked) // about the ledger entry's atomicity; its payouts never went to the rail
	ctx := context.Background()
	e.create(t, "p-1", "acct-1", 700)
	e.create(t, "p-2", "acct-1", 800)
	e.claim(t, "p-1", 3, "exec-a")
	e.claim(t, "p-2", 4, "exec-a")
	paid := lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr("RS-1")}

	e.exec(t, `CREATE FUNCTION refuse_ledger() RETURNS trigger LANGUAGE plpgsql AS
	  $$ BEGIN RAISE EXCEPTION 'ledger refused by the test'; END $$`)
	e.exec(t, `CREATE TRIGGER refuse_ledger BEFORE INSERT ON ledger_entry FOR EACH ROW EXECUTE FUNCTION refuse_ledger()`)
	before := e.snapshot(t)
	_, err := e.client.Post(ctx, "p-1", 3, "exec-a", paid)
	asProblem(t, err, http.StatusInternalServerError, lockapi.CodeInternal)
	if after := e.snapshot(t); after != before {
		t.Fatalf("a PAID post whose ledger entry failed left a trace:\nbefore %s\nafter  %s", before, after)
	}
	p, err := e.client.Get(ctx, "p-1")
	if err != nil || p.Status != lockapi.StatusClaimed || p.RailReference != nil {
		t.Fatalf("payout after the failed post = %+v, %v; want CLAIMED without railReference", p, err)
	}
	if got := e.metric(t, `payout_transition_total{to="paid"}`); got != 0 {
		t.Errorf("a rolled-back post was counted: paid = %v", got)
	}

	e.exec(t, "DROP TRIGGER refuse_ledger ON ledger_entry")
	if p, err = e.client.Post(ctx, "p-1", 3, "exec-a", paid); err != nil || p.Status != lockapi.StatusPaid {
		t.Fatalf("post once the ledger accepts: %+v, %v", p, err)
	}
	if n := e.queryInt(t, "SELECT count(*) FROM ledger_entry WHERE payout_id='p-1' AND amount_minor=-700 AND posted_token=3"); n != 1 {
		t.Fatalf("%d matching ledger entries for p-1, want 1", n)
	}

	// A ledger row already there for p-2: the unique payout_id refuses the post's
	// entry, and the payout must not be PAID without its own entry.
	e.exec(t, `INSERT INTO ledger_entry (payout_id, account_id, amount_minor, currency, posted_token)
	           VALUES ('p-2', 'acct-1', -1, 'EUR', 999)`)
	_, err = e.client.Post(ctx, "p-2", 4, "exec-a", paid)
	asProblem(t, err, http.StatusInternalServerError, lockapi.CodeInternal)
	if p, err = e.client.Get(ctx, "p-2"); err != nil || p.Status != lockapi.StatusClaimed {
		t.Fatalf("p-2 after the failed post = %+v, %v; want CLAIMED", p, err)
	}
	if n := e.queryInt(t, "SELECT count(*) FROM ledger_entry WHERE payout_id='p-2'"); n != 1 {
		t.Fatalf("%d ledger rows for p-2, want only the test's", n)
	}
}

// Many claimers at once, each with its own token: the highest token ends up
// holding the payout, and no claim ever replaced a higher fence_token with a
// lower one (every committed change, recorded by a trigger, raised the token).
// Each claim answer is consistent: success, or FENCED_OUT against a fence token
// at least the presented one.
func TestConcurrentClaimsHighestWins(t *testing.T) {
	t.Parallel()
	e := start(t, func(c *payment.Config) { c.DBTimeout = 20 * time.Second })
	ctx := context.Background()
	e.exec(t, `CREATE TABLE claim_audit (payout_id text, old_token bigint, new_token bigint, new_owner text)`)
	e.exec(t, `CREATE FUNCTION audit_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
	  INSERT INTO claim_audit VALUES (OLD.payout_id, OLD.fence_token, NEW.fence_token, NEW.claimed_by); RETURN NEW; END $$`)
	e.exec(t, `CREATE TRIGGER audit_claim AFTER UPDATE ON payout FOR EACH ROW EXECUTE FUNCTION audit_claim()`)

	const payouts, claimers = 3, 40
	for i := range payouts {
		e.create(t, fmt.Sprintf("p-%d", i), "acct-1", 100)
	}
	type result struct {
		id    string
		token int64
		ok    bool
	}
	results := make(chan result, payouts*claimers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range payouts {
		id := fmt.Sprintf("p-%d", i)
		for _, tok := range rand.Perm(claimers) {
			token := int64(tok + 1)
			wg.Go(func() {
				<-start
				p, err := e.client.Claim(ctx, id, token, fmt.Sprintf("exec-%d", token))
				if err == nil {
					if p.FenceToken != token || p.Status != lockapi.StatusClaimed {
						t.Errorf("claim %s with %d answered %+v", id, token, p)
					}
					results <- result{id, token, true}
					return
				}
				prob, perr := problemIs(err, http.StatusConflict, lockapi.CodeFencedOut)
				if perr != nil {
					t.Errorf("claim %s with %d: %v", id, token, perr)
					results <- result{id, token, false}
					return
				}
				fence, merr := memberOf[int64](prob, "fenceToken")
				switch {
				case merr != nil:
					t.Errorf("claim %s with %d: %v", id, token, merr)
				case fence < token:
					t.Errorf("claim %s with %d fenced by a lower fence token %d", id, token, fence)
				}
				results <- result{id, token, false}
			})
		}
	}
	close(start)
	wg.Wait()
	close(results)
	wins := map[string]int{}
	for r := range results {
		if r.ok {
			wins[r.id]++
		}
		if r.token == claimers && !r.ok {
			t.Errorf("the highest token %d lost on %s", r.token, r.id)
		}
	}
	for i := range payouts {
		id := fmt.Sprintf("p-%d", i)
		p, err := e.client.Get(ctx, id)
		if err != nil || p.FenceToken != claimers || *p.ClaimedBy != fmt.Sprintf("exec-%d", claimers) {
			t.Fatalf("%s after the race = %+v, %v; want fenceToken %d", id, p, err, claimers)
		}
		if n := e.queryInt(t, "SELECT count(*) FROM claim_audit WHERE payout_id=$1", id); n != int64(wins[id]) {
			t.Errorf("%s: %d committed claims, %d successful answers", id, n, wins[id])
		}
	}
	if n := e.queryInt(t, "SELECT count(*) FROM claim_audit WHERE new_token <= old_token"); n != 0 {
		t.Fatalf("%d claims lowered or kept the fence token", n)
	}
	total := 0
	for _, n := range wins {
		total += n
	}
	if got := e.metric(t, `payout_transition_total{to="claimed"}`); got != float64(total) {
		t.Errorf("claimed counter = %v, successful claims = %d", got, total)
	}
	if got := e.metric(t, `lock_fenced_out_total{resource="payout"}`); got != float64(payouts*claimers-total) {
		t.Errorf("fenced counter = %v, fenced claims = %d", got, payouts*claimers-total)
	}
}

// Concurrent posts by the claimant (a retried post racing the first, say): one
// wins, the rest are PAYOUT_FINAL carrying the winner's status, and there is at
// most one ledger entry — exactly one when the winner was PAID.
func TestConcurrentPostsOneLedgerEntry(t *testing.T) {
	t.Parallel()
	// About concurrent posts; its payouts never went to the rail: books unchecked.
	e := start(t, booksUnchecked, func(c *payment.Config) { c.DBTimeout = 20 * time.Second })
	ctx := context.Background()
	outcomes := []string{lockapi.StatusPaid, lockapi.StatusDeclined, lockapi.StatusAmbiguous}
	const rounds, posters = 4, 16
	for round := range rounds {
		id := fmt.Sprintf("p-%d", round)
		e.create(t, id, "acct-1", 300)
		e.claim(t, id, 2, "exec-a")
		var wg sync.WaitGroup
		var mu sync.Mutex
		var winners []lockapi.Payout
		var finals []string
		for i := range posters {
			req := lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr(fmt.Sprintf("RS-%d", i))}
			if round > 0 { // the first round all post PAID; later rounds mix outcomes
				req.Outcome = outcomes[i%len(outcomes)]
				if req.Outcome != lockapi.StatusPaid {
					req.RailReference = nil
				}
			}
			wg.Go(func() {
				p, err := e.client.Post(ctx, id, 2, "exec-a", req)
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					winners = append(winners, p)
					return
				}
				prob, perr := problemIs(err, http.StatusConflict, lockapi.CodePayoutFinal)
				if perr != nil {
					t.Errorf("%s: %v", id, perr)
					return
				}
				status, merr := memberOf[string](prob, "payoutStatus")
				if merr != nil {
					t.Errorf("%s: %v", id, merr)
					return
				}
				finals = append(finals, status)
			})
		}
		wg.Wait()
		if len(winners) != 1 {
			t.Fatalf("%s: %d posts succeeded, want 1", id, len(winners))
		}
		w := winners[0]
		for _, s := range finals {
			if s != w.Status {
				t.Errorf("%s: PAYOUT_FINAL status %s, winner posted %s", id, s, w.Status)
			}
		}
		wantLedger := int64(0)
		if w.Status == lockapi.StatusPaid {
			wantLedger = 1
		}
		if n := e.queryInt(t, "SELECT count(*) FROM ledger_entry WHERE payout_id=$1", id); n != wantLedger {
			t.Errorf("%s: %d ledger entries after a %s win, want %d", id, n, w.Status, wantLedger)
		}
		got, err := e.client.Get(ctx, id)
		if err != nil || got.Status != w.Status || deref(got.RailReference) != deref(w.RailReference) {
			t.Errorf("%s: stored %+v, winner answered %+v (%v)", id, got, w, err)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// A post records the rail's words as relayed, up to their bounds and in any
// printable characters (docs/contracts/payments.md); an empty decline reason is
// kept as given.
func TestPostRecordsRailWordsVerbatim(t *testing.T) {
	t.Parallel()
	e := start(t, booksUnchecked) // about storing the words as given; its payouts never went to the rail
	ctx := context.Background()
	long := "RS-" + strings.Repeat("x", 31) + "✓" // 35 characters, the bound
	for _, tc := range []struct {
		id  string
		req lockapi.PostRequest
	}{
		{"p-paid", lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr(long)}},
		{"p-declined", lockapi.PostRequest{Outcome: lockapi.StatusDeclined, DeclineReason: ptr("")}},
		{"p-declined-2", lockapi.PostRequest{Outcome: lockapi.StatusDeclined, DeclineReason: ptr(strings.Repeat("é", 140))}},
		{"p-ambiguous", lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous, RailReference: ptr("RS-9"), DeclineReason: ptr("late")}},
	} {
		e.create(t, tc.id, "acct-1", 10)
		e.claim(t, tc.id, 1, "exec-a")
		p, err := e.client.Post(ctx, tc.id, 1, "exec-a", tc.req)
		if err != nil {
			t.Fatalf("%s: %v", tc.id, err)
		}
		stored, err := e.client.Get(ctx, tc.id)
		if err != nil {
			t.Fatal(err)
		}
		for _, got := range []lockapi.Payout{p, stored} {
			if got.Status != tc.req.Outcome || deref(got.RailReference) != deref(tc.req.RailReference) ||
				deref(got.DeclineReason) != deref(tc.req.DeclineReason) {
				t.Errorf("%s: recorded %s %q %q, posted %+v", tc.id, got.Status, deref(got.RailReference), deref(got.DeclineReason), tc.req)
			}
		}
	}
}
