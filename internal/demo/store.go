package demo

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// counts is what the progress line shows from paydb.
type counts struct {
	payouts, settled   int
	admitted, fenced   int
	duplicate, pending int // pending: rows still unresolved
}

const (
	selectPayoutCounts = `
SELECT count(*), count(*) FILTER (WHERE status IN ('PAID','DECLINED','AMBIGUOUS','NOT_PRESENTED')) FROM payout`
	selectSubmissionCounts = `
SELECT count(*) FILTER (WHERE outcome IS NULL OR outcome IN ('ACKED','REJECTED','TIMEOUT','UNSENT')),
       count(*) FILTER (WHERE outcome = 'FENCED'),
       count(*) FILTER (WHERE outcome = 'DUPLICATE'),
       count(*) FILTER (WHERE outcome IS NULL)
  FROM rail_submission`
	selectPaydbRows  = `SELECT (SELECT count(*) FROM payout) + (SELECT count(*) FROM rail_submission) + (SELECT count(*) FROM rail_high_water)`
	selectLockdbRows = `SELECT count(*) FROM lock_lease`
	truncatePaydb    = `TRUNCATE ledger_entry, payout_settlement, payout_history, payout, rail_submission, rail_high_water, rail_statement_line, reconciliation_decision, reconciliation_exception, reconciler_cursor`
	truncateLockdb   = `TRUNCATE lock_grant, lock_lease`
)

func readCounts(ctx context.Context, paydb *pgxpool.Pool) (counts, error) {
	var c counts
	if err := paydb.QueryRow(ctx, selectPayoutCounts).Scan(&c.payouts, &c.settled); err != nil {
		return c, fmt.Errorf("count payouts: %w", err)
	}
	if err := paydb.QueryRow(ctx, selectSubmissionCounts).Scan(&c.admitted, &c.fenced, &c.duplicate, &c.pending); err != nil {
		return c, fmt.Errorf("count submissions: %w", err)
	}
	return c, nil
}

// isEmpty reports whether paydb and lockdb hold no rows of the system's tables:
// lockdemo's report judges everything in them, so it starts from nothing.
func isEmpty(ctx context.Context, paydb, lockdb *pgxpool.Pool) (bool, error) {
	var n, m int64
	if err := paydb.QueryRow(ctx, selectPaydbRows).Scan(&n); err != nil {
		return false, fmt.Errorf("inspect paydb: %w", err)
	}
	if err := lockdb.QueryRow(ctx, selectLockdbRows).Scan(&m); err != nil {
		return false, fmt.Errorf("inspect lockdb: %w", err)
	}
	return n == 0 && m == 0, nil
}

// wipe empties the system's tables. lockdemo only calls it on databases it found
// empty and filled itself (the second run of --compare on given databases).
func wipe(ctx context.Context, paydb, lockdb *pgxpool.Pool) error {
	if _, err := paydb.Exec(ctx, truncatePaydb); err != nil {
		return fmt.Errorf("empty paydb: %w", err)
	}
	if _, err := lockdb.Exec(ctx, truncateLockdb); err != nil {
		return fmt.Errorf("empty lockdb: %w", err)
	}
	return nil
}
