package lockclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"lock.dev/internal/leasepause"
	"lock.dev/lockapi"
)

// Lease is a granted lock that renews itself every ttl/3 until it is released or
// lost. Its Context is cancelled the moment the client can no longer vouch for it:
//
//   - a renewal is answered LEASE_LOST (or NOT_FOUND, or refused as invalid):
//     Err() matches ErrLeaseLost;
//   - the local safe deadline passes without a successful renewal — renewals that
//     fail (no answer, 5xx) are tried again at the next tick only while the
//     deadline holds: Err() is ErrExpired, which matches context.DeadlineExceeded;
//   - Release: Err() is ErrReleased.
//
// The local safe deadline is sent + ttl − margin, where sent is the moment before
// the acquire or the last successful renewal was sent and margin is the client's
// drift margin times ttl. lockdb's expiry is at least sent + ttl (the server's
// clock reads the statement's time, after the request arrived), so the context is
// cancelled before the server-side expiry, never after — except for a lease
// frozen by this module's tests and demonstrations (WithPauser), which is what
// freezing is for.
type Lease struct {
	c        *Client
	name     string
	owner    string
	token    int64
	ttl      time.Duration
	ttlMs    int64
	safe     time.Duration // ttl − margin: how long after sending a lease is trusted
	interval time.Duration // ttl/3

	ctx    context.Context
	cancel context.CancelCauseFunc
	wake   chan struct{} // thaw: renew at once
	done   chan struct{} // closed when the renewal loop has stopped

	mu        sync.Mutex
	ended     bool
	deadline  time.Time     // local safe deadline (monotonic), while not frozen
	timer     *time.Timer   // fires at deadline
	gen       uint64        // identifies the armed timer; a stale timer's firing is ignored
	frozen    bool          // freeze was called and thaw not yet
	remaining time.Duration // while frozen: what was left of the deadline
	epoch     uint64        // bumped by freeze: a renewal sent before it is void
	inflight  context.CancelFunc
	expiresAt time.Time // lockdb's expiry as last reported
	grant     string    // lock-server's signed grant of the token, as last answered
	detach    func()    // from the client's pauser, called when the lease ends
}

func newLease(parent context.Context, c *Client, name, owner string, dto lockapi.Lease, ttl time.Duration, sent time.Time) *Lease {
	// The lease outlives the call that acquired it; it keeps only its values.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	l := &Lease{
		c:         c,
		name:      name,
		owner:     owner,
		token:     dto.Token,
		ttl:       ttl,
		ttlMs:     ttl.Milliseconds(),
		safe:      ttl - time.Duration(float64(ttl)*c.drift),
		interval:  ttl / 3,
		ctx:       ctx,
		cancel:    cancel,
		wake:      make(chan struct{}, 1),
		done:      make(chan struct{}),
		expiresAt: dto.ExpiresAt,
		grant:     dto.Grant,
	}
	if l.interval <= 0 {
		l.interval = time.Millisecond
	}
	l.mu.Lock()
	l.armLocked(sent.Add(l.safe))
	l.mu.Unlock()
	if c.pauser != nil {
		// Before the renewal loop starts and before the caller sees the lease,
		// so the lease can be frozen from its first moment. Under the lock: the
		// deadline timer is armed, and when the acquire took longer than the
		// lease's safe time (a slow answer across a database failover) it fires
		// at once and ends the lease, which detaches it.
		detach := c.pauser.Attach(l, leasepause.Hooks{Freeze: l.freeze, Thaw: l.thaw})
		l.mu.Lock()
		if l.ended {
			detach()
		} else {
			l.detach = detach
		}
		l.mu.Unlock()
	}
	go l.run()
	return l
}

// Token is the fencing token of this grant: present it with every write.
func (l *Lease) Token() int64 { return l.token }

// Grant is lock-server's signed grant of this lease's token
// (docs/contracts/signed-grants.md): present it with the token (X-Fencing-Grant) so
// a fence point can tell the token was granted, to this owner, for this lock. ""
// when lock-server signs nothing. A renewal answers the same grant; should
// lock-server's key have been rotated meanwhile, it answers the grant signed with
// the new key, and Grant returns that.
func (l *Lease) Grant() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.grant
}

// Name is the lock's name.
func (l *Lease) Name() string { return l.name }

// Owner is the owner id the lease was acquired for.
func (l *Lease) Owner() string { return l.owner }

// TTL is the lease's time to live, renewed every TTL/3.
func (l *Lease) TTL() time.Duration { return l.ttl }

// ExpiresAt is lockdb's expiry of the lease as last reported by the server
// (lockdb's clock; for display, never for deciding anything).
func (l *Lease) ExpiresAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expiresAt
}

// Context is cancelled when the lease is lost, its local deadline passes, or it
// is released; Err says which.
func (l *Lease) Context() context.Context { return l.ctx }

// Err is nil while the lease is believed held, then why it is not: an error
// matching ErrLeaseLost, ErrExpired, or ErrReleased.
func (l *Lease) Err() error {
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Release stops renewal, cancels the context, and asks the server to release the
// grant. It returns nil when the server released it (also when it had been
// released before, so Release may be repeated after a failure), an error
// matching ErrLeaseLost when a newer grant exists, or the call's failure.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	l.endLocked(ErrReleased)
	l.mu.Unlock()
	<-l.done
	return l.c.leaseCall(ctx, "release", l.name, l.owner, l.token, 0, nil)
}

// freeze and thaw are reached only through the client's pauser (WithPauser),
// for this module's tests and demonstrations (docs/contracts/lock-service.md):
// they make a real stale holder, a process stopped between its last lease check
// and its next write.
//
// freeze stops the lease as a stop-the-world pause would: no renewal is sent, a
// renewal in flight is abandoned (its answer is ignored, though the server may
// have applied it), and the local deadline stops running — the context is not
// cancelled while frozen, however long the freeze lasts, even past lockdb's
// expiry.
//
// thaw resumes it: the deadline timer runs again with exactly the time that was
// left on it at freeze (the pause is not counted, as the paused process did not
// see it pass), and a renewal is sent at once instead of waiting for the next
// tick. That renewal settles what the remaining time merely assumes: if lockdb's
// expiry passed during the freeze, it is answered LEASE_LOST and the context is
// cancelled with ErrLeaseLost; if it succeeds, a fresh deadline replaces the
// remainder. If it gets no answer, the remainder is all the lease has left. A
// deadline that had already run out at freeze cancels the context at thaw.
//
// Both do nothing on a lease that has ended; freeze on a frozen lease and thaw on
// a lease that is not frozen do nothing.
func (l *Lease) freeze() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended || l.frozen {
		return
	}
	l.frozen = true
	l.epoch++
	l.remaining = time.Until(l.deadline)
	l.disarmLocked()
	if l.inflight != nil {
		l.inflight()
	}
}

// thaw resumes a frozen lease; see freeze.
func (l *Lease) thaw() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended || !l.frozen {
		return
	}
	l.frozen = false
	if l.remaining <= 0 {
		l.expireLocked()
		return
	}
	l.armLocked(time.Now().Add(l.remaining))
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run renews every interval, and at once after a thaw, until the lease ends.
func (l *Lease) run() {
	defer close(l.done)
	t := time.NewTimer(l.interval)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		case <-l.wake:
		}
		l.renewOnce()
		t.Reset(l.interval)
	}
}

// renewOnce sends one renewal unless the lease is frozen or over, and applies
// the answer unless the lease froze or ended meanwhile.
func (l *Lease) renewOnce() {
	l.mu.Lock()
	if l.ended || l.frozen {
		l.mu.Unlock()
		return
	}
	epoch := l.epoch
	// Derived from the lease's context: a lease that ends (its deadline included)
	// abandons the renewal it is waiting for.
	rctx, cancel := context.WithCancel(l.ctx)
	l.inflight = cancel
	l.mu.Unlock()

	sent := time.Now() // before the request, as for the acquire
	var dto lockapi.Lease
	err := l.c.leaseCall(rctx, "renew", l.name, l.owner, l.token, l.ttlMs, &dto)
	cancel()

	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight = nil
	if l.ended || l.frozen || epoch != l.epoch {
		return // sent before a freeze, or the lease is over: its answer is void
	}
	log := l.c.logger.With("lockName", l.name, "ownerId", l.owner, "token", l.token)
	switch {
	case err == nil:
		l.expiresAt = dto.ExpiresAt
		if dto.Grant != "" {
			l.grant = dto.Grant
		}
		l.armLocked(sent.Add(l.safe))
	case errors.Is(err, ErrLeaseLost):
		log.Warn("lease lost", "event", "lease_lost", "error", err.Error())
		l.endLocked(err)
	case transient(err):
		// Tried again at the next tick, while the deadline holds.
		log.Warn("lease renewal failed", "event", "lease_renewal_failed", "error", err.Error(),
			"deadlineIn", time.Until(l.deadline).String())
	default:
		// NOT_FOUND, or the server refused the renewal itself: asking again gets
		// the same answer, and the lease cannot outlive its expiry.
		log.Warn("lease lost", "event", "lease_lost", "error", err.Error())
		l.endLocked(fmt.Errorf("%w: renewal refused: %w", ErrLeaseLost, err))
	}
}

// armLocked sets the local deadline and the timer that enforces it.
func (l *Lease) armLocked(deadline time.Time) {
	l.disarmLocked()
	l.deadline = deadline
	gen := l.gen
	l.timer = time.AfterFunc(time.Until(deadline), func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if gen == l.gen && !l.ended && !l.frozen {
			l.expireLocked()
		}
	})
}

func (l *Lease) disarmLocked() {
	l.gen++ // a timer already firing sees a newer generation and does nothing
	if l.timer != nil {
		l.timer.Stop()
	}
}

func (l *Lease) expireLocked() {
	l.c.logger.Warn("lease deadline passed without a successful renewal", "event", "lease_expired",
		"lockName", l.name, "ownerId", l.owner, "token", l.token)
	l.endLocked(ErrExpired)
}

// endLocked ends the lease for cause; the first cause is the one Err reports.
func (l *Lease) endLocked(cause error) {
	if l.ended {
		return
	}
	l.ended = true
	if l.detach != nil {
		l.detach()
	}
	l.disarmLocked()
	if l.inflight != nil {
		l.inflight()
	}
	l.cancel(cause)
}
