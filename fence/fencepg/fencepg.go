// Package fencepg is the fencing-token comparison for a team's own PostgreSQL
// rows: a high-water mark per resource, advanced or refused in one statement
// inside the transaction that writes, so a stale lease holder's write never
// lands after a newer holder's (docs/adopting.md).
//
// lock.dev/fence proves a token is one lock-server granted; only the resource
// can tell whether it is stale. A lease holder paused past its expiry wakes up
// still believing it holds the lock, while a newer holder, with a greater token,
// has written since. The resource keeps, per resource it fences, the greatest
// token it has let write, and refuses any older one. Three rules make that
// sound, and Advance keeps them:
//
//   - the mark is read, compared and moved in one statement (a conditional
//     upsert), never a SELECT followed by an UPDATE that two writers could
//     interleave;
//   - in the caller's transaction, before the write it guards: the upsert locks
//     the mark's row until that transaction ends, so a newer holder's write waits
//     for, or is ordered after, this one, and a write rolled back takes its
//     advance with it;
//   - on the primary, in the database that holds the rows: a mark in memory is
//     lost on restart, one per replica lets a stale token through the replica
//     that has not seen the newer one, one on a read replica lags.
//
// An equal token is admitted, so one holder may write many times under one
// lease; an older one is refused with a *StaleError (errors.Is(err, ErrStale)).
// Run it at READ COMMITTED, PostgreSQL's default: under REPEATABLE READ or
// SERIALIZABLE a concurrent advance surfaces as a serialization failure
// (SQLSTATE 40001) for the caller to retry.
package fencepg

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Schema is the DDL of the mark table, for a team's migration. resource is
// whatever the team fences on — usually the lock name the grant is of, such as
// ledger:acct-7 — and token the greatest fencing token admitted for it.
const Schema = `CREATE TABLE IF NOT EXISTS fence_mark (
	resource   text        PRIMARY KEY,
	token      bigint      NOT NULL CHECK (token > 0),
	updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
)`

// ErrStale is matched (errors.Is) by the error Advance returns for a token older
// than the resource's mark.
var ErrStale = errors.New("stale fencing token")

// StaleError is a token refused because the resource has already admitted a
// greater one: its holder's lease is over, whatever the holder believes.
type StaleError struct {
	Resource  string
	Presented int64 // the token refused
	Mark      int64 // the greatest token admitted for Resource
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("%s: token %d of %s is older than the mark %d", ErrStale, e.Presented, e.Resource, e.Mark)
}

// Unwrap makes errors.Is(err, ErrStale) hold.
func (e *StaleError) Unwrap() error { return ErrStale }

// advanceSQL moves resource's mark to the presented token when that is at least
// the mark, creating the mark at the first token. When the token is older the
// WHERE is false: no row is returned and nothing changes, but PostgreSQL locks
// the conflicting row all the same, so the mark read next in the same
// transaction is the one that refused it.
const advanceSQL = `
INSERT INTO fence_mark AS mark (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = clock_timestamp()
  WHERE mark.token <= EXCLUDED.token
RETURNING mark.token`

// markSQL reads the mark that refused a token (its row is locked by advanceSQL).
const markSQL = `SELECT token FROM fence_mark WHERE resource = $1`

// Advance admits token for resource inside tx, or refuses it. It returns nil
// when token is at least the resource's mark — the mark is then token, and stays
// locked until tx ends, so the caller's write in tx is ordered after every
// write admitted before it. It returns a *StaleError (ErrStale) when the
// resource has admitted a greater token: the caller writes nothing and rolls tx
// back (tx itself is still usable). Any other error is the database's, wrapped.
//
// Call it first in the transaction that writes, with the token the verified
// grant carries (fence.Claims.Token), and commit only after the write.
func Advance(ctx context.Context, tx pgx.Tx, resource string, token int64) error {
	if resource == "" {
		return errors.New("fencepg: advance: empty resource")
	}
	if token <= 0 {
		return fmt.Errorf("fencepg: advance %s: a fencing token is positive, got %d", resource, token)
	}
	var admitted int64
	err := tx.QueryRow(ctx, advanceSQL, resource, token).Scan(&admitted)
	if err == nil {
		return nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("fencepg: advance %s: %w", resource, err)
	}
	var mark int64
	if err := tx.QueryRow(ctx, markSQL, resource).Scan(&mark); err != nil {
		return fmt.Errorf("fencepg: read the mark of %s: %w", resource, err)
	}
	return &StaleError{Resource: resource, Presented: token, Mark: mark}
}

// Querier is what Mark reads with: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Mark is the greatest token admitted for resource, and false when none has
// been: for a resource's own reads and reports. Never compare it with a token
// and write afterwards — that is the race Advance exists to close.
func Mark(ctx context.Context, q Querier, resource string) (int64, bool, error) {
	var mark int64
	err := q.QueryRow(ctx, markSQL, resource).Scan(&mark)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("fencepg: read the mark of %s: %w", resource, err)
	}
	return mark, true, nil
}
