package invariants

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/internal/railstub"
)

// What the stale admissions put in front of the rail, from a history written
// into real paydb and lockdb databases and read back with Load: on account
// acct-A the holder of token 2 is admitted first, then the superseded holder of
// token 1 four times — p1 as booked and accepted, p3 with 6.50 EUR where the
// payout now reads 7.00 (a superseded amount) and accepted, p4 UNSENT (never
// presented: not at risk) and p5 declined by the rail. Money at risk: 3
// presentations, 10.00 + 6.50 + 3.00 = 19.50 EUR, 2 accepted, 1 superseded; the
// table shows it beside a fenced run's 0.
func TestMoneyAtRiskFromStaleAdmissions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	paydb := pgtest.Pool(t, pgtest.PaydbURL(t))
	lockdb := pgtest.Pool(t, pgtest.LockdbURL(t))
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := paydb.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if _, err := lockdb.Exec(ctx, `INSERT INTO lock_grant (lock_name, token, owner_id, acquired_at, ttl_ms, expires_at, released_at)
		VALUES ('account:acct-A', 1, 'exec-1', $1, 1000, $2, NULL), ('account:acct-A', 2, 'exec-2', $2, 1000, $3, $3)`,
		at(1), at(2), at(3)); err != nil {
		t.Fatal(err)
	}
	const ben = "NL91ABNA0417164300"
	exec(`INSERT INTO rail_high_water (account_id, highest_token) VALUES ('acct-A', 2)`)
	exec(`INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary, status, fence_token, claimed_by, rail_reference, decline_reason)
		VALUES ('p1', 'acct-A', 1000, 'EUR', $1, 'PAID', 1, 'exec-1', 'RS-1', NULL),
		       ('p2', 'acct-A', 2500, 'EUR', $1, 'PAID', 2, 'exec-2', 'RS-2', NULL),
		       ('p3', 'acct-A', 700, 'EUR', $1, 'PAID', 1, 'exec-1', 'RS-3', NULL),
		       ('p4', 'acct-A', 400, 'EUR', $1, 'CLAIMED', 1, 'exec-1', NULL, NULL),
		       ('p5', 'acct-A', 300, 'EUR', $1, 'DECLINED', 1, 'exec-1', NULL, 'AM04')`, ben)
	for _, s := range []struct {
		payout  string
		token   int64
		amount  int64
		outcome string
		railRef any
	}{
		{"p2", 2, 2500, "ACKED", "RS-2"},
		{"p1", 1, 1000, "ACKED", "RS-1"},
		{"p3", 1, 650, "ACKED", "RS-3"},
		{"p4", 1, 400, "UNSENT", nil},
		{"p5", 1, 300, "REJECTED", nil},
	} {
		exec(`INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency,
				beneficiary, outcome, rail_reference, submitted_at, resolved_at)
			VALUES ($1, 'acct-A', $2, $3, $4, $5, 'EUR', $6, $7, $8, $9, $9)`,
			s.payout, s.token, fmt.Sprintf("exec-%d", s.token), fmt.Sprintf("%s:%d", s.payout, s.token), s.amount, ben, s.outcome, s.railRef, at(2.5))
	}
	call := func(seq int64, ref string, amount int64, result, railRef string) railstub.Call {
		return railstub.Call{Seq: seq, ReceivedAt: at(2.5 + float64(seq)/10), Reference: ref, AccountID: "acct-A", AmountMinor: amount,
			Currency: "EUR", Beneficiary: ben, Result: result, RailReference: railRef}
	}
	calls := []railstub.Call{
		call(1, "p2", 2500, railstub.ResultAccepted, "RS-2"),
		call(2, "p1", 1000, railstub.ResultAccepted, "RS-1"),
		call(3, "p3", 650, railstub.ResultAccepted, "RS-3"),
		call(4, "p5", 300, railstub.ResultDeclined, ""),
	}
	h, err := Load(ctx, paydb, lockdb, calls)
	if err != nil {
		t.Fatal(err)
	}
	off := Evaluate(h, Options{FencingEnabled: false})
	got := off.MoneyAtRisk
	if off.Count(CheckStaleAdmission) != 4 || got.Presentations != 3 || got.Accepted != 2 || got.Superseded != 1 ||
		len(got.Amounts) != 1 || got.Amounts[0] != (Amount{Currency: "EUR", AmountMinor: 1950}) {
		t.Fatalf("stale admissions %d, money at risk %+v; want 4 stale, 3 presentations of 1950 EUR minor units, 2 accepted, 1 superseded",
			off.Count(CheckStaleAdmission), got)
	}
	on := Evaluate(clean(), fenced)
	if on.MoneyAtRisk.Presentations != 0 || len(on.MoneyAtRisk.Amounts) != 0 {
		t.Fatalf("a clean fenced run has money at risk: %+v", on.MoneyAtRisk)
	}

	var buf bytes.Buffer
	if err := WriteTable(&buf, []Column{{Title: "fencing on", Report: on}, {Title: "fencing off", Report: off}}); err != nil {
		t.Fatal(err)
	}
	var row string
	for l := range strings.Lines(buf.String()) {
		if strings.HasPrefix(l, "money at risk from stale admissions") {
			row = l
		}
	}
	if !strings.Contains(row, "0 presentations, 0.00 EUR") || !strings.Contains(row, "3 presentations, 19.50 EUR") ||
		strings.Index(row, "0 presentations") > strings.Index(row, "3 presentations") {
		t.Fatalf("the money-at-risk row %q; want the fenced column's 0, then 19.50 EUR\n%s", row, buf.String())
	}
	if line := off.MoneyAtRiskLine(); !strings.Contains(line, "Money at risk: 3 presentations, 19.50 EUR") ||
		!strings.Contains(line, "2 of them (money moved); 1 presented the payout otherwise") {
		t.Errorf("the line under the table: %q", line)
	}
	for _, want := range []string{"of which the rail accepted (money moved)", "of which not as the payout reads now"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestMajorUnits(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		minor    int64
		currency string
		want     string
	}{
		{1950, "EUR", "19.50"}, {5, "EUR", "0.05"}, {0, "EUR", "0.00"}, {-1205, "EUR", "-12.05"},
		{100, "JPY", "100"}, {1, "BHD", "0.001"}, {7, "XAU", "7"}, {12, "ZZZ", "12"},
	} {
		if got := MajorUnits(c.minor, c.currency); got != c.want {
			t.Errorf("MajorUnits(%d, %s) = %q, want %q", c.minor, c.currency, got, c.want)
		}
	}
}
