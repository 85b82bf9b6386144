package railproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// The audit trail comes in pages of at most 100 rows, oldest first, each with
// the submissionId to pass as after for the next (null on the last); after is
// parsed strictly.
func TestAuditTrailPages(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	// 250 attempts of one payout, interleaved with another payout's.
	if _, err := db.Exec(context.Background(), `
		INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor,
		                             currency, beneficiary, outcome, resolved_at)
		SELECT CASE WHEN g % 3 = 0 THEN 'p-other' ELSE 'p-long' END, 'acct-long', g, 'w', 'k', 1, 'EUR', 'b', 'FENCED', clock_timestamp()
		  FROM generate_series(1, 375) g`); err != nil {
		t.Fatal(err)
	}
	var want []int64
	for _, r := range rowsOf(t, db, "p-long") {
		want = append(want, r.ID)
	}
	if len(want) != 250 {
		t.Fatalf("%d rows of p-long", len(want))
	}
	p := startProxy(t, testConfig(dbURL, rail.URL))
	base := p.URL + "/v1/rail/submissions?payoutId=p-long"
	var got []int64
	sizes := []int{}
	u := base
	for range 5 {
		a := get(t, u)
		if a.Status != http.StatusOK {
			t.Fatalf("GET %s: %+v", u, a)
		}
		list, _ := a.Body["submissions"].([]any)
		sizes = append(sizes, len(list))
		for _, e := range list {
			id, _ := e.(map[string]any)["submissionId"].(json.Number).Int64()
			got = append(got, id)
		}
		next, present := a.Body["next"]
		if !present {
			t.Fatalf("answer without next: %+v", a.Body)
		}
		if next == nil {
			break
		}
		n, _ := next.(json.Number).Int64()
		if n != got[len(got)-1] {
			t.Fatalf("next %d, last row of the page %d", n, got[len(got)-1])
		}
		u = fmt.Sprintf("%s&after=%d", base, n)
	}
	if fmt.Sprint(sizes) != "[100 100 50]" || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pages of %v rows; ids %v, want %v", sizes, got, want)
	}
	if a := get(t, fmt.Sprintf("%s&after=%d", base, want[len(want)-1])); a.Status != http.StatusOK ||
		len(a.Body["submissions"].([]any)) != 0 || a.Body["next"] != nil {
		t.Fatalf("after the last row: %+v", a)
	}
	for _, bad := range []string{"after=0", "after=-1", "after=01", "after=abc", "after=1.5", "after=", "after=1&after=2",
		"after=99999999999999999999", "after=%201"} {
		a := get(t, base+"&"+bad)
		errs, _ := a.Body["errors"].([]any)
		if a.Status != http.StatusBadRequest || a.code() != lockapi.CodeInvalidRequest || len(errs) != 1 ||
			errs[0].(map[string]any)["field"] != "after" {
			t.Errorf("%s: %+v", bad, a)
		}
	}
}

// With a million rows in rail_submission the audit-trail read is an index range
// scan of rail_submission_payout_idx, not a scan of the table. The rows are made
// by one SQL statement (payout ids in index order, so the insert takes seconds,
// not minutes). Not parallel: the insert loads the test cluster that the
// package's other tests share, and their 2 s bounds would feel it; it runs
// before they start, and the rows go when it ends.
func TestAuditTrailReadIsIndexedOnAMillionRows(t *testing.T) {
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	ctx := context.Background()
	t.Cleanup(func() { _, _ = db.Exec(context.Background(), "TRUNCATE rail_submission") })
	if _, err := db.Exec(ctx, `
		INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor,
		                             currency, beneficiary, outcome, resolved_at)
		SELECT 'filler-' || lpad(g::text, 7, '0'), 'acct-filler', g, 'w', 'k', 1, 'EUR', 'b', 'FENCED', now()
		  FROM generate_series(1, 1000000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, "ANALYZE rail_submission"); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(ctx, "EXPLAIN "+listSQL, "filler-0000777", int64(0), MaxListPage+1)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "rail_submission_payout_idx") || strings.Contains(text, "Seq Scan") {
		t.Fatalf("the audit-trail read is not an index scan of rail_submission_payout_idx:\n%s", text)
	}
	rail := startStub(t, 0)
	p := startProxy(t, testConfig(dbURL, rail.URL))
	a := get(t, p.URL+"/v1/rail/submissions?payoutId=filler-0000777")
	if list, _ := a.Body["submissions"].([]any); a.Status != http.StatusOK || len(list) != 1 {
		t.Fatalf("audit read: %+v", a)
	}
}
