package paydb_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/lockdb"
	"lock.dev/internal/paydb"
	"lock.dev/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// Both trees on one database, each migrated by several runs at once: every run
// succeeds, the versions land in their own tables, and Check passes afterwards.
func TestMigrateConcurrentAndSideBySide(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.EmptyURL(t))
	for _, tree := range []dbconn.Tree{paydb.Tree(), lockdb.Tree()} {
		if err := tree.Check(ctx, pool); !errors.Is(err, dbconn.ErrSchemaBehind) {
			t.Fatalf("%s: Check on empty database = %v, want ErrSchemaBehind", tree.Database, err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 4; i++ {
		for _, tree := range []dbconn.Tree{paydb.Tree(), lockdb.Tree()} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := tree.Migrate(ctx, pool, nil); err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent migrate: %v", err)
	}
	for _, tree := range []dbconn.Tree{paydb.Tree(), lockdb.Tree()} {
		if err := tree.Check(ctx, pool); err != nil {
			t.Fatalf("%s: Check after migrate: %v", tree.Database, err)
		}
	}
	for _, table := range []string{"rail_high_water", "rail_submission", "payout", "ledger_entry", "rail_statement_line", "reconciliation_exception", "reconciler_cursor", "payout_settlement", "payout_history", "lock_lease", "lock_grant", "goose_paydb_version", "goose_lockdb_version"} {
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil || !ok {
			t.Errorf("table %s missing after migrate (err %v)", table, err)
		}
	}
}

// A database one migration behind is refused by Check.
func TestCheckDetectsBehind(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.PaydbURL(t))
	if err := paydb.Tree().Check(ctx, pool); err != nil {
		t.Fatalf("Check on migrated template clone: %v", err)
	}
	if _, err := pool.Exec(ctx, "DELETE FROM goose_paydb_version WHERE version_id = (SELECT max(version_id) FROM goose_paydb_version)"); err != nil {
		t.Fatal(err)
	}
	if err := paydb.Tree().Check(ctx, pool); !errors.Is(err, dbconn.ErrSchemaBehind) {
		t.Fatalf("Check one version behind = %v, want ErrSchemaBehind", err)
	}
}
