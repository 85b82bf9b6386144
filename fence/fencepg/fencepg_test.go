package fencepg_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/fence/fencepg"
	"lock.dev/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// newDB is a fresh database with the mark table and a table of guarded writes,
// as a team's migration would make them.
func newDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.Pool(t, pgtest.EmptyURL(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, ddl := range []string{fencepg.Schema, fencepg.Schema, // re-runnable
		`CREATE TABLE entry (id bigserial PRIMARY KEY, resource text NOT NULL, token bigint NOT NULL)`} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatalf("%s: %v", ddl, err)
		}
	}
	return pool
}

// write is one fenced write: Advance, then the row it guards, in one
// transaction, committed only when admitted.
func write(ctx context.Context, pool *pgxpool.Pool, resource string, token int64) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fencepg.Advance(ctx, tx, resource, token); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO entry (resource, token) VALUES ($1, $2)`, resource, token); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func mark(t *testing.T, pool *pgxpool.Pool, resource string) int64 {
	t.Helper()
	m, ok, err := fencepg.Mark(context.Background(), pool, resource)
	if err != nil || !ok {
		t.Fatalf("mark of %s: %d %v %v", resource, m, ok, err)
	}
	return m
}

// The first token sets the mark; an equal token writes again; a greater one
// advances; an older one is refused with the mark, writes nothing, and moves
// nothing; each resource has its own mark.
func TestAdvance(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	ctx := context.Background()
	if _, ok, err := fencepg.Mark(ctx, pool, "ledger:a"); ok || err != nil {
		t.Fatalf("a mark before any write: %v %v", ok, err)
	}
	for _, tok := range []int64{5, 5, 7} {
		if err := write(ctx, pool, "ledger:a", tok); err != nil {
			t.Fatalf("token %d refused: %v", tok, err)
		}
	}
	err := write(ctx, pool, "ledger:a", 6)
	var stale *fencepg.StaleError
	if !errors.Is(err, fencepg.ErrStale) || !errors.As(err, &stale) ||
		*stale != (fencepg.StaleError{Resource: "ledger:a", Presented: 6, Mark: 7}) {
		t.Fatalf("token 6 after 7: %v, want a StaleError with mark 7", err)
	}
	if m := mark(t, pool, "ledger:a"); m != 7 {
		t.Errorf("mark %d after a refusal, want 7", m)
	}
	if err := write(ctx, pool, "ledger:b", 1); err != nil {
		t.Errorf("another resource's first token refused: %v", err)
	}
	var tokens []int64
	rows, _ := pool.Query(ctx, `SELECT token FROM entry WHERE resource = 'ledger:a' ORDER BY id`)
	for rows.Next() {
		var tok int64
		_ = rows.Scan(&tok)
		tokens = append(tokens, tok)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(tokens) != 3 || tokens[0] != 5 || tokens[1] != 5 || tokens[2] != 7 {
		t.Errorf("writes landed %v, want [5 5 7]", tokens)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, tok := range []int64{0, -1} {
		if err := fencepg.Advance(ctx, tx, "ledger:a", tok); err == nil || errors.Is(err, fencepg.ErrStale) {
			t.Errorf("token %d: %v, want an error that is not ErrStale", tok, err)
		}
	}
}

// An advance rolled back with its write leaves the mark where it was.
func TestAdvanceRolledBack(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	ctx := context.Background()
	if err := write(ctx, pool, "ledger:a", 3); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := fencepg.Advance(ctx, tx, "ledger:a", 9); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if m := mark(t, pool, "ledger:a"); m != 3 {
		t.Errorf("mark %d after a rolled-back advance to 9, want 3", m)
	}
	if err := write(ctx, pool, "ledger:a", 4); err != nil {
		t.Errorf("token 4 after the rollback: %v", err)
	}
}

// Many writers with different tokens at once, some the same: the mark ends at
// the greatest, every write admitted landed and every refused one did not, and
// in the order the writes landed no token is older than one before it — the
// upsert's row lock orders them.
func TestAdvanceConcurrently(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	ctx := context.Background()
	const writers = 48
	tokens := make([]int64, writers)
	for i := range tokens {
		tokens[i] = int64(i/2 + 1) // each token twice: equal tokens both pass or not by order
	}
	rand.Shuffle(len(tokens), func(i, j int) { tokens[i], tokens[j] = tokens[j], tokens[i] })
	admitted := make([]bool, writers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, tok := range tokens {
		wg.Go(func() {
			<-start
			err := write(ctx, pool, "ledger:a", tok)
			switch {
			case err == nil:
				admitted[i] = true
			case errors.Is(err, fencepg.ErrStale):
				var stale *fencepg.StaleError
				if !errors.As(err, &stale) || stale.Mark <= tok {
					t.Errorf("token %d refused: %v, want a mark above it", tok, err)
				}
			default:
				t.Errorf("token %d: %v", tok, err)
			}
		})
	}
	close(start)
	wg.Wait()
	if m := mark(t, pool, "ledger:a"); m != writers/2 {
		t.Errorf("mark %d, want the greatest token %d", m, writers/2)
	}
	rows, err := pool.Query(ctx, `SELECT token FROM entry ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var landed []int64
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			t.Fatal(err)
		}
		landed = append(landed, tok)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ok := range admitted {
		if ok {
			n++
		}
	}
	if len(landed) != n {
		t.Errorf("%d writes landed, %d were admitted", len(landed), n)
	}
	for i := 1; i < len(landed); i++ {
		if landed[i] < landed[i-1] {
			t.Errorf("token %d landed after token %d: %v", landed[i], landed[i-1], landed)
			break
		}
	}
}
