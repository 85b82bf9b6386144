package lockclient_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/internal/leasepause"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// A lease renews itself: well past its TTL its context is live and lockdb's
// expiry has moved on; Release ends it, and may be repeated.
func TestLeaseRenewsItselfAndReleases(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	c := newClient(t, w.URL)
	ctx := context.Background()
	l, err := c.Acquire(ctx, "account:a1", "exec-1", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() != 1 || l.Name() != "account:a1" || l.Owner() != "exec-1" || l.TTL() != 2*time.Second {
		t.Errorf("lease: token %d name %s owner %s ttl %s", l.Token(), l.Name(), l.Owner(), l.TTL())
	}
	first := w.lease(t, "account:a1").expires
	mustStayLive(t, l, 3*time.Second) // 1.5 TTLs: only renewals keep it alive
	if l.Err() != nil {
		t.Errorf("Err on a live lease: %v", l.Err())
	}
	now := w.lease(t, "account:a1")
	if !now.live || now.token != 1 || !now.expires.After(first.Add(time.Second)) {
		t.Errorf("after 1.5 TTLs lockdb has %+v (first expiry %s): the lease did not renew", now, first)
	}
	st, err := c.Get(ctx, "account:a1")
	if err != nil || !st.Held || st.OwnerID == nil || *st.OwnerID != "exec-1" || st.Token != 1 {
		t.Errorf("Get: %+v %v", st, err)
	}

	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	waitDone(t, l, time.Second)
	if !errors.Is(l.Err(), lockclient.ErrReleased) {
		t.Errorf("Err after Release = %v", l.Err())
	}
	if w.lease(t, "account:a1").live {
		t.Error("lockdb still holds the lease after Release")
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("second Release: %v", err)
	}
	gs, err := c.Grants(ctx, "account:a1", 10)
	if err != nil || len(gs) != 1 || gs[0].ReleasedAt == nil {
		t.Errorf("Grants: %+v %v", gs, err)
	}
}

// Errors are typed: errors.Is recognises the sentinels, *Error carries the code,
// status and problem (LOCK_HELD with its holder).
func TestTypedErrors(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	c := newClient(t, w.URL)
	ctx := context.Background()
	l, err := c.Acquire(ctx, "account:e", "exec-1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)

	_, err = c.Acquire(ctx, "account:e", "exec-2", 5*time.Second)
	var e *lockclient.Error
	if !errors.Is(err, lockclient.ErrHeld) || !errors.As(err, &e) || e.Code != lockapi.CodeLockHeld || e.Status != http.StatusConflict || e.Problem == nil {
		t.Fatalf("Acquire of a held lock: %v", err)
	}
	if errors.Is(err, lockclient.ErrLeaseLost) || errors.Is(err, lockclient.ErrUnavailable) {
		t.Errorf("LOCK_HELD matches other sentinels: %v", err)
	}
	if holder, exp, ok := e.Holder(); !ok || holder != "exec-1" || !exp.Equal(l.ExpiresAt()) {
		t.Errorf("Holder() = %q %s %v, want exec-1 %s", holder, exp, ok, l.ExpiresAt())
	}

	if _, err := c.Get(ctx, "account:never"); !errors.Is(err, lockclient.ErrNotFound) {
		t.Errorf("Get of an unknown lock: %v", err)
	}
	if _, err := c.Grants(ctx, "account:never", 0); !errors.Is(err, lockclient.ErrNotFound) {
		t.Errorf("Grants of an unknown lock: %v", err)
	}
	_, err = c.Acquire(ctx, "account:e2", "exec-1", 50*time.Millisecond) // below the server's 100ms
	if !errors.As(err, &e) || e.Code != lockapi.CodeInvalidRequest || e.Status != http.StatusBadRequest {
		t.Errorf("Acquire below the minimum TTL: %v", err)
	}
	for _, bad := range []string{"a/b", ".", "..", ""} {
		if _, err := c.Acquire(ctx, bad, "exec-1", time.Second); !errors.As(err, &e) || e.Code != lockapi.CodeInvalidRequest {
			t.Errorf("Acquire of name %q: %v", bad, err)
		}
	}
	if _, err := c.Acquire(ctx, "account:e4", "exec 1", time.Second); !errors.As(err, &e) || e.Code != lockapi.CodeInvalidRequest {
		t.Errorf("Acquire for a malformed owner: %v", err)
	}
	if _, err := lockclient.New(w.URL, lockclient.WithDriftMargin(0.9)); err == nil {
		t.Errorf("a drift margin of 0.9 was accepted")
	}

	// Nobody listening: ErrUnavailable, and the transport's error underneath.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close()
	_, err = newClient(t, dead).Acquire(ctx, "account:e", "exec-1", time.Second)
	if !errors.Is(err, lockclient.ErrUnavailable) || !errors.As(err, &e) || e.Status != 0 || e.Err == nil {
		t.Errorf("Acquire from a dead server: %v", err)
	}
}

// Acquire never retries, not even through Go's transport: an acquire whose
// connection dies after it was sent is one request and an ErrUnavailable, and a
// LOCK_HELD or a 503 is one request too.
func TestAcquireIsNeverRetried(t *testing.T) {
	t.Parallel()
	var acquires atomic.Int64
	var answer atomic.Int64 // 0: hang up; else the status to answer
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			lockapi.WriteProblem(w, lockapi.NewProblem(404, lockapi.CodeNotFound, "", nil))
			return
		}
		acquires.Add(1)
		switch st := int(answer.Load()); st {
		case 0:
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close() // the request was received; the answer never comes
			}
		case http.StatusConflict:
			lockapi.WriteProblem(w, lockapi.NewProblem(st, lockapi.CodeLockHeld, "", map[string]any{"holder": "x", "expiresAt": time.Now()}))
		default:
			lockapi.WriteProblem(w, lockapi.NewProblem(st, lockapi.CodeUnavailable, "", nil))
		}
	}))
	defer srv.Close()
	c := newClient(t, srv.URL)
	ctx := context.Background()
	for _, c2 := range []struct {
		status int64
		want   error
	}{{0, lockclient.ErrUnavailable}, {409, lockclient.ErrHeld}, {503, lockclient.ErrUnavailable}} {
		// A GET first, so the acquire goes out on a reused keep-alive connection:
		// the case where Go's transport would resend a replayable request.
		if _, err := c.Get(ctx, "account:r"); !errors.Is(err, lockclient.ErrNotFound) {
			t.Fatalf("warm-up GET: %v", err)
		}
		answer.Store(c2.status)
		before := acquires.Load()
		_, err := c.Acquire(ctx, "account:r", "exec-1", time.Second)
		if !errors.Is(err, c2.want) {
			t.Errorf("answer %d: Acquire = %v, want %v", c2.status, err, c2.want)
		}
		if n := acquires.Load() - before; n != 1 {
			t.Errorf("answer %d: the server received %d acquires, want 1", c2.status, n)
		}
	}
}

// A renewal answered LEASE_LOST cancels the context with
// ErrLeaseLost (not a deadline); Release then reports what the server says.
func TestLeaseLostCancelsContext(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	c := newClient(t, w.URL)
	ctx := context.Background()
	l, err := c.Acquire(ctx, "account:lost", "exec-1", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	w.releaseBehindItsBack(t, "account:lost", "exec-1", l.Token())
	// The next renewal is at 1 s; the local deadline would be at 2.7 s.
	waitDone(t, l, 2500*time.Millisecond)
	if err := l.Err(); !errors.Is(err, lockclient.ErrLeaseLost) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err = %v, want ErrLeaseLost", err)
	}
	// That grant was released (by the other process): releasing it again is
	// success, even once a newer grant exists.
	l2, err := c.Acquire(ctx, "account:lost", "exec-2", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release of a released grant: %v", err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// When renewals stop getting through — the server unreachable, or
// its replies stalled — the context is cancelled with ErrExpired while lockdb
// still holds the lease: before the server-side expiry, never after. The acquire
// reply is delayed first, so a client that measured its deadline from the reply
// instead of from before the request would be caught outliving lockdb's lease.
func TestContextCancelledBeforeServerExpiry(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name string
		m    netMode
	}{{"unreachable", modeDrop}, {"stalled", modeStall}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			c := newClient(t, w.URL)
			const name = "account:cut"
			const ttl = 2 * time.Second
			w.net.setSlow(modeSlow, 500*time.Millisecond) // the acquire's answer takes 0.5 s to come back
			l, err := c.Acquire(context.Background(), name, "exec-1", ttl)
			if err != nil {
				t.Fatal(err)
			}
			w.net.set(mode.m) // no renewal gets through from now on
			waitDone(t, l, 5*time.Second)
			at := w.lease(t, name) // read at once: is lockdb's lease still running?
			if !at.live {
				t.Errorf("context cancelled after lockdb's lease expired (at %s)", at.expires)
			}
			if !isExpired(l.Err()) {
				t.Errorf("Err = %v, want ErrExpired", l.Err())
			}
		})
	}
}

// A frozen lease neither renews nor cancels, however long it is
// frozen; thawed after lockdb's expiry, its first renewal is LEASE_LOST and the
// context is cancelled.
func TestFrozenPastExpiryThenThawed(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	pz := leasepause.New[*lockclient.Lease]()
	c := newClient(t, w.URL, lockclient.WithPauser(pz))
	const name = "account:frozen"
	l, err := c.Acquire(context.Background(), name, "exec-1", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pz.Freeze(l)
	pz.Freeze(l) // twice is once
	before := w.lease(t, name)
	// Past the local deadline (0.9 s) and lockdb's expiry (1 s).
	mustStayLive(t, l, 1500*time.Millisecond)
	after := w.lease(t, name)
	if !after.expires.Equal(before.expires) || after.live {
		t.Fatalf("while frozen lockdb went from %+v to %+v: a renewal got through", before, after)
	}
	if l.Err() != nil {
		t.Fatalf("frozen lease has Err %v", l.Err())
	}
	pz.Thaw(l)
	waitDone(t, l, 2*time.Second)
	if err := l.Err(); !errors.Is(err, lockclient.ErrLeaseLost) {
		t.Errorf("Err after a thaw past expiry = %v, want ErrLeaseLost (from the renewal)", err)
	}
	if pz.Thaw(l) {
		t.Error("the pauser still reaches a lease that has ended")
	}

	// The stale grant expired and another took over: releasing it is LEASE_LOST.
	l2, err := c.Acquire(context.Background(), name, "exec-2", time.Second)
	if err != nil || l2.Token() != l.Token()+1 {
		t.Fatalf("Acquire after expiry: %v", err)
	}
	if err := l.Release(context.Background()); !errors.Is(err, lockclient.ErrLeaseLost) {
		t.Errorf("Release of a replaced grant: %v", err)
	}
	if err := l2.Release(context.Background()); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// A short freeze is survived: Thaw renews at once and the lease carries on.
// Release works on a frozen lease.
func TestShortFreezeIsSurvived(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	pz := leasepause.New[*lockclient.Lease]()
	c := newClient(t, w.URL, lockclient.WithPauser(pz))
	const name = "account:nap"
	l, err := c.Acquire(context.Background(), name, "exec-1", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pz.Thaw(l) // not frozen: nothing happens
	pz.Freeze(l)
	first := w.lease(t, name).expires
	time.Sleep(1200 * time.Millisecond) // past the renewal tick at 1 s: no renewal may go out
	if now := w.lease(t, name).expires; !now.Equal(first) {
		t.Fatalf("a frozen lease renewed: %s → %s", first, now)
	}
	pz.Thaw(l)
	// Renewed at once on thaw: lockdb's expiry moves although the next tick is
	// 0.8 s away.
	testkit.Eventually(t, 500*time.Millisecond, "a renewal right after Thaw", func() bool {
		return !w.lease(t, name).expires.Equal(first)
	})
	mustStayLive(t, l, 2*time.Second)
	pz.Freeze(l)
	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("Release of a frozen lease: %v", err)
	}
	if !errors.Is(l.Err(), lockclient.ErrReleased) {
		t.Errorf("Err = %v, want ErrReleased", l.Err())
	}
}

// Thaw re-arms the deadline: with renewals not getting through, a thawed lease
// ends on what remained of its deadline, with ErrExpired — it does not live on.
func TestThawWithServerUnreachableExpires(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	pz := leasepause.New[*lockclient.Lease]()
	c := newClient(t, w.URL, lockclient.WithPauser(pz))
	l, err := c.Acquire(context.Background(), "account:rem", "exec-1", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pz.Freeze(l)
	w.net.set(modeDrop)
	time.Sleep(300 * time.Millisecond)
	pz.Thaw(l)
	waitDone(t, l, 3*time.Second)
	if !isExpired(l.Err()) {
		t.Fatalf("Err = %v, want ErrExpired", l.Err())
	}
}
