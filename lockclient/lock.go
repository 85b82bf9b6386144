package lockclient

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Lock's default backoff between attempts.
const (
	DefaultLockBackoff    = 50 * time.Millisecond
	DefaultLockMaxBackoff = 2 * time.Second
)

// LockOption configures one Lock call.
type LockOption func(*lockWait)

type lockWait struct {
	initial, max time.Duration
	set          bool
}

// WithBackoff sets Lock's wait between attempts: about initial after the first,
// doubling after each attempt up to ceiling (0 < initial ≤ ceiling, else Lock fails
// without trying). Each wait is jittered — somewhere between half of it and all
// of it — so workers that found the lock held together do not come back
// together. The default is DefaultLockBackoff up to DefaultLockMaxBackoff, and
// never more than half the TTL: with short leases the lock changes hands often,
// and a waiter polling more slowly than that would miss the moments it is free.
func WithBackoff(initial, ceiling time.Duration) LockOption {
	return func(w *lockWait) { w.initial, w.max, w.set = initial, ceiling, true }
}

// Lock acquires name for ownerID with ttl, waiting as long as ctx allows: what
// etcd's concurrency.Mutex.Lock is to etcd. It is Acquire tried again after
// each answer that a later attempt may change — the lock is held (ErrHeld), or
// lock-server could not be reached or failed (ErrUnavailable, a 5xx, 429, 408)
// — with a jittered, exponentially growing wait between attempts (WithBackoff).
// Any other failure is returned at once, since asking again gets the same
// answer: the workload lacks the role (ErrForbidden), the name, owner or TTL is
// malformed or out of the server's bounds (INVALID_REQUEST), the answer is no
// grant. A failed TLS handshake is no answer, so it is tried again (certificates
// rotate), and logged each time at WARN (event lock_attempt_failed) with the
// client's logger.
//
// When ctx ends first, Lock returns an error wrapping ctx's error (errors.Is
// matches context.Canceled or context.DeadlineExceeded) that also says what the
// last attempt was answered. It never leaves a grant behind: an acquire in
// flight when ctx ends is not abandoned but answered (the client's request
// timeout bounds it), and a lease granted meanwhile is released before Lock
// returns. So Lock may return up to one request timeout after ctx ends.
//
// An attempt that got no answer may have been granted without anyone learning
// its token; the next attempts are then answered LOCK_HELD, with this owner as
// the holder, until that grant's TTL ends. Lock waits it out like any other.
func (c *Client) Lock(ctx context.Context, name, ownerID string, ttl time.Duration, opts ...LockOption) (*Lease, error) {
	w := lockWait{initial: DefaultLockBackoff, max: min(DefaultLockMaxBackoff, ttl/2)}
	for _, o := range opts {
		o(&w)
	}
	if w.set && (w.initial <= 0 || w.max < w.initial) {
		return nil, fmt.Errorf("lockclient: lock %s: backoff from %v up to %v: want 0 < initial ≤ max", name, w.initial, w.max)
	}
	w.max = max(w.max, w.initial) // a TTL so short that half of it is below the first wait

	wait := w.initial
	var last error
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			return nil, abandoned(ctx, name, attempt, last)
		}
		// The attempt does not end with ctx: a grant committed as ctx ended
		// would otherwise be one nobody learns the token of, holding the lock
		// for its whole TTL. Answered, it is released below.
		l, err := c.Acquire(context.WithoutCancel(ctx), name, ownerID, ttl)
		if err == nil {
			if ctx.Err() == nil {
				return l, nil
			}
			return nil, c.giveBack(ctx, l, abandoned(ctx, name, attempt+1, nil))
		}
		if !retryable(err) {
			return nil, err
		}
		last = err
		if errors.Is(err, ErrHeld) {
			c.logger.Debug("lock held; waiting", "lockName", name, "ownerId", ownerID, "attempt", attempt+1)
		} else {
			c.logger.Warn("acquire failed; trying again", "event", "lock_attempt_failed", "lockName", name,
				"ownerId", ownerID, "attempt", attempt+1, "error", err.Error())
		}
		t := time.NewTimer(jitter(wait))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, abandoned(ctx, name, attempt+1, last)
		case <-t.C:
		}
		wait = min(2*wait, w.max)
	}
}

// retryable: an answer a later attempt may change.
func retryable(err error) bool { return errors.Is(err, ErrHeld) || transient(err) }

// jitter is a random duration in [d/2, d].
func jitter(d time.Duration) time.Duration {
	half := d / 2
	return half + rand.N(d-half+1)
}

// abandoned is Lock's error when ctx ended first.
func abandoned(ctx context.Context, name string, attempts int, last error) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		err = fmt.Errorf("%w (%w)", err, cause)
	}
	if last == nil {
		return fmt.Errorf("lockclient: lock %s not acquired after %d attempts: %w", name, attempts, err)
	}
	return fmt.Errorf("lockclient: lock %s not acquired after %d attempts, the last answered %v: %w", name, attempts, last, err)
}

// giveBack releases a lease granted after its caller stopped waiting, and
// returns why it was not handed out.
func (c *Client) giveBack(ctx context.Context, l *Lease, why error) error {
	if err := l.Release(context.WithoutCancel(ctx)); err != nil {
		c.logger.Warn("a lease granted after the wait ended could not be released; it ends with its TTL",
			"event", "release_failed", "lockName", l.Name(), "token", l.Token(), "error", err.Error())
		return fmt.Errorf("%w; the lease granted meanwhile (token %d) could not be released and ends with its TTL: %v", why, l.Token(), err)
	}
	return why
}
