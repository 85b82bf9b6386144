package invariants

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/railstub"
	"lock.dev/lockapi"
)

const (
	selectSubmissions = `
SELECT submission_id, payout_id, account_id, presented_token, owner_id, idempotency_key,
       amount_minor, currency, beneficiary, coalesce(outcome, ''), coalesce(rail_reference, ''),
       coalesce(decline_reason, ''), submitted_at, resolved_at
  FROM rail_submission
 ORDER BY submission_id`

	selectHighWater = `SELECT account_id, highest_token FROM rail_high_water`

	selectPayouts = `
SELECT payout_id, account_id, amount_minor, currency, beneficiary, status, fence_token,
       coalesce(claimed_by, ''), coalesce(rail_reference, ''), coalesce(decline_reason, ''),
       created_at, updated_at
  FROM payout
 ORDER BY payout_id`

	selectLedger = `
SELECT entry_id, payout_id, account_id, amount_minor, currency, posted_token, created_at
  FROM ledger_entry
 ORDER BY entry_id`

	selectStatementLines = `
SELECT seq, received_at, reference, account_id, amount_minor, currency, coalesce(beneficiary, ''), result,
       coalesce(rail_reference, ''), coalesce(decline_reason, '')
  FROM rail_statement_line
 ORDER BY seq`

	selectExceptions = `
SELECT exception_id, kind, coalesce(payout_id, ''), coalesce(seq, 0), detail
  FROM reconciliation_exception
 ORDER BY exception_id`

	selectCursor = `SELECT last_seq, read_at FROM reconciler_cursor`

	selectSettlements = `
SELECT payout_id, outcome, coalesce(rail_reference, ''), coalesce(statement_seq, 0)
  FROM payout_settlement
 ORDER BY payout_id`

	selectMoves = `
SELECT history_id, payout_id, status, fence_token, coalesce(owner_id, ''), coalesce(actor, ''),
       coalesce(rail_reference, ''), coalesce(decline_reason, ''), recorded_at
  FROM payout_history
 ORDER BY history_id`

	selectGrants = `
SELECT lock_name, token, owner_id, acquired_at, ttl_ms, expires_at, released_at
  FROM lock_grant
 ORDER BY lock_name, token`
)

// Load reads the ground truth of a run: paydb's tables, lockdb's grant
// history, and the rail-stub's call log as the caller fetched it. paydb and lockdb
// may be the same pool. It should run once the system is quiet: rows written
// while it reads may be seen by one query and not by another.
func Load(ctx context.Context, paydb, lockdb *pgxpool.Pool, calls []railstub.Call) (History, error) {
	h := History{HighWater: map[string]int64{}}
	h.Calls = slices.Clone(calls)
	slices.SortFunc(h.Calls, func(a, b railstub.Call) int { return cmp.Compare(a.Seq, b.Seq) })

	var err error
	h.Submissions, err = query(ctx, paydb, "rail_submission", selectSubmissions, func(r pgx.CollectableRow) (Submission, error) {
		var s Submission
		err := r.Scan(&s.SubmissionID, &s.PayoutID, &s.AccountID, &s.PresentedToken, &s.OwnerID,
			&s.IdempotencyKey, &s.AmountMinor, &s.Currency, &s.Beneficiary, &s.Outcome,
			&s.RailReference, &s.DeclineReason, &s.SubmittedAt, &s.ResolvedAt)
		return s, err
	})
	if err != nil {
		return h, err
	}
	type mark struct {
		account string
		token   int64
	}
	marks, err := query(ctx, paydb, "rail_high_water", selectHighWater, func(r pgx.CollectableRow) (mark, error) {
		var m mark
		err := r.Scan(&m.account, &m.token)
		return m, err
	})
	if err != nil {
		return h, err
	}
	for _, m := range marks {
		h.HighWater[m.account] = m.token
	}
	h.Payouts, err = query(ctx, paydb, "payout", selectPayouts, func(r pgx.CollectableRow) (Payout, error) {
		var p Payout
		err := r.Scan(&p.PayoutID, &p.AccountID, &p.AmountMinor, &p.Currency, &p.Beneficiary, &p.Status, &p.FenceToken,
			&p.ClaimedBy, &p.RailReference, &p.DeclineReason, &p.CreatedAt, &p.UpdatedAt)
		return p, err
	})
	if err != nil {
		return h, err
	}
	h.Ledger, err = query(ctx, paydb, "ledger_entry", selectLedger, func(r pgx.CollectableRow) (LedgerEntry, error) {
		var e LedgerEntry
		err := r.Scan(&e.EntryID, &e.PayoutID, &e.AccountID, &e.AmountMinor, &e.Currency, &e.PostedToken, &e.CreatedAt)
		return e, err
	})
	if err != nil {
		return h, err
	}
	if err := loadReconciliation(ctx, paydb, &h); err != nil {
		return h, err
	}
	h.Grants, err = query(ctx, lockdb, "lock_grant", selectGrants, func(r pgx.CollectableRow) (Grant, error) {
		var g Grant
		err := r.Scan(&g.LockName, &g.Token, &g.OwnerID, &g.AcquiredAt, &g.TTLMs, &g.ExpiresAt, &g.ReleasedAt)
		return g, err
	})
	if err != nil {
		return h, err
	}
	return h, nil
}

func query[T any](ctx context.Context, pool *pgxpool.Pool, table, sql string, scan func(pgx.CollectableRow) (T, error)) ([]T, error) {
	rows, err := pool.Query(ctx, sql)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", table, err)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", table, err)
	}
	return out, nil
}

// loadReconciliation reads the reconciler's tables and payment-resource's
// settlement records (docs/contracts/reconciliation.md) and its payout history
// (docs/contracts/books.md).
func loadReconciliation(ctx context.Context, paydb *pgxpool.Pool, h *History) error {
	var err error
	h.StatementLines, err = query(ctx, paydb, "rail_statement_line", selectStatementLines, func(r pgx.CollectableRow) (lockapi.StatementLine, error) {
		var l lockapi.StatementLine
		var ref, reason string
		err := r.Scan(&l.Seq, &l.ReceivedAt, &l.Reference, &l.AccountID, &l.AmountMinor, &l.Currency, &l.Beneficiary, &l.Result,
			&ref, &reason)
		l.RailReference, l.DeclineReason = orNull(ref), orNull(reason)
		return l, err
	})
	if err != nil {
		return err
	}
	h.Exceptions, err = query(ctx, paydb, "reconciliation_exception", selectExceptions, func(r pgx.CollectableRow) (Exception, error) {
		var x Exception
		err := r.Scan(&x.ExceptionID, &x.Kind, &x.PayoutID, &x.Seq, &x.Detail)
		return x, err
	})
	if err != nil {
		return err
	}
	cursors, err := query(ctx, paydb, "reconciler_cursor", selectCursor, func(r pgx.CollectableRow) (Cursor, error) {
		var c Cursor
		err := r.Scan(&c.LastSeq, &c.ReadAt)
		return c, err
	})
	if err != nil {
		return err
	}
	if len(cursors) == 1 {
		h.Cursor = &cursors[0]
	}
	h.Settlements, err = query(ctx, paydb, "payout_settlement", selectSettlements, func(r pgx.CollectableRow) (Settlement, error) {
		var s Settlement
		err := r.Scan(&s.PayoutID, &s.Outcome, &s.RailReference, &s.StatementSeq)
		return s, err
	})
	if err != nil {
		return err
	}
	h.Moves, err = query(ctx, paydb, "payout_history", selectMoves, func(r pgx.CollectableRow) (Move, error) {
		var m Move
		err := r.Scan(&m.HistoryID, &m.PayoutID, &m.Status, &m.FenceToken, &m.OwnerID, &m.Actor,
			&m.RailReference, &m.DeclineReason, &m.RecordedAt)
		return m, err
	})
	return err
}

// orNull is s as a nullable column: nil when empty.
func orNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// text is a nullable column as a string: empty when NULL.
func text(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
