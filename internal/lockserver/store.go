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
//
// It also records the acquirer's SPIFFE ID (holder_identity, $4; NULL without
// identities), the one workload that may renew or release the lease
// (docs/contracts/workload-identity.md).
const sqlGrant = `
INSERT INTO lock_lease AS l (lock_name, owner_id, token, acquired_at, expires_at, holder_identity)
VALUES ($1, $2, 1, clock_timestamp(), clock_timestamp() + $3 * interval '1 millisecond', $4)
ON CONFLICT (lock_name) DO UPDATE
   SET owner_id = EXCLUDED.owner_id, token = l.token + 1,
       acquired_at = clock_timestamp(),
       expires_at = clock_timestamp() + $3 * interval '1 millisecond',
       holder_identity = EXCLUDED.holder_identity
 WHERE l.owner_id IS NULL OR l.expires_at <= clock_timestamp()
RETURNING token, acquired_at, expires_at`

const sqlGrantHistory = `
INSERT INTO lock_grant (lock_name, token, owner_id, acquired_at, ttl_ms, expires_at, holder_identity)
VALUES ($1, $2, $3, $4, $5, $6, $7)`

// sqlHolder reads the holder that refused a grant. The refused ON CONFLICT DO
// UPDATE still locked the row, so within the same transaction this is exactly
// the row the WHERE was judged on.
const sqlHolder = `SELECT owner_id, expires_at FROM lock_lease WHERE lock_name = $1`

// sqlHeld reads the holder of a lock that is held right now by lockdb's clock.
const sqlHeld = `
SELECT owner_id, expires_at FROM lock_lease
 WHERE lock_name = $1 AND owner_id IS NOT NULL AND expires_at > clock_timestamp()`

// grant acquires name for owner, a worker of the workload caller (its SPIFFE
// ID; "" without identities), for ttlMs milliseconds, or reports who holds it.
func (s *store) grant(ctx context.Context, name, owner, caller string, ttlMs int64) (Lease, error) {
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

	l := Lease{Name: name, Owner: owner, Holder: caller}
	err = tx.QueryRow(ctx, sqlGrant, name, owner, ttlMs, nullable(caller)).Scan(&l.Token, &l.AcquiredAt, &l.ExpiresAt)
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
	tag, err := tx.Exec(ctx, sqlGrantHistory, name, l.Token, owner, l.AcquiredAt, ttlMs, l.ExpiresAt, nullable(caller))
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
// With identities ($5 set) it extends only a lease the calling workload acquired
// (or one acquired without identities, holder_identity NULL).
const sqlRenew = `
UPDATE lock_lease
   SET expires_at = clock_timestamp() + $4 * interval '1 millisecond'
 WHERE lock_name = $1 AND owner_id = $2 AND token = $3
   AND expires_at > clock_timestamp()
   AND ($5::text IS NULL OR holder_identity IS NULL OR holder_identity = $5)
RETURNING acquired_at, expires_at, holder_identity`

const sqlRenewHistory = `UPDATE lock_grant SET expires_at = $3 WHERE lock_name = $1 AND token = $2`

// sqlRefusal explains a renew or release that changed nothing: no row, the lock
// was never granted (NOT_FOUND); else the grant of the presented token — its
// acquiring workload, its owner and whether it was released (both NULL when
// no grant has that token). A grant's row never changes those once written, so
// the answer is the one the refused write was judged on.
const sqlRefusal = `
SELECT g.holder_identity, g.owner_id, g.released_at IS NOT NULL
  FROM lock_lease l
  LEFT JOIN lock_grant g ON g.lock_name = l.lock_name AND g.token = $2
 WHERE l.lock_name = $1`

// refusal is a grant's row as sqlRefusal reads it.
type refusal struct {
	holder   *string
	owner    *string
	released *bool
}

// refused reads why a renew or release of (name, token) changed nothing.
// NOT_FOUND first (there is no lease to hold), then NOT_LEASE_HOLDER: a caller
// with an identity presenting a token another workload acquired learns only
// that, whether or not that lease still stands — the token was never its to
// present (docs/contracts/lock-service.md). Otherwise the caller decides with
// the row (LEASE_LOST, or release's idempotent repeat).
func refused(ctx context.Context, tx pgx.Tx, name string, token int64, caller string) (refusal, error) {
	var r refusal
	err := tx.QueryRow(ctx, sqlRefusal, name, token).Scan(&r.holder, &r.owner, &r.released)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return r, ErrNotFound
	case err != nil:
		return r, classify("lookup", err)
	case caller != "" && r.holder != nil && *r.holder != caller:
		return r, ErrNotLeaseHolder
	}
	return r, nil
}

// renew moves the expiry of the grant (name, token) held by owner, acquired by
// the workload caller ("" without identities), to ttlMs from now.
func (s *store) renew(ctx context.Context, name, owner, caller string, token, ttlMs int64) (Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tx, err := dbconn.Begin(ctx, s.pool)
	if err != nil {
		return Lease{}, classify("begin renew", err)
	}
	defer rollback(ctx, tx)

	l := Lease{Name: name, Owner: owner, Token: token}
	var holder *string
	err = tx.QueryRow(ctx, sqlRenew, name, owner, token, ttlMs, nullable(caller)).Scan(&l.AcquiredAt, &l.ExpiresAt, &holder)
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err := refused(ctx, tx, name, token, caller); err != nil {
			return Lease{}, err
		}
		return Lease{}, ErrLeaseLost
	}
	if err != nil {
		return Lease{}, classify("renew", err)
	}
	if holder != nil {
		// The grant answered is the acquire's, byte for byte: its wid is the
		// acquirer's, also when the lease predates identities (none).
		l.Holder = *holder
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
// lease row's expiry becomes the moment the lease ended. With identities ($4
// set) only the workload that acquired it (or anyone, for a lease acquired
// without identities) releases it.
const sqlRelease = `
UPDATE lock_lease
   SET owner_id = NULL, holder_identity = NULL, expires_at = LEAST(expires_at, clock_timestamp())
 WHERE lock_name = $1 AND owner_id = $2 AND token = $3
   AND ($4::text IS NULL OR holder_identity IS NULL OR holder_identity = $4)`

const sqlReleaseHistory = `
UPDATE lock_grant SET released_at = clock_timestamp()
 WHERE lock_name = $1 AND token = $2 AND released_at IS NULL`

// release ends the grant (name, token) of owner, acquired by the workload
// caller ("" without identities). It reports whether this call ended it
// (false: it had been released before, which is also success).
func (s *store) release(ctx context.Context, name, owner, caller string, token int64) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tx, err := dbconn.Begin(ctx, s.pool)
	if err != nil {
		return false, classify("begin release", err)
	}
	defer rollback(ctx, tx)

	tag, err := tx.Exec(ctx, sqlRelease, name, owner, token, nullable(caller))
	if err != nil {
		return false, classify("release", err)
	}
	if tag.RowsAffected() == 0 {
		r, err := refused(ctx, tx, name, token, caller)
		switch {
		case err != nil:
			return false, err
		case r.owner != nil && *r.owner == owner && r.released != nil && *r.released:
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
       owner_id IS NOT NULL AND expires_at > clock_timestamp()
  FROM lock_lease WHERE lock_name = $1`

// lock reads a lock's state, held or not by lockdb's clock.
func (s *store) lock(ctx context.Context, name string) (LockState, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	st := LockState{Name: name}
	var owner *string
	var expires *time.Time
	err := s.pool.QueryRow(ctx, sqlLock, name).Scan(&owner, &st.Token, &expires, &st.Held)
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
	return st, nil
}

const sqlGrants = `
SELECT token, owner_id, acquired_at, ttl_ms, released_at, holder_identity
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
		err := r.Scan(&g.Token, &g.Owner, &g.AcquiredAt, &ttl, &g.ReleasedAt, &g.Holder)
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

// nullable is s as a nullable text parameter: NULL for "" (no identity).
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
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
