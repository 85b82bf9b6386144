package invariants

import (
	"context"
	"os"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/internal/railstub"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestLoad writes a small history into real, migrated paydb and lockdb databases
// and reads it back: every column lands in its field, NULLs become the zero or
// nil they are documented as, and the calls come back in seq order.
func TestLoad(t *testing.T) {
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
	g1 := at(1)
	if _, err := lockdb.Exec(ctx, `INSERT INTO lock_grant (lock_name, token, owner_id, acquired_at, ttl_ms, expires_at, released_at)
		VALUES ('account:acct-A', 1, 'exec-1', $1, 1000, $2, $3), ('account:acct-A', 2, 'exec-2', $2, 1000, $4, NULL)`,
		g1, at(2), at(1.5), at(3)); err != nil {
		t.Fatal(err)
	}
	exec(`INSERT INTO rail_high_water (account_id, highest_token) VALUES ('acct-A', 2)`)
	exec(`INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary, status, fence_token, claimed_by, rail_reference)
		VALUES ('p1', 'acct-A', 1000, 'EUR', 'NL91ABNA0417164300', 'PAID', 1, 'exec-1', 'RS-1'),
		       ('p2', 'acct-A', 2000, 'EUR', 'NL91ABNA0417164300', 'CLAIMED', 2, 'exec-2', NULL)`)
	exec(`INSERT INTO ledger_entry (payout_id, account_id, amount_minor, currency, posted_token) VALUES ('p1', 'acct-A', -1000, 'EUR', 1)`)
	exec(`INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency,
			beneficiary, outcome, rail_reference, submitted_at, resolved_at)
		VALUES ('p1', 'acct-A', 1, 'exec-1', 'p1:1', 1000, 'EUR', 'NL91ABNA0417164300', 'ACKED', 'RS-1', $1, $2)`, at(1.1), at(1.3))
	exec(`INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency,
			beneficiary, submitted_at)
		VALUES ('p2', 'acct-A', 2, 'exec-2', 'p2:2', 2000, 'EUR', 'NL91ABNA0417164300', $1)`, at(2.1))

	calls := []railstub.Call{
		{Seq: 2, ReceivedAt: at(2.2), Reference: "p2", AccountID: "acct-A", AmountMinor: 2000, Currency: "EUR",
			Beneficiary: "NL91ABNA0417164300", Result: railstub.ResultAccepted, RailReference: "RS-2"},
		{Seq: 1, ReceivedAt: at(1.2), Reference: "p1", AccountID: "acct-A", AmountMinor: 1000, Currency: "EUR",
			Beneficiary: "NL91ABNA0417164300", Result: railstub.ResultAccepted, RailReference: "RS-1"},
	}
	h, err := Load(ctx, paydb, lockdb, calls)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Calls) != 2 || h.Calls[0].Seq != 1 || h.Calls[1].Seq != 2 || calls[0].Seq != 2 {
		t.Errorf("calls not sorted by seq into a copy: %+v", h.Calls)
	}
	if len(h.Submissions) != 2 {
		t.Fatalf("submissions: %+v", h.Submissions)
	}
	s1, s2 := h.Submissions[0], h.Submissions[1]
	if s1.SubmissionID >= s2.SubmissionID || s1.PayoutID != "p1" || s1.Outcome != "ACKED" || s1.RailReference != "RS-1" ||
		s1.ResolvedAt == nil || !s1.ResolvedAt.Equal(at(1.3)) || !s1.SubmittedAt.Equal(at(1.1)) ||
		s1.IdempotencyKey != "p1:1" || s1.Beneficiary != "NL91ABNA0417164300" || s1.AmountMinor != 1000 {
		t.Errorf("first submission: %+v", s1)
	}
	if s2.Outcome != Unresolved || s2.ResolvedAt != nil || s2.RailReference != "" || !s2.Forwardable() {
		t.Errorf("unresolved submission: %+v", s2)
	}
	if h.HighWater["acct-A"] != 2 || len(h.HighWater) != 1 {
		t.Errorf("high water: %v", h.HighWater)
	}
	if len(h.Payouts) != 2 || h.Payouts[0].Status != "PAID" || h.Payouts[0].RailReference != "RS-1" ||
		h.Payouts[1].Status != "CLAIMED" || h.Payouts[1].RailReference != "" || h.Payouts[1].ClaimedBy != "exec-2" {
		t.Errorf("payouts: %+v", h.Payouts)
	}
	if len(h.Ledger) != 1 || h.Ledger[0].AmountMinor != -1000 || h.Ledger[0].PostedToken != 1 {
		t.Errorf("ledger: %+v", h.Ledger)
	}
	if len(h.Grants) != 2 || h.Grants[0].Token != 1 || h.Grants[0].TTLMs != 1000 || h.Grants[0].ReleasedAt == nil ||
		!h.Grants[0].AcquiredAt.Equal(g1) || h.Grants[1].ReleasedAt != nil {
		t.Errorf("grants: %+v", h.Grants)
	}

	if h.Cursor != nil || len(h.StatementLines) != 0 || len(h.Exceptions) != 0 || len(h.Settlements) != 0 {
		t.Errorf("reconciler records before any reconciler ran: %+v %+v %+v %+v", h.Cursor, h.StatementLines, h.Exceptions, h.Settlements)
	}

	r := Evaluate(h, Options{FencingEnabled: true})
	if !r.OK() || r.Payouts.Claimed != 1 || r.Submissions.Unresolved != 1 {
		t.Errorf("report of the loaded history: %+v", r)
	}
	if r := Evaluate(h, Options{FencingEnabled: true, RequireSettled: true}); r.Count(CheckUnsettled) != 1 {
		t.Errorf("the CLAIMED payout should be unsettled: %v", r.Violations)
	}
}

// TestLoadReconciliation reads the reconciler's tables and the settle records:
// NULLs become the documented zero values.
func TestLoadReconciliation(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	paydb := pgtest.Pool(t, pgtest.PaydbURL(t))
	lockdb := pgtest.Pool(t, pgtest.LockdbURL(t))
	for _, sql := range []string{
		`INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary, status) VALUES
			('p1', 'acct-A', 1000, 'EUR', 'NL91ABNA0417164300', 'PAID'), ('p2', 'acct-A', 2000, 'EUR', 'NL91ABNA0417164300', 'NOT_PRESENTED')`,
		`INSERT INTO payout_settlement (payout_id, outcome, rail_reference, statement_seq) VALUES ('p1', 'PAID', 'RS-1', 1), ('p2', 'NOT_PRESENTED', NULL, NULL)`,
		`INSERT INTO rail_statement_line (seq, received_at, reference, account_id, amount_minor, currency, beneficiary, result, rail_reference, decline_reason) VALUES
			(1, '2025-03-01T12:00:01.5Z', 'p1', 'acct-A', 1000, 'EUR', 'NL91ABNA0417164300', 'ACCEPTED', 'RS-1', NULL),
			(2, '2025-03-01T12:00:02Z', 'zz', 'acct-Z', 5, 'EUR', 'NL91ABNA0417164300', 'DECLINED', NULL, 'no')`,
		`INSERT INTO reconciliation_exception (kind, payout_id, seq, detail) VALUES ('UNKNOWN_REFERENCE', NULL, 2, 'zz')`,
		`INSERT INTO reconciler_cursor (last_seq, read_at) VALUES (2, '2025-03-01T12:00:03Z')`,
	} {
		if _, err := paydb.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	h, err := Load(ctx, paydb, lockdb, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.StatementLines) != 2 || text(h.StatementLines[0].RailReference) != "RS-1" || h.StatementLines[0].DeclineReason != nil ||
		!h.StatementLines[0].ReceivedAt.Equal(at(1.5)) || text(h.StatementLines[1].DeclineReason) != "no" || h.StatementLines[1].RailReference != nil {
		t.Errorf("statement lines: %+v", h.StatementLines)
	}
	if len(h.Exceptions) != 1 || h.Exceptions[0].Kind != "UNKNOWN_REFERENCE" || h.Exceptions[0].PayoutID != "" || h.Exceptions[0].Seq != 2 {
		t.Errorf("exceptions: %+v", h.Exceptions)
	}
	if h.Cursor == nil || h.Cursor.LastSeq != 2 || h.Cursor.ReadAt == nil || !h.Cursor.ReadAt.Equal(at(3)) {
		t.Errorf("cursor: %+v", h.Cursor)
	}
	if len(h.Settlements) != 2 || h.Settlements[0] != (Settlement{PayoutID: "p1", Outcome: "PAID", RailReference: "RS-1", StatementSeq: 1}) ||
		h.Settlements[1] != (Settlement{PayoutID: "p2", Outcome: "NOT_PRESENTED"}) {
		t.Errorf("settlements: %+v", h.Settlements)
	}
}
