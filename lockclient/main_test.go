package lockclient_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/identity"
	"lock.dev/internal/lockserver"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// world is a real lock-server on a real lockdb, behind a listener the test can
// cut (drop), stall (requests are not delivered) or slow (replies are delayed).
type world struct {
	URL  string
	pool *pgxpool.Pool
	net  *switchListener
}

func newWorld(t *testing.T) *world {
	t.Helper()
	dbURL := pgtest.LockdbURL(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl := newSwitchListener(ln)
	cfg := lockserver.DefaultConfig()
	cfg.LockdbURL = dbURL
	cfg.UnsafeNonDurableDB = true // the test cluster runs with fsync off
	cfg.LockdbMaxConns = 8
	cfg.MinTTL = 100 * time.Millisecond
	// about leases, not identity (docs/contracts/workload-identity.md): plaintext.
	cfg.Identity = identity.Settings{UnsafeNoAuth: true}
	cfg.Listener = sl
	cfg.LogOutput = io.Discard
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- lockserver.Run(ctx, cfg) }()
	t.Cleanup(func() {
		sl.set(modeOpen) // let stalled connections go, so the drain is quick
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("lock-server: %v", err)
		}
	})
	w := &world{URL: "http://" + ln.Addr().String(), pool: pgtest.Pool(t, dbURL), net: sl}
	testkit.WaitHTTP(t, nil, 20*time.Second, w.URL+"/readyz", http.StatusOK)
	return w
}

// newClient is lockclient.New of a URL the test knows to be good.
func newClient(t *testing.T, url string, opts ...lockclient.Option) *lockclient.Client {
	t.Helper()
	c, err := lockclient.New(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// serverLease is lockdb's view of a lock: its current token, expiry, and whether
// that expiry is still ahead by lockdb's clock.
type serverLease struct {
	token   int64
	expires time.Time
	live    bool
}

func (w *world) lease(t *testing.T, name string) serverLease {
	t.Helper()
	var s serverLease
	err := w.pool.QueryRow(context.Background(), `
		SELECT token, expires_at, owner_id IS NOT NULL AND expires_at > clock_timestamp()
		  FROM lock_lease WHERE lock_name = $1`, name).Scan(&s.token, &s.expires, &s.live)
	if err != nil {
		t.Fatalf("reading lock_lease %s: %v", name, err)
	}
	return s
}

// releaseBehindItsBack releases a grant with a raw call, as another process of
// the same owner might: the lease's next renewal is then LEASE_LOST.
func (w *world) releaseBehindItsBack(t *testing.T, name, owner string, token int64) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, w.URL+"/v1/locks/"+name+"/release", nil)
	req.Header.Set(lockapi.HeaderOwnerID, owner)
	req.Header.Set(lockapi.HeaderFencingToken, strconv.FormatInt(token, 10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("raw release: %d", resp.StatusCode)
	}
}

// waitDone waits for the lease's context to end, at most limit.
func waitDone(t *testing.T, l *lockclient.Lease, limit time.Duration) {
	t.Helper()
	select {
	case <-l.Context().Done():
	case <-time.After(limit):
		t.Fatalf("lease context still live after %s", limit)
	}
}

// mustStayLive fails if the lease's context ends within d.
func mustStayLive(t *testing.T, l *lockclient.Lease, d time.Duration) {
	t.Helper()
	select {
	case <-l.Context().Done():
		t.Fatalf("lease ended early: %v", l.Err())
	case <-time.After(d):
	}
}

func isExpired(err error) bool {
	return errors.Is(err, lockclient.ErrExpired) && errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, lockclient.ErrLeaseLost)
}

// switchListener hands out connections whose fate the test decides.
type switchListener struct {
	net.Listener
	mu    sync.Mutex
	cond  *sync.Cond
	mode  netMode
	delay time.Duration // modeSlow: how long each reply waits
	conns map[*switchConn]struct{}
}

type netMode int

const (
	modeOpen  netMode = iota
	modeDrop          // every connection is closed; new ones are closed at once
	modeStall         // requests are read off the wire but not delivered
	modeSlow          // replies are delayed
)

func newSwitchListener(ln net.Listener) *switchListener {
	s := &switchListener{Listener: ln, conns: map[*switchConn]struct{}{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *switchListener) set(m netMode) { s.setSlow(m, 0) }

func (s *switchListener) setSlow(m netMode, delay time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mode, s.delay = m, delay
	if m == modeDrop {
		for c := range s.conns {
			c.closeLocked()
		}
	}
	s.cond.Broadcast()
}

func (s *switchListener) Accept() (net.Conn, error) {
	for {
		c, err := s.Listener.Accept()
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		if s.mode == modeDrop {
			s.mu.Unlock()
			c.Close()
			continue
		}
		sc := &switchConn{Conn: c, l: s}
		s.conns[sc] = struct{}{}
		s.mu.Unlock()
		return sc, nil
	}
}

type switchConn struct {
	net.Conn
	l      *switchListener
	closed bool
}

func (c *switchConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.l.mu.Lock()
	for c.l.mode == modeStall && !c.closed {
		c.l.cond.Wait()
	}
	closed := c.closed
	c.l.mu.Unlock()
	if closed {
		return 0, net.ErrClosed
	}
	return n, err
}

func (c *switchConn) Write(p []byte) (int, error) {
	c.l.mu.Lock()
	delay := time.Duration(0)
	if c.l.mode == modeSlow {
		delay = c.l.delay
	}
	c.l.mu.Unlock()
	time.Sleep(delay)
	return c.Conn.Write(p)
}

func (c *switchConn) Close() error {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	return c.closeLocked()
}

func (c *switchConn) closeLocked() error {
	if c.closed {
		return nil
	}
	c.closed = true
	delete(c.l.conns, c)
	c.l.cond.Broadcast()
	return c.Conn.Close()
}
