package lockclient_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// acquireCounter is a transport that counts the acquires sent through it.
type acquireCounter struct {
	base     *http.Transport
	acquires atomic.Int64
}

func (c *acquireCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/acquire") {
		c.acquires.Add(1)
	}
	return c.base.RoundTrip(r)
}

// countedClient is a client of url whose acquires the returned counter counts.
func countedClient(t *testing.T, url string, opts ...lockclient.Option) (*lockclient.Client, *acquireCounter) {
	t.Helper()
	cnt := &acquireCounter{base: &http.Transport{}}
	t.Cleanup(cnt.base.CloseIdleConnections)
	opts = append([]lockclient.Option{lockclient.WithHTTPClient(&http.Client{Transport: cnt})}, opts...)
	return newClient(t, url, opts...), cnt
}

type lockResult struct {
	lease *lockclient.Lease
	err   error
}

// lockAsync runs Lock in a goroutine; its answer comes on the channel.
func lockAsync(ctx context.Context, c *lockclient.Client, name, owner string, ttl time.Duration, opts ...lockclient.LockOption) <-chan lockResult {
	ch := make(chan lockResult, 1)
	go func() {
		l, err := c.Lock(ctx, name, owner, ttl, opts...)
		ch <- lockResult{l, err}
	}()
	return ch
}

func await(t *testing.T, ch <-chan lockResult) lockResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("Lock has not returned after 30 s")
		return lockResult{}
	}
}

// held is whether lockdb holds name right now (false when it was never granted).
func (w *world) held(t *testing.T, name string) bool {
	t.Helper()
	var live bool
	err := w.pool.QueryRow(context.Background(), `
		SELECT owner_id IS NOT NULL AND expires_at > clock_timestamp() FROM lock_lease WHERE lock_name = $1`, name).Scan(&live)
	if errors.Is(err, pgx.ErrNoRows) {
		return false
	}
	if err != nil {
		t.Fatalf("reading lock_lease %s: %v", name, err)
	}
	return live
}

// Lock waits out a held lock: it asks again until the holder releases, then
// holds the next grant.
func TestLockWaitsForTheHolder(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const name = "account:wait"
	first, err := newClient(t, w.URL).Acquire(context.Background(), name, "exec-1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c, cnt := countedClient(t, w.URL)
	ch := lockAsync(context.Background(), c, name, "exec-2", 5*time.Second)
	testkit.Eventually(t, 10*time.Second, "two acquires answered LOCK_HELD", func() bool { return cnt.acquires.Load() >= 2 })
	if err := first.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := await(t, ch)
	if r.err != nil {
		t.Fatalf("Lock: %v", r.err)
	}
	defer r.lease.Release(context.Background())
	if r.lease.Token() != first.Token()+1 || r.lease.Owner() != "exec-2" || r.lease.Err() != nil {
		t.Errorf("Lock gave token %d to %s (Err %v), want token %d to exec-2", r.lease.Token(), r.lease.Owner(), r.lease.Err(), first.Token()+1)
	}
}

// Lock tries again while lock-server cannot be reached, and holds the lock once
// it can.
func TestLockRetriesWhileUnreachable(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	c, cnt := countedClient(t, w.URL)
	w.net.set(modeDrop)
	ch := lockAsync(context.Background(), c, "account:down", "exec-1", 5*time.Second)
	testkit.Eventually(t, 10*time.Second, "two acquires that got no answer", func() bool { return cnt.acquires.Load() >= 2 })
	w.net.set(modeOpen)
	r := await(t, ch)
	if r.err != nil {
		t.Fatalf("Lock: %v", r.err)
	}
	defer r.lease.Release(context.Background())
	if r.lease.Token() != 1 {
		t.Errorf("token %d, want 1", r.lease.Token())
	}
}

// Answers that cannot change are returned at once, after one request (or none,
// when the client can tell by itself): asking again would get the same answer.
func TestLockGivesUpOnAnswersThatCannotChange(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	// A deadline far away: a Lock that retried would end on it instead.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		what     string
		name     string
		owner    string
		ttl      time.Duration
		opts     []lockclient.LockOption
		requests int64
	}{
		{"a TTL below the server's minimum", "account:short", "exec-1", 50 * time.Millisecond, nil, 1},
		{"a name no URL can carry", "..", "exec-1", time.Second, nil, 0},
		{"a malformed name", "account/x", "exec-1", time.Second, nil, 0},
		{"a malformed owner", "account:x", "exec 1", time.Second, nil, 0},
		{"a backoff that ends below its start", "account:x", "exec-1", time.Second,
			[]lockclient.LockOption{lockclient.WithBackoff(time.Second, time.Millisecond)}, 0},
	} {
		c, cnt := countedClient(t, w.URL)
		_, err := c.Lock(ctx, tc.name, tc.owner, tc.ttl, tc.opts...)
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: Lock = %v, want the refusal", tc.what, err)
		}
		if n := cnt.acquires.Load(); n != tc.requests {
			t.Errorf("%s: %d acquires sent, want %d", tc.what, n, tc.requests)
		}
		var e *lockclient.Error
		if tc.opts == nil && (!errors.As(err, &e) || e.Code != lockapi.CodeInvalidRequest) {
			t.Errorf("%s: %v, want INVALID_REQUEST", tc.what, err)
		}
	}
	if w.held(t, "account:short") {
		t.Error("a refused TTL was granted")
	}
}

// Lock ends with ctx: the error wraps ctx's and says what the lock was
// answered; a context already ended sends nothing; the holder keeps its lease.
func TestLockEndsWithItsContext(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const name = "account:busy"
	holder, err := newClient(t, w.URL).Acquire(context.Background(), name, "exec-1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	c, cnt := countedClient(t, w.URL)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = c.Lock(ctx, name, "exec-2", 5*time.Second)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), lockapi.CodeLockHeld) {
		t.Errorf("Lock until a deadline: %v, want DeadlineExceeded saying the lock was held", err)
	}
	if cnt.acquires.Load() < 1 {
		t.Error("Lock sent no acquire before its deadline")
	}

	ctx2, cancel2 := context.WithCancel(context.Background())
	ch := lockAsync(ctx2, c, name, "exec-2", 5*time.Second)
	before := cnt.acquires.Load()
	testkit.Eventually(t, 10*time.Second, "another acquire", func() bool { return cnt.acquires.Load() > before })
	cancel2()
	if r := await(t, ch); !errors.Is(r.err, context.Canceled) || r.lease != nil {
		t.Errorf("Lock cancelled: %v, %v", r.lease, r.err)
	}

	before = cnt.acquires.Load()
	if _, err := c.Lock(ctx2, name, "exec-2", 5*time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("Lock with a cancelled context: %v", err)
	}
	if n := cnt.acquires.Load() - before; n != 0 {
		t.Errorf("Lock with a cancelled context sent %d acquires", n)
	}
	if holder.Err() != nil || !w.held(t, name) {
		t.Errorf("the holder's lease ended (%v)", holder.Err())
	}
}

// A grant that commits while Lock's context ends is not left behind: Lock
// waits for the acquire's answer and releases the lease before it returns.
func TestLockReleasesAGrantMadeAsItsContextEnded(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const name = "account:late"
	c := newClient(t, w.URL)
	w.net.setSlow(modeSlow, 2*time.Second) // the acquire's answer takes 2 s to come back
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := lockAsync(ctx, c, name, "exec-1", 10*time.Second)
	testkit.Eventually(t, 10*time.Second, "lockdb granting the lease", func() bool { return w.held(t, name) })
	cancel() // granted, the answer still on its way
	w.net.set(modeOpen)
	r := await(t, ch)
	if r.lease != nil || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Lock = %v, %v, want no lease and context.Canceled", r.lease, r.err)
	}
	if w.held(t, name) {
		t.Error("the lease granted as the context ended is still held: nobody can use it, and it blocks the lock for its TTL")
	}
	gs, err := c.Grants(context.Background(), name, 10)
	if err != nil || len(gs) != 1 || gs[0].ReleasedAt == nil {
		t.Errorf("grants %+v (%v), want one, released", gs, err)
	}
}

// Goroutines taking turns on one lock through Lock are never two inside at
// once, and each holds a token greater than every holder's before it; lockdb's
// history has every grant, released, tokens 1…N.
func TestLockMutualExclusion(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const (
		name    = "account:turns"
		workers = 6
		rounds  = 4
	)
	c := newClient(t, w.URL)
	var (
		mu     sync.Mutex
		inside int64 // the token inside, 0 when nobody is
		last   int64 // the token of the last holder to enter
		held   int
	)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("worker-%d", i)
			for range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				l, err := c.Lock(ctx, name, owner, 2*time.Second, lockclient.WithBackoff(5*time.Millisecond, 50*time.Millisecond))
				cancel()
				if err != nil {
					t.Errorf("%s: Lock: %v", owner, err)
					return
				}
				mu.Lock()
				if inside != 0 {
					t.Errorf("%s entered with token %d while token %d was inside", owner, l.Token(), inside)
				}
				if l.Token() <= last {
					t.Errorf("%s entered with token %d after token %d", owner, l.Token(), last)
				}
				inside, last = l.Token(), l.Token()
				held++
				mu.Unlock()
				time.Sleep(time.Millisecond) // the work, long enough for an overlap to show
				mu.Lock()
				inside = 0
				mu.Unlock()
				if err := l.Release(context.Background()); err != nil {
					t.Errorf("%s: Release: %v", owner, err)
				}
			}
		}()
	}
	wg.Wait()
	if held != workers*rounds {
		t.Fatalf("%d holds, want %d", held, workers*rounds)
	}
	gs, err := c.Grants(context.Background(), name, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(gs) != workers*rounds {
		t.Fatalf("%d grants in lockdb, want %d", len(gs), workers*rounds)
	}
	for i, g := range gs { // newest first
		if want := int64(len(gs) - i); g.Token != want || g.ReleasedAt == nil {
			t.Errorf("grant %d: token %d released %v, want token %d released", i, g.Token, g.ReleasedAt, want)
		}
	}
}
