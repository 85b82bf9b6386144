package dbconn_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/testkit"
)

// DurableBatch is an autocommit that keeps the durability rule: with the
// database's default lowered to off its commit still waits for the held
// synchronous standby, a cancelled wait is ErrCommitNotDurable (the row is on the
// primary only), and a failing statement commits nothing.
func TestDurableBatch(t *testing.T) {
	p, db := sharedPair(t)
	pool := open(t, p.URL(db))
	mustExec(t, pool, "CREATE TABLE t (v text)")
	mustExec(t, pool, fmt.Sprintf("ALTER DATABASE %s SET synchronous_commit = off", db))
	pool.Reset()
	ctx := context.Background()
	insert := func(v string) func(*pgx.Batch) {
		return func(b *pgx.Batch) {
			b.Queue("INSERT INTO t VALUES ($1)", v)
			b.Queue("SELECT current_setting('synchronous_commit')")
		}
	}
	var setting string
	read := func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		return br.QueryRow().Scan(&setting)
	}

	if err := dbconn.DurableBatch(ctx, pool, insert("plain"), read); err != nil || setting != "on" {
		t.Fatalf("DurableBatch = %v, synchronous_commit %q inside it; want nil, on", err, setting)
	}

	if err := p.HoldStandby(); err != nil {
		t.Fatal(err)
	}
	done := make(chan commitResult, 1)
	go func() { done <- commitResult{err: dbconn.DurableBatch(ctx, pool, insert("cancelled"), read)} }()
	r := testkit.CancelSyncWait(t, p, false, done)
	if !errors.Is(r.err, dbconn.ErrCommitNotDurable) {
		t.Fatalf("DurableBatch after a cancelled sync wait = %v; want ErrCommitNotDurable", r.err)
	}
	p.ReleaseStandby()
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM t WHERE v = 'cancelled'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the cancelled commit's row: %d %v; want it on the primary", n, err)
	}

	err := dbconn.DurableBatch(ctx, pool, func(b *pgx.Batch) {
		b.Queue("INSERT INTO t VALUES ('failed')")
		b.Queue("SELECT 1/0")
	}, func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		_, err := br.Exec()
		return err
	})
	if err == nil || errors.Is(err, dbconn.ErrCommitNotDurable) {
		t.Fatalf("a failing statement: %v; want its error", err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM t WHERE v = 'failed'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows of the failed batch: %d %v; want none", n, err)
	}
}
