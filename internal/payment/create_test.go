package payment_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/payment"
	"lock.dev/lockapi"
)

// Create is idempotent: 201 the first time, 200 with the stored payout when the
// same five fields come again, 409 PAYOUT_CONFLICT naming what differs (nothing
// changed) otherwise. The answer is a full payout with RFC 3339 UTC timestamps.
func TestCreateIdempotent(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx := context.Background()
	body := `{"payoutId":"p-1001","accountId":"acct-7","amountMinor":125000,"currency":"EUR","beneficiary":"NL91ABNA0417164300"}`
	json := map[string][]string{"Content-Type": {"application/json"}}

	code, b := e.raw(t, http.MethodPost, "/v1/payouts", json, body)
	if code != http.StatusCreated {
		t.Fatalf("first create: %d %s", code, b)
	}
	first := decodePayout(t, b)
	want := lockapi.Payout{PayoutID: "p-1001", AccountID: "acct-7", AmountMinor: 125000, Currency: "EUR",
		Beneficiary: "NL91ABNA0417164300", Status: lockapi.StatusPending}
	if first.PayoutID != want.PayoutID || first.AccountID != want.AccountID || first.AmountMinor != want.AmountMinor ||
		first.Currency != want.Currency || first.Beneficiary != want.Beneficiary || first.Status != want.Status ||
		first.FenceToken != 0 || first.ClaimedBy != nil || first.RailReference != nil || first.DeclineReason != nil {
		t.Fatalf("created payout = %+v", first)
	}
	checkTimestamps(t, b)

	code, b = e.raw(t, http.MethodPost, "/v1/payouts", json, body)
	if code != http.StatusOK {
		t.Fatalf("identical create: %d %s, want 200", code, b)
	}
	if again := decodePayout(t, b); !again.CreatedAt.Equal(first.CreatedAt) || !again.UpdatedAt.Equal(first.UpdatedAt) {
		t.Fatalf("identical create answered %+v, want the stored %+v", again, first)
	}

	before := e.snapshot(t)
	_, err := e.client.Create(ctx, lockapi.SubmissionRequest{PayoutID: "p-1001", AccountID: "acct-8",
		AmountMinor: 125001, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"})
	prob := asProblem(t, err, http.StatusConflict, lockapi.CodePayoutConflict)
	if got := member[[]string](t, prob, "conflictingFields"); !slices.Equal(got, []string{"accountId", "amountMinor"}) {
		t.Errorf("conflictingFields = %v", got)
	}
	if after := e.snapshot(t); after != before {
		t.Fatalf("a conflicting create wrote:\nbefore %s\nafter  %s", before, after)
	}

	// Identical fields still answer 200 once the payout has moved on.
	e.claim(t, "p-1001", 3, "exec-a")
	p, err := e.client.Create(ctx, lockapi.SubmissionRequest{PayoutID: "p-1001", AccountID: "acct-7",
		AmountMinor: 125000, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"})
	if err != nil || p.Status != lockapi.StatusClaimed || p.FenceToken != 3 {
		t.Fatalf("identical create of a claimed payout = %+v, %v; want the claimed payout", p, err)
	}
	if lines := e.logs.events(t, "payout_created"); len(lines) != 1 || lines[0]["beneficiary"] != "****4300" {
		t.Errorf("payout_created lines = %v, want one with the masked beneficiary", lines)
	}
	if strings.Contains(e.logs.String(), "NL91ABNA0417164300") {
		t.Errorf("the beneficiary appears unmasked in the logs")
	}
}

// Many identical creates at once make one row: exactly one 201, the rest 200.
// Racing creates with different fields: one wins, each other is 200 when it
// matches the winner and PAYOUT_CONFLICT when not — never a 500 from the
// primary key, never a second row.
func TestConcurrentCreates(t *testing.T) {
	t.Parallel()
	e := start(t, func(c *payment.Config) { c.DBTimeout = 20 * time.Second })
	const n = 32
	json := map[string][]string{"Content-Type": {"application/json"}}
	for _, mixed := range []bool{false, true} {
		id := fmt.Sprintf("p-mixed-%v", mixed)
		codes := make([]int, n)
		bodies := make([]string, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			amount := 100
			if mixed {
				amount = 100 + i%3
			}
			bodies[i] = fmt.Sprintf(`{"payoutId":%q,"accountId":"acct-1","amountMinor":%d,"currency":"EUR","beneficiary":"B-1"}`, id, amount)
			wg.Go(func() {
				<-start
				c, _, err := e.tryRaw(http.MethodPost, "/v1/payouts", json, bodies[i])
				if err != nil {
					t.Error(err)
				}
				codes[i] = c
			})
		}
		close(start)
		wg.Wait()
		var stored int64
		if err := e.db.QueryRow(context.Background(), "SELECT amount_minor FROM payout WHERE payout_id=$1", id).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		created := 0
		for i, c := range codes {
			matches := strings.Contains(bodies[i], fmt.Sprintf(`"amountMinor":%d,`, stored))
			switch {
			case c == http.StatusCreated && matches:
				created++
			case c == http.StatusOK && matches, c == http.StatusConflict && !matches:
			default:
				t.Errorf("%s: create %d answered %d (matches the stored row: %v)", id, i, c, matches)
			}
		}
		if created != 1 {
			t.Errorf("%s: %d creates answered 201, want 1", id, created)
		}
		if rows := e.queryInt(t, "SELECT count(*) FROM payout WHERE payout_id=$1", id); rows != 1 {
			t.Errorf("%s: %d rows", id, rows)
		}
	}
}

// GET one payout: 200 with the payout, 404 NOT_FOUND for an unknown id.
func TestGetPayout(t *testing.T) {
	t.Parallel()
	e := start(t)
	created := e.create(t, "p-1", "acct-1", 42)
	code, b := e.raw(t, http.MethodGet, "/v1/payouts/p-1", nil, "")
	if code != http.StatusOK {
		t.Fatalf("GET: %d %s", code, b)
	}
	checkTimestamps(t, b)
	if got := decodePayout(t, b); got.PayoutID != "p-1" || got.AmountMinor != 42 || !got.CreatedAt.Equal(created.CreatedAt) {
		t.Fatalf("GET = %+v", got)
	}
	code, b = e.raw(t, http.MethodGet, "/v1/payouts/p-2", nil, "")
	if code != http.StatusNotFound || !strings.Contains(string(b), `"code":"NOT_FOUND"`) {
		t.Fatalf("GET unknown: %d %s", code, b)
	}
}

// List: filters combine, oldest updatedAt first with payoutId breaking ties,
// updatedBefore is exclusive, limit defaults to 100 and may go to 1000.
func TestListPayouts(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx := context.Background()
	// 1001 PENDING payouts written directly: a0000…a1000, updated_at one second
	// apart with pairs sharing a timestamp (so payoutId must break the tie).
	e.exec(t, `INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary, updated_at)
	  SELECT 'a' || lpad(i::text, 4, '0'), CASE WHEN i % 2 = 0 THEN 'acct-even' ELSE 'acct-odd' END, 10, 'EUR', 'B',
	         timestamptz '2025-01-01 00:00:00Z' + ((1000 - i) / 2) * interval '1 second'
	  FROM generate_series(0, 1000) AS i`)
	all, err := e.client.List(ctx, "", "", nil, 0)
	if err != nil || len(all) != payment.DefaultListLimit {
		t.Fatalf("default limit: %d payouts, %v; want %d", len(all), err, payment.DefaultListLimit)
	}
	all, err = e.client.List(ctx, "", "", nil, payment.MaxListLimit)
	if err != nil || len(all) != payment.MaxListLimit {
		t.Fatalf("limit 1000: %d payouts, %v", len(all), err)
	}
	for i := 1; i < len(all); i++ {
		a, b := all[i-1], all[i]
		if b.UpdatedAt.Before(a.UpdatedAt) || (b.UpdatedAt.Equal(a.UpdatedAt) && b.PayoutID <= a.PayoutID) {
			t.Fatalf("out of order at %d: %s %s then %s %s", i, a.PayoutID, a.UpdatedAt, b.PayoutID, b.UpdatedAt)
		}
	}
	if all[0].PayoutID != "a0999" || all[1].PayoutID != "a1000" {
		t.Fatalf("oldest first: got %s, %s; want a0999, a1000", all[0].PayoutID, all[1].PayoutID)
	}

	e.claim(t, "a0500", 1, "exec-a")
	e.claim(t, "a0998", 1, "exec-a")
	claimed, err := e.client.List(ctx, lockapi.StatusClaimed, "", nil, 10)
	if err != nil || len(claimed) != 2 || claimed[0].PayoutID != "a0500" || claimed[1].PayoutID != "a0998" {
		t.Fatalf("status=CLAIMED: %v, %v; want a0500 then a0998 (claim order)", ids(claimed), err)
	}
	evenClaimed, err := e.client.List(ctx, lockapi.StatusClaimed, "acct-even", nil, 10)
	if err != nil || len(evenClaimed) != 2 {
		t.Fatalf("status+accountId: %v, %v", ids(evenClaimed), err)
	}
	odd, err := e.client.List(ctx, lockapi.StatusPending, "acct-odd", nil, 1000)
	if err != nil || len(odd) != 500 {
		t.Fatalf("status=PENDING&accountId=acct-odd: %d, %v; want 500", len(odd), err)
	}
	for _, p := range odd {
		if p.AccountID != "acct-odd" || p.Status != lockapi.StatusPending {
			t.Fatalf("filter leaked %+v", p)
		}
	}
	// updatedBefore is exclusive: a0997 and a0998 share the cut-off second (a0998
	// has since been claimed), a0999 and a1000 are older.
	cut := time.Date(2025, 1, 1, 0, 0, 1, 0, time.UTC)
	older, err := e.client.List(ctx, lockapi.StatusPending, "", &cut, 10)
	if err != nil || !slices.Equal(ids(older), []string{"a0999", "a1000"}) {
		t.Fatalf("updatedBefore: %v, %v; want [a0999 a1000]", ids(older), err)
	}
	none, err := e.client.List(ctx, lockapi.StatusDeclined, "", nil, 5)
	if err != nil || none == nil || len(none) != 0 {
		t.Fatalf("no match: %v, %v; want an empty list", none, err)
	}
	code, b := e.raw(t, http.MethodGet, "/v1/payouts?status=DECLINED", nil, "")
	if code != http.StatusOK || strings.TrimSpace(string(b)) != `{"payouts":[]}` {
		t.Fatalf("empty list: %d %s", code, b)
	}
}

func ids(ps []lockapi.Payout) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.PayoutID
	}
	return out
}

func decodePayout(t *testing.T, b []byte) lockapi.Payout {
	t.Helper()
	var p lockapi.Payout
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatalf("payout body %s: %v", b, err)
	}
	return p
}

// checkTimestamps asserts createdAt and updatedAt are RFC 3339 with nanoseconds, in UTC.
func checkTimestamps(t *testing.T, b []byte) {
	t.Helper()
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"createdAt", "updatedAt"} {
		s, _ := raw[k].(string)
		ts, err := time.Parse(time.RFC3339Nano, s)
		if err != nil || !strings.HasSuffix(s, "Z") || ts.Format(time.RFC3339Nano) != s {
			t.Errorf("%s = %q: not RFC 3339 nanosecond UTC (%v)", k, s, err)
		}
	}
}
