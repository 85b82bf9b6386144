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

// reconciliation_decision (migration 00014): an exception is decided once, by
// someone, for a reason, with one of the closed set of decisions; the login and
// the time are paydb's; a decision names an exception that exists; and the
// migration does not go down while a decision would be lost.
func TestReconciliationDecisionTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.PaydbURL(t))
	var id int64
	if err := pool.QueryRow(ctx, `INSERT INTO reconciliation_exception (kind, seq, detail) VALUES ('UNKNOWN_REFERENCE', 9, 'x')
	  RETURNING exception_id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	const decide = `INSERT INTO reconciliation_decision (exception_id, decision, decided_by, note) VALUES ($1, $2, $3, $4)`
	code := func(err error) string {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return pgErr.Code
		}
		return ""
	}
	for _, c := range []struct {
		id                 int64
		decision, by, note string
		want               string
	}{
		{id, "forgiven", "alice", "n", "23514"},     // not a decision
		{id, "refunded", " ", "n", "23514"},         // nobody
		{id, "refunded", "alice", " \n", "23514"},   // no reason
		{id + 1, "refunded", "alice", "n", "23503"}, // no such exception
	} {
		if _, err := pool.Exec(ctx, decide, c.id, c.decision, c.by, c.note); code(err) != c.want {
			t.Errorf("%+v: %v, want SQLSTATE %s", c, err, c.want)
		}
	}
	if _, err := pool.Exec(ctx, decide, id, "refunded", "alice", "recalled"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, decide, id, "written-off", "bob", "lost"); code(err) != "23505" {
		t.Fatalf("a second decision: %v, want a unique violation", err)
	}
	var sameLogin, recent bool
	if err := pool.QueryRow(ctx, `SELECT decided_login = session_user, decided_at = now() OR decided_at > now() - interval '1 minute'
	  FROM reconciliation_decision WHERE exception_id = $1`, id).Scan(&sameLogin, &recent); err != nil || !sameLogin || !recent {
		t.Fatalf("decided_login is the login %v, decided_at paydb's clock %v (%v)", sameLogin, recent, err)
	}

	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	tree := paydb.Tree()
	p, err := goose.NewProvider(goose.DialectPostgres, db, tree.FS, goose.WithTableName(tree.Table))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 13); err == nil {
		t.Fatal("going down with a decision recorded succeeded")
	}
	if _, err := pool.Exec(ctx, `DELETE FROM reconciliation_decision`); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 13); err != nil {
		t.Fatalf("down: %v", err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
