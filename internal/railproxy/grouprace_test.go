package railproxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/invariants"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// Two replicas admitting groups of up to 64 race on 50
// accounts, tokens going up, with the books check on and every payout booked
// (created and claimed by its token and owner just before it is submitted): no
// deadlock (no group statement falls back, none fails), no 503, no
// NOT_IN_BOOKS, each account's mark is the highest token admitted for it, and
// the invariant checker finds no stale admission and no admission the books do
// not back.
func TestTwoReplicasRacingInGroups(t *testing.T) {
	t.Parallel()
	paydbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, paydbURL)
	rail := startStub(t, 0)
	var proxies []*proxy
	for range 2 {
		cfg := testConfig(paydbURL, rail.URL)
		cfg.BooksCheck = true // the payouts are booked below
		cfg.MaxGroup = 64
		cfg.LogLevel = "info"
		proxies = append(proxies, startProxy(t, cfg))
	}

	// The group-size histograms exist from start-up, at zero (docs/contracts/observability.md).
	for i, p := range proxies {
		for _, h := range []string{"rail_admission_group_size_count", "rail_resolution_group_size_count"} {
			if c := metric(t, p, h); c != 0 {
				t.Fatalf("replica %d: %s %v at start-up, want 0", i, h, c)
			}
		}
	}

	const accounts = 50
	var tokens [accounts]atomic.Int64
	var (
		mu       sync.Mutex
		statuses = map[int]int{}
		failures []string
		payoutN  atomic.Int64
	)
	stop := time.Now().Add(5 * time.Second)
	var wg sync.WaitGroup
	for g := range 48 {
		wg.Go(func() {
			for i := g; time.Now().Before(stop); i++ {
				acct := (i*7 + g) % accounts
				tok := tokens[acct].Add(1)
				p := newPayout(fmt.Sprintf("race-%d", payoutN.Add(1)), fmt.Sprintf("acct-%d", acct))
				if err := tryBookClaimed(db, p, tok, "worker-1"); err != nil {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("booking %s: %v", p.PayoutID, err))
					mu.Unlock()
					return
				}
				a := trySubmit(proxies[i%2].URL, tok, p)
				mu.Lock()
				statuses[a.Status]++
				if a.Err != nil || (a.Status != 200 && a.code() != lockapi.CodeFencedOut) {
					failures = append(failures, fmt.Sprintf("%s token %d: %d %s %v", p.PayoutID, tok, a.Status, a.code(), a.Err))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("answers by status: %v", statuses)
	if len(failures) > 0 {
		t.Errorf("%d answers neither 200 nor FENCED_OUT, e.g. %v", len(failures), failures[:min(5, len(failures))])
	}
	for i, p := range proxies {
		// A group statement that meets a lock held longer than its lock_timeout
		// fails with lock_not_available (55P03) and its members are admitted one
		// by one, as docs/contracts/rail-proxy.md ("Group admission") says; on a
		// loaded machine that can happen here (a relation's extension lock). Any
		// other failure — a deadlock above all — is a fault.
		var timedOut int
		for _, e := range p.Logs.events("admission_group_fallback") {
			if msg, _ := e["error"].(string); strings.Contains(msg, "55P03") {
				timedOut++
				continue
			}
			t.Errorf("replica %d: a group statement failed other than by its lock_timeout: %v", i, e)
		}
		t.Logf("replica %d: %d group statements fell back on their lock_timeout", i, timedOut)
		if logs := p.Logs.String(); strings.Contains(logs, "deadlock") {
			t.Errorf("replica %d logged a deadlock", i)
		}
		sum, count := metric(t, p, "rail_admission_group_size_sum"), metric(t, p, "rail_admission_group_size_count")
		t.Logf("replica %d: %v submissions in %v groups", i, sum, count)
		if count <= 0 || sum <= count {
			t.Errorf("replica %d: %v submissions in %v groups: the race never formed a group of more than one", i, sum, count)
		}
		rsum, rcount := metric(t, p, "rail_resolution_group_size_sum"), metric(t, p, "rail_resolution_group_size_count")
		t.Logf("replica %d: %v resolving writes in %v statements", i, rsum, rcount)
		if rcount <= 0 || rsum < sum-metric(t, p, `rail_submission_total{outcome="fenced"}`) {
			t.Errorf("replica %d: %v resolving writes in %v statements for %v admissions", i, rsum, rcount, sum)
		}
	}

	pool := pgtest.Pool(t, paydbURL)
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT h.account_id, h.highest_token, (SELECT max(presented_token) FROM rail_submission s
	        WHERE s.account_id = h.account_id AND (s.outcome IS NULL OR s.outcome IN ('ACKED','REJECTED','TIMEOUT','UNSENT')))
	  FROM rail_high_water h`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var acct string
		var mark int64
		var top *int64
		if err := rows.Scan(&acct, &mark, &top); err != nil {
			t.Fatal(err)
		}
		n++
		if top == nil || *top != mark {
			t.Errorf("%s: mark %d, highest admitted token %v", acct, mark, top)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != accounts {
		t.Errorf("%d marks, want %d", n, accounts)
	}
	h, err := invariants.Load(ctx, pool, pgtest.Pool(t, pgtest.LockdbURL(t)), rail.calls(t))
	if err != nil {
		t.Fatal(err)
	}
	r := invariants.Evaluate(h, invariants.Options{FencingEnabled: true, BooksBound: true})
	for _, c := range []invariants.CheckID{invariants.CheckStaleAdmission, invariants.CheckMark,
		invariants.CheckAdmittedWithoutClaim, invariants.CheckAdmittedNotAsBooked} {
		if k := r.Count(c); k != 0 {
			t.Errorf("checker: %d findings of %s", k, c)
		}
	}
}

// tryBookClaimed writes p as payment-resource would for a claim by owner under
// token: created PENDING, then claimed, one payout_history row per move (book,
// for a goroutine other than the test's).
func tryBookClaimed(db dbq, p payout, token int64, owner string) error {
	ctx := context.Background()
	if _, err := db.Exec(ctx, `
		WITH p AS (INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary)
		           VALUES ($1, $2, $3, $4, $5) RETURNING payout_id)
		INSERT INTO payout_history (payout_id, status, fence_token) SELECT payout_id, 'PENDING', 0 FROM p`,
		p.PayoutID, p.AccountID, p.AmountMinor, p.Currency, p.Beneficiary); err != nil {
		return err
	}
	_, err := db.Exec(ctx, `
		WITH m AS (UPDATE payout SET status = 'CLAIMED', fence_token = $2, claimed_by = $3, updated_at = now()
		            WHERE payout_id = $1 RETURNING payout_id, status, fence_token, claimed_by)
		INSERT INTO payout_history (payout_id, status, fence_token, owner_id) SELECT * FROM m`, p.PayoutID, token, owner)
	return err
}

// For rail-proxy's admission, one by one and in groups: with
// the synchronous standby held back, the admission's COMMIT waits; its backend's
// wait is cancelled, so PostgreSQL reports the COMMIT as a success with the
// cancelled-synchronous-replication warning. The proxy takes it as not committed:
// 503 RAIL_UNAVAILABLE stage intent_commit, the rail never called, and the row
// the primary does hold resolved UNSENT once paydb takes writes again. The same
// whatever client_min_messages the role, the database or the URL sets
// (pgtest.QuietPlaces): at error PostgreSQL would not send that warning, so the
// admission raises it (docs/contracts/rail-proxy.md).
func TestCancelledSyncWaitAnswers503AndNeverCallsTheRail(t *testing.T) {
	pair := pgtest.Pair(t, pgcluster.PairOptions{Sync: true})
	rail := startStub(t, 0)
	pool := pgtest.Pool(t, pair.URL("paydb"))
	ctx := context.Background()
	for _, quiet := range pgtest.QuietPlaces {
		paydbURL := pgtest.Quiet(t, pair, "paydb", quiet)
		for _, maxGroup := range []int{1, 64} {
			cfg := testConfig(paydbURL, rail.URL)
			cfg.MaxGroup = maxGroup
			px := startProxy(t, cfg)
			p := newPayout(fmt.Sprintf("p-sync-%s-%d", quiet, maxGroup), "acct-sync-"+quiet)
			if err := pair.HoldStandby(); err != nil {
				t.Fatal(err)
			}
			done := make(chan answer, 1)
			go func() { done <- trySubmit(px.URL, int64(10*maxGroup), p) }()
			a := cancelSyncWait(t, pair, done)
			if a.Err != nil || a.Status != 503 || a.code() != lockapi.CodeRailUnavailable || a.str("stage") != "intent_commit" {
				t.Errorf("quiet %s, max group %d: answer %d %v %v; want 503 RAIL_UNAVAILABLE stage intent_commit", quiet, maxGroup, a.Status, a.Body, a.Err)
			}
			if n := rail.callsFor(t, p.PayoutID); n != 0 {
				t.Errorf("quiet %s, max group %d: the rail was called %d times for an intent whose commit was not durable", quiet, maxGroup, n)
			} else {
				eventually(t, 30*time.Second, "the row resolved UNSENT", func() bool {
					rs, err := tryRowsOf(pool, p.PayoutID)
					return err == nil && len(rs) == 1 && outcomeOf(rs[0]) == lockapi.OutcomeUnsent
				})
			}
			if err := px.Stop(); err != nil {
				t.Fatal(err)
			}
		}

		// A group's COMMIT: every member is told its commit was not durable, with
		// the row at stake, so each is answered 503 and its row resolved UNSENT.
		store, err := OpenStore(ctx, paydbURL, 2)
		if err != nil {
			t.Fatal(err)
		}
		subs := make([]Submission, 3)
		for i := range subs {
			subs[i] = Submission{PayoutID: fmt.Sprintf("p-group-%s-%d", quiet, i), AccountID: "acct-group-" + quiet, Token: int64(i + 1),
				OwnerID: "w", IdempotencyKey: "k", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}
		}
		subs[2].Token = 1 // FENCED: its row too is at stake
		if err := pair.HoldStandby(); err != nil {
			t.Fatal(err)
		}
		res := make(chan []MemberResult, 1)
		// Made-up payouts, no payout row: the books check is off, this is about
		// the COMMIT's durability.
		go func() { res <- store.AdmitGroup(ctx, subs, true, false, time.Minute) }()
		got := cancelSyncWait(t, pair, res)
		store.Close()
		for i, r := range got {
			var ce *CommitError
			if !errors.As(r.Err, &ce) || !errors.Is(r.Err, dbconn.ErrCommitNotDurable) || !ce.Unsure || ce.SubmissionID == 0 ||
				ce.Intent != (i < 2) {
				t.Errorf("quiet %s, member %d: %+v %v; want a CommitError wrapping ErrCommitNotDurable, unsure, naming its row", quiet, i, r.Admission, r.Err)
			}
		}
	}
}

// cancelSyncWait is testkit.CancelSyncWait (pg_cancel_backend) with the
// standby released afterwards, whatever happens.
func cancelSyncWait[T any](t *testing.T, pair *pgcluster.Pair, done <-chan T) T {
	t.Helper()
	defer pair.ReleaseStandby()
	return testkit.CancelSyncWait(t, pair, false, done)
}
