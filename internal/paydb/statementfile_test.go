package paydb_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"lock.dev/internal/paydb"
	"lock.dev/internal/pgtest"
)

// The statement-file tables: a name is imported once, each other version of it
// recorded once, and a STATEMENT_FILE_CHANGED exception once per version; the
// migration goes down and up again.
func TestStatementFileTables(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.PaydbURL(t))
	sha := func(c string) string { return strings.Repeat(c, 64) }
	exec := func(sql string, args ...any) error {
		_, err := pool.Exec(ctx, sql, args...)
		return err
	}
	const file = `INSERT INTO statement_file (name, sha256, result, entries) VALUES ($1, $2, $3, $4)`
	if err := exec(file, "a.xml", sha("a"), "imported", 3); err != nil {
		t.Fatal(err)
	}
	if err := exec(file, "a.xml", sha("b"), "imported", 3); err == nil {
		t.Fatal("a name imported twice")
	}
	if err := exec(file, "a.xml", sha("b"), "changed", nil); err != nil {
		t.Fatal(err)
	}
	if err := exec(file, "a.xml", sha("b"), "changed", nil); err == nil {
		t.Fatal("a changed version recorded twice")
	}
	if err := exec(file, "b.xml", sha("c"), "imported", nil); !isCheckViolation(err) {
		t.Fatalf("an imported file without its entries = %v, want a check violation", err)
	}
	if err := exec(file, "b.xml", "ABC", "imported", 1); !isCheckViolation(err) {
		t.Fatalf("a malformed sha256 = %v, want a check violation", err)
	}
	var id int64
	if err := pool.QueryRow(ctx, `SELECT file_id FROM statement_file WHERE result = 'changed'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	const exc = `INSERT INTO reconciliation_exception (kind, file_id, detail) VALUES ('STATEMENT_FILE_CHANGED', $1, 'x') ON CONFLICT DO NOTHING`
	for range 2 {
		if err := exec(exc, id); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM reconciliation_exception`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d exceptions after recording one twice (err %v)", n, err)
	}
	if err := exec(`INSERT INTO statement_coverage (account_id, covered_to) VALUES ('acct-1', now())`); err != nil {
		t.Fatal(err)
	}

	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	tree := paydb.Tree()
	p, err := goose.NewProvider(goose.DialectPostgres, db, tree.FS, goose.WithTableName(tree.Table))
	if err != nil {
		t.Fatal(err)
	}
	// down to below 00013: the later migrations go down first
	if _, err := p.DownTo(ctx, 12); err == nil {
		t.Fatal("going down with a STATEMENT_FILE_CHANGED exception recorded succeeded")
	}
	if err := exec(`DELETE FROM reconciliation_exception`); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 12); err != nil {
		t.Fatalf("down: %v", err)
	}
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('statement_file') IS NULL AND to_regclass('statement_coverage') IS NULL`).Scan(&ok); err != nil || !ok {
		t.Fatalf("the tables are still there after down (err %v)", err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
