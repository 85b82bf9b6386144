package paydb_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"lock.dev/internal/paydb"
	"lock.dev/internal/pgtest"
)

// A paydb that holds payouts from before reconciliation (version 2) migrates forward: every
// row keeps its status, the three reconciliation tables appear, NOT_PRESENTED is
// admitted and any other unknown status is still refused.
func TestReconciliationMigratesAnExistingPaydbForward(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.EmptyURL(t))
	tree := paydb.Tree()
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, tree.FS, goose.WithTableName(tree.Table))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 2); err != nil {
		t.Fatalf("migrate to version 2: %v", err)
	}
	for i, st := range []string{"PENDING", "CLAIMED", "PAID", "DECLINED", "AMBIGUOUS"} {
		if _, err := pool.Exec(ctx, `INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary, status)
			VALUES ($1, 'acct-1', $2, 'EUR', 'NL91ABNA0417164300', $3)`, "old-"+st, i+1, st); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE payout SET status = 'NOT_PRESENTED' WHERE payout_id = 'old-AMBIGUOUS'`); !isCheckViolation(err) {
		t.Fatalf("before the migration NOT_PRESENTED = %v, want a check violation", err)
	}

	if _, err := tree.Migrate(ctx, pool, nil); err != nil {
		t.Fatalf("migrate forward: %v", err)
	}
	if err := tree.Check(ctx, pool); err != nil {
		t.Fatalf("Check after migrating forward: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payout WHERE payout_id LIKE 'old-%' AND status = substr(payout_id, 5)`).Scan(&n); err != nil || n != 5 {
		t.Fatalf("%d of 5 old payouts kept their status (err %v)", n, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE payout SET status = 'NOT_PRESENTED' WHERE payout_id = 'old-AMBIGUOUS'`); err != nil {
		t.Fatalf("after the migration NOT_PRESENTED is refused: %v", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE payout SET status = 'SETTLED' WHERE payout_id = 'old-PAID'`); !isCheckViolation(err) {
		t.Fatalf("an unknown status = %v, want a check violation", err)
	}
	for _, table := range []string{"rail_statement_line", "reconciliation_exception", "reconciler_cursor", "payout_settlement"} {
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil || !ok {
			t.Errorf("table %s missing after migrate (err %v)", table, err)
		}
	}
}

// The exception index records each (kind, payout, seq) once, NULLs included, and
// the cursor holds one row at most.
func TestReconciliationTablesRecordOnce(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.PaydbURL(t))
	const ins = `INSERT INTO reconciliation_exception (kind, payout_id, seq, detail) VALUES ($1, $2, $3, 'x')
		ON CONFLICT DO NOTHING`
	for range 2 {
		for _, args := range [][]any{
			{"UNKNOWN_REFERENCE", nil, int64(7)},
			{"PAID_WITHOUT_LINE", "p-1", nil},
			{"PRESENTED_TWICE", "p-1", int64(8)},
		} {
			if _, err := pool.Exec(ctx, ins, args...); err != nil {
				t.Fatal(err)
			}
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM reconciliation_exception`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d exception rows after inserting three twice, want 3 (err %v)", n, err)
	}
	if _, err := pool.Exec(ctx, ins, "DOUBLE_TROUBLE", "p-1", 1); !isCheckViolation(err) {
		t.Fatalf("an unknown kind = %v, want a check violation", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO reconciler_cursor DEFAULT VALUES`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO reconciler_cursor (id) VALUES (false)`); !isCheckViolation(err) {
		t.Fatalf("a second cursor row = %v, want a check violation", err)
	}
}

func isCheckViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23514"
}
