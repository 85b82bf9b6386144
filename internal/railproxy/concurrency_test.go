package railproxy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// Two rail-proxy instances on one paydb, many goroutines, mixed and
// stale tokens over a few accounts, repeated payouts. Read back from paydb and
// the rail's own call log:
//   - per account, in submission_id order (admission order: every row of an
//     account is inserted under its rail_high_water row lock), each row that
//     passed the fence (admitted or DUPLICATE) carries a token strictly greater
//     than every earlier passing token — the mark at its admission — and each
//     FENCED row a token not greater than it; so admitted tokens strictly increase;
//   - the final mark is the largest token that passed the fence;
//   - each payout reached the rail at most once, and every rail call is an
//     admitted row's;
//   - every answer agrees with its row.
func TestTwoInstancesManyGoroutines(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	proxies := []*proxy{startProxy(t, testConfig(dbURL, rail.URL)), startProxy(t, testConfig(dbURL, rail.URL))}

	const (
		accounts   = 3
		goroutines = 16
		perG       = 15
	)
	issued := make([]atomic.Int64, accounts) // the newest token the "lock service" issued per account
	type result struct {
		id      int64
		code    string
		payout  string
		account string
		token   int64
	}
	var mu sync.Mutex
	var results []result
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for i := range perG {
				a := rng.IntN(accounts)
				var token int64
				if rng.IntN(10) < 6 {
					token = issued[a].Add(1)
				} else { // a stale holder, or a replay of the newest token
					token = max(1, issued[a].Load()-int64(rng.IntN(4)))
				}
				acct := fmt.Sprintf("acct-c%d", a)
				payout := fmt.Sprintf("p-c%d-%d", a, rng.IntN(40))
				ans := trySubmit(proxies[(g+i)%2].URL, token, newPayout(payout, acct))
				if ans.Err != nil {
					t.Errorf("submission %s/%d: %v", payout, token, ans.Err)
					return
				}
				code := ans.code()
				if ans.Status == http.StatusOK {
					code = "OK"
				}
				mu.Lock()
				results = append(results, result{id: ans.int("submissionId"), code: code, payout: payout, account: acct, token: token})
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	type dbrow struct {
		id      int64
		payout  string
		account string
		token   int64
		outcome string
	}
	rs, err := db.Query(context.Background(),
		`SELECT submission_id, payout_id, account_id, presented_token, coalesce(outcome, 'NULL') FROM rail_submission ORDER BY submission_id`)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[int64]dbrow{}
	var all []dbrow
	for rs.Next() {
		var r dbrow
		if err := rs.Scan(&r.id, &r.payout, &r.account, &r.token, &r.outcome); err != nil {
			t.Fatal(err)
		}
		all = append(all, r)
		byID[r.id] = r
	}
	rs.Close()
	if len(all) != goroutines*perG {
		t.Fatalf("%d rows for %d submissions", len(all), goroutines*perG)
	}

	marks := map[string]int64{}
	admittedPayouts := map[string]int{}
	counts := map[string]int{}
	for _, r := range all {
		counts[r.outcome]++
		m := marks[r.account]
		switch r.outcome {
		case "FENCED":
			if r.token > m {
				t.Errorf("row %d: token %d FENCED although the mark was %d", r.id, r.token, m)
			}
		case "DUPLICATE", "ACKED", "REJECTED", "TIMEOUT", "UNSENT", "NULL":
			if r.token <= m {
				t.Errorf("row %d (%s): token %d passed the fence although the mark was %d", r.id, r.outcome, r.token, m)
			}
			marks[r.account] = r.token
			if r.outcome != "DUPLICATE" {
				admittedPayouts[r.payout]++
			}
		}
	}
	for a := range accounts {
		acct := fmt.Sprintf("acct-c%d", a)
		if got := mark(t, db, acct); got != marks[acct] {
			t.Errorf("%s: final mark %d, largest passing token %d", acct, got, marks[acct])
		}
	}
	if counts["FENCED"] == 0 || counts["DUPLICATE"] == 0 || counts["ACKED"] == 0 {
		t.Fatalf("the mix did not exercise every verdict: %v", counts)
	}
	calls := map[string]int{}
	for _, c := range rail.calls(t) {
		calls[c.Reference]++
	}
	for ref, n := range calls {
		if n != 1 {
			t.Errorf("payout %s reached the rail %d times", ref, n)
		}
		if admittedPayouts[ref] != 1 {
			t.Errorf("payout %s reached the rail but has %d admitted rows", ref, admittedPayouts[ref])
		}
	}
	if len(calls) != counts["ACKED"] {
		t.Errorf("%d payouts reached the rail, %d rows ACKED", len(calls), counts["ACKED"])
	}
	want := map[string]string{"OK": "ACKED", lockapi.CodeFencedOut: "FENCED", lockapi.CodeDuplicateSubmission: "DUPLICATE"}
	for _, res := range results {
		r, ok := byID[res.id]
		if !ok || want[res.code] != r.outcome || r.token != res.token || r.payout != res.payout || r.account != res.account {
			t.Errorf("answer %+v disagrees with its row %+v", res, r)
		}
	}
	t.Logf("%d submissions: %v", len(all), counts)
}
