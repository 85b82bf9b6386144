package lockserver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/dbconn"
)

// store is lock-server's only door to lockdb, and the only file that knows pgx.
// It speaks the domain of lock.go: every call ends in a value, ErrHeld,
// ErrLeaseLost, ErrNotFound, ErrUnavailable, or an internal error.
//
// Ownership is decided inside the statements, by lockdb's clock_timestamp(): the
// moment a statement runs, after any wait for a row lock. Nothing here reads a
// local clock. Every state change is a conditional write whose row count is
// checked; a transaction is begun, committed and rolled back by the one method
// that needs it.
type store struct {
	pool    *pgxpool.Pool
	timeout time.Duration // bound on each call, waiting for a connection included
}

// dbTimeout bounds every lockdb call (docs/contracts/configuration.md: a request
// waiting longer than 2 s for a connection answers 503), and rollbackTimeout the
// rollback that may follow it.
const (
	dbTimeout       = 2 * time.Second
	rollbackTimeout = time.Second
)

// sqlGrant is the pinned grant of docs/contracts/database.md, verbatim. The token
// moves in the same row update that grants the lease, so no later grant can carry a
// smaller number; the WHERE is judged by clock_timestamp() after the row-lock wait.
const sqlGrant = `
INSERT INTO lock_lease AS l (lock_name, owner_id, token, acquired_at, expires_at)
VALUES ($1, $2, 1, clock_timestamp(), clock_timestamp() + $3 * interval '1 millisecond')
ON CONFLICT (lock_name) DO UPDATE
   SET owner_id = EXCLUDED.owner_id, token = l.token + 1,
       acquired_at = clock_timestamp(),
       expires_at = clock_timestamp() + $3 * interval '1 millisecond'
 WHERE l.owner_id IS NULL OR l.expires_at <= clock_timestamp()
RETURNING token, acquired_at, expires_at`

const sqlGrantHistory = `
INSERT INTO lock_grant (lock_name, token, owner_id, acquired_at, ttl_ms, expires_at)
VALUES ($1, $2, $3, $4, $5, $6)`

// sqlHolder reads the holder that refused a grant. The refused ON CONFLICT DO
// UPDATE still locked the row, so within the same transaction this is exactly
// the row the WHERE was judged on.
const sqlHolder = `SELECT owner_id, expires_at FROM lock_lease WHERE lock_name = $1`

// sqlHeld reads the holder of a lock that is held right now by lockdb's clock.
const sqlHeld = `
SELECT owner_id, expires_at FROM lock_lease
 WHERE lock_name = $1 AND owner_id IS NOT NULL AND expires_at > clock_timestamp()`

// grant acquires name for owner for ttlMs milliseconds, or reports who holds it.
func (s *store) grant(ctx context.Context, name, owner string, ttlMs int64) (Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()

	// A lock that is held is refused from a plain read, which takes no row lock:
	// callers polling a held lock never queue in front of its holder's renewals
	// and release. The read can only refuse — truthfully, as of its statement's
	// moment; granting is decided by the pinned statement alone.
	var held HeldError
	err := s.pool.QueryRow(ctx, sqlHeld, name).Scan(&held.Holder, &held.ExpiresAt)
	if err == nil {
		return Lease{}, &held
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, classify("read holder", err)
	}

	// dbconn.Begin: the COMMIT waits for lockdb's synchronous standby, and one
	// whose wait was cancelled is an error, never a grant. A token handed out from
	// a commit the standby may not have could be issued again after a failover.
	tx, err := dbconn.Begin(ctx, s.pool)
	if err != nil {
		return Lease{}, classify("begin grant", err)
	}
	defer rollback(ctx, tx)

	l := Lease{Name: name, Owner: owner}
	err = tx.QueryRow(ctx, sqlGrant, name, owner, ttlMs).Scan(&l.Token, &l.AcquiredAt, &l.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		var holder *string
		var expires time.Time
		if err := tx.QueryRow(ctx, sqlHolder, name).Scan(&holder, &expires); err != nil {
			return Lease{}, classify("read holder", err)
		}
		if holder == nil { // the refused row cannot be free: the lock says otherwise
			return Lease{}, fmt.Errorf("grant of %q refused although the lock is free", name)
		}
		return Lease{}, &HeldError{Holder: *holder, ExpiresAt: expires}
	}
	if err != nil {
		return Lease{}, classify("grant", err)
	}
	tag, err := tx.Exec(ctx, sqlGrantHistory, name, l.Token, owner, l.AcquiredAt, ttlMs, l.ExpiresAt)
	if err != nil {
		return Lease{}, classify("record grant", err)
	}
	if tag.RowsAffected() != 1 {
		return Lease{}, fmt.Errorf("record grant: %d rows inserted", tag.RowsAffected())
	}
	if err := tx.Commit(ctx); err != nil {
		return Lease{}, classify("commit grant", err)
	}
	return l, nil
}

// sqlRenew extends the current, unexpired grant of this owner and token, and no
// other: a renewal can never revive an expired lease or touch a newer grant.
const sqlRenew = `
UPDATE lock_lease
   SET expires_at = clock_timestamp() + $4 * interval '1 millisecond'
 WHERE lock_name = $1 AND owner_id = $2 AND token = $3
   AND expires_at > clock_timestamp()
RETURNING acquired_at, expires_at`

const sqlRenewHistory = `UPDATE lock_grant SET expires_at = $3 WHERE lock_name = $1 AND token = $2`

const sqlExists = `SELECT EXISTS (SELECT 1 FROM lock_lease WHERE lock_name = $1)`

// renew moves the expiry of the grant (name, token) held by owner to ttlMs from now.
func (s *store) renew(ctx context.Context, name, owner string, token, ttlMs int64) (Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tx, err := dbconn.Begin(ctx, s.pool)
	if err != nil {
		return Lease{}, classify("begin renew", err)
	}
	defer rollback(ctx, tx)

	l := Lease{Name: name, Owner: owner, Token: token}
	err = tx.QueryRow(ctx, sqlRenew, name, owner, token, ttlMs).Scan(&l.AcquiredAt, &l.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		var exists bool
		if err := tx.QueryRow(ctx, sqlExists, name).Scan(&exists); err != nil {
			return Lease{}, classify("renew lookup", err)
		}
		if !exists {
			return Lease{}, ErrNotFound
		}
		return Lease{}, ErrLeaseLost
	}
	if err != nil {
		return Lease{}, classify("renew", err)
	}
	tag, err := tx.Exec(ctx, sqlRenewHistory, name, token, l.ExpiresAt)
	if err != nil {
		return Lease{}, classify("record renewal", err)
	}
	if tag.RowsAffected() != 1 {
		return Lease{}, fmt.Errorf("record renewal of %q token %d: %d grant rows", name, token, tag.RowsAffected())
	}
	if err := tx.Commit(ctx); err != nil {
		return Lease{}, classify("commit renew", err)
	}
	return l, nil
}

// sqlRelease frees the lock if (owner, token) is still its grant, expired or not:
// an expired grant no newer grant replaced is still the lock's last word. The
// lease row's expiry becomes the moment the lease ended.
const sqlRelease = `
UPDATE lock_lease
   SET owner_id = NULL, expires_at = LEAST(expires_at, clock_timestamp())
 WHERE lock_name = $1 AND owner_id = $2 AND token = $3`

const sqlReleaseHistory = `
UPDATE lock_grant SET released_at = clock_timestamp()
 WHERE lock_name = $1 AND token = $2 AND released_at IS NULL`

// sqlReleaseLookup explains a release that freed nothing: no such lock, a grant
// that was already released, or one that is not the caller's to release.
const sqlReleaseLookup = `
SELECT g.owner_id, g.released_at IS NOT NULL
  FROM lock_lease l
  LEFT JOIN lock_grant g ON g.lock_name = l.lock_name AND g.token = $2
 WHERE l.lock_name = $1`

// release ends the grant (name, token) of owner. It reports whether this call
// ended it (false: it had been released before, which is also success).
func (s *store) release(ctx context.Context, name, owner string, token int64) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tx, err := dbconn.Begin(ctx, s.pool)
	if err != nil {
		return false, classify("begin release", err)
	}
	defer rollback(ctx, tx)

	tag, err := tx.Exec(ctx, sqlRelease, name, owner, token)
	if err != nil {
		return false, classify("release", err)
	}
	if tag.RowsAffected() == 0 {
		var grantOwner *string
		var released *bool
		err := tx.QueryRow(ctx, sqlReleaseLookup, name, token).Scan(&grantOwner, &released)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return false, ErrNotFound
		case err != nil:
			return false, classify("release lookup", err)
		case grantOwner != nil && *grantOwner == owner && released != nil && *released:
			// The same grant, released before: releasing is idempotent, so a caller
			// that lost the first answer can ask again.
			return false, nil
		default:
			return false, ErrLeaseLost
		}
	}
	tag, err = tx.Exec(ctx, sqlReleaseHistory, name, token)
	if err != nil {
		return false, classify("record release", err)
	}
	if tag.RowsAffected() != 1 {
		return false, fmt.Errorf("record release of %q token %d: %d grant rows", name, token, tag.RowsAffected())
	}
	if err := tx.Commit(ctx); err != nil {
		return false, classify("commit release", err)
	}
	return true, nil
}

const sqlLock = `
SELECT owner_id, token, expires_at,
       owner_id IS NOT NULL AND expires_at > clock_timestamp(), acquired_at
  FROM lock_lease WHERE lock_name = $1`

// lock reads a lock's state, held or not by lockdb's clock.
func (s *store) lock(ctx context.Context, name string) (LockState, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	st := LockState{Name: name}
	var owner *string
	var expires, acquired *time.Time
	err := s.pool.QueryRow(ctx, sqlLock, name).Scan(&owner, &st.Token, &expires, &st.Held, &acquired)
	if errors.Is(err, pgx.ErrNoRows) {
		return LockState{}, ErrNotFound
	}
	if err != nil {
		return LockState{}, classify("read lock", err)
	}
	if st.Held && owner != nil {
		st.Owner = *owner
	}
	if expires != nil {
		st.ExpiresAt = *expires
	}
	if acquired != nil {
		st.AcquiredAt = *acquired
	}
	return st, nil
}

const sqlGrants = `
SELECT token, owner_id, acquired_at, ttl_ms, released_at
  FROM lock_grant WHERE lock_name = $1
 ORDER BY token DESC LIMIT $2`

// grants reads the newest limit grants of name, newest first.
func (s *store) grants(ctx context.Context, name string, limit int) ([]Grant, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, sqlGrants, name, limit)
	if err != nil {
		return nil, classify("read grants", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Grant, error) {
		var g Grant
		var ttl int32
		err := r.Scan(&g.Token, &g.Owner, &g.AcquiredAt, &ttl, &g.ReleasedAt)
		g.TTLMs = int64(ttl)
		return g, err
	})
	if err != nil {
		return nil, classify("read grants", err)
	}
	if len(out) == 0 { // every granted lock has at least one grant row
		return nil, ErrNotFound
	}
	return out, nil
}

// rollback ends tx if it is still open. It runs even when ctx is already
// cancelled, under its own short bound, so a cancelled request never leaves a
// transaction holding a lease row locked. After Commit it does nothing.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(rctx)
}

// classify turns a pgx failure into the domain: a database that cannot be
// reached, is shutting down, is out of resources, or did not answer in time is
// ErrUnavailable (503); any other error the server reported is internal (500).
// Failures that are not the server's answer (refused or broken connections,
// timeouts, the pool's wait) all mean lockdb was not reached in time; so does a
// commit the synchronous standby did not confirm (dbconn.ErrCommitNotDurable):
// it is not durable, so it did not happen.
func classify(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 {
		switch pgErr.Code[:2] {
		case "08", // connection exception
			"53", // insufficient resources, e.g. too many connections
			"57", // operator intervention: shutdown, statement timeout, cancel
			"40": // transaction rollback: serialization failure, deadlock
		default:
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
}
