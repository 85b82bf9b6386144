package dbconn_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/pgcluster"
)

// What raising synchronous_commit costs a transaction: BEGIN, one INSERT,
// COMMIT through pool.Begin and through dbconn.Begin (the raise rides with BEGIN,
// no extra round trip). One server, no standby: the difference is the raise alone.
//
//	go test -run '^$' -bench BeginCommit -benchtime 3s ./internal/dbconn/
func BenchmarkBeginCommit(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	c, err := pgcluster.Start(ctx, pgcluster.Options{MaxConnections: 20})
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Stop()
	pool, err := dbconn.Open(context.Background(), c.URL("postgres"), 4)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), "CREATE TABLE t (v int)"); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name  string
		begin func(context.Context) (pgx.Tx, error)
	}{
		{"pool.Begin", pool.Begin},
		{"dbconn.Begin", func(ctx context.Context) (pgx.Tx, error) { return dbconn.Begin(ctx, pool) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			for b.Loop() {
				tx, err := bc.begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
