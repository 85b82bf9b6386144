package lockserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// onPair runs lock-server on the lockdb of a primary with a synchronous standby,
// through the pair's multi-host URL.
func onPair(t *testing.T) (*pgcluster.Pair, *testServer) {
	t.Helper()
	p := pgtest.Pair(t, pgcluster.PairOptions{Sync: true})
	t.Cleanup(p.ReleaseStandby) // before Stop: a held standby would hold the drain's commits
	return p, startServer(t, testConfig(p.URL("lockdb")))
}

type leaseAnswer struct {
	a   answer
	l   lockapi.Lease
	err error
}

// A grant whose COMMIT came back with the cancelled-synchronous-replication
// warning is not a grant: lock-server answers 503 UNAVAILABLE with no token, and
// lockclient's Acquire returns an error, no lease. (PostgreSQL reported that
// COMMIT as a success; the standby never had the grant, so after a failover its
// token would be issued again.) Renew and release answer 503 alike.
func TestGrantNotDurableIsNotGranted(t *testing.T) {
	p, s := onPair(t)
	for _, terminate := range []bool{false, true} {
		if err := p.HoldStandby(); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("account:raw-%v", terminate)
		done := make(chan leaseAnswer, 1)
		go func() {
			a, l, err := acquireCall(s.URL, name, "owner-raw", 10_000)
			done <- leaseAnswer{a, l, err}
		}()
		r := testkit.CancelSyncWait(t, p, terminate, done)
		if r.err != nil || r.a.Status != http.StatusServiceUnavailable || r.a.problem().Code != lockapi.CodeUnavailable {
			t.Fatalf("grant with a cancelled sync wait (terminate=%v): %v %v; want 503 UNAVAILABLE", terminate, r.a, r.err)
		}
		if strings.Contains(string(r.a.Body), `"token"`) {
			t.Fatalf("the 503 carries a token: %s", r.a.Body)
		}
		p.ReleaseStandby()
		if !strings.Contains(s.logs.String(), "commit not durable") {
			t.Errorf("the log does not say why the grant failed:\n%s", s.logs.String())
		}
	}

	// The same through lockclient: Acquire returns an error and no lease.
	if err := p.HoldStandby(); err != nil {
		t.Fatal(err)
	}
	type acq struct {
		lease *lockclient.Lease
		err   error
	}
	c, err := lockclient.New(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan acq, 1)
	go func() {
		l, err := c.Acquire(context.Background(), "account:client", "owner-client", 10*time.Second)
		done <- acq{l, err}
	}()
	r := testkit.CancelSyncWait(t, p, false, done)
	if r.lease != nil || !errors.Is(r.err, lockclient.ErrUnavailable) {
		t.Fatalf("lockclient Acquire with a cancelled sync wait: lease %v, err %v; want no lease and ErrUnavailable", r.lease, r.err)
	}
	p.ReleaseStandby()

	// Renew and release: the same rule.
	l := mustAcquire(t, s.URL, "account:renew", "owner-renew", 10_000)
	if err := p.HoldStandby(); err != nil {
		t.Fatal(err)
	}
	renewed := make(chan leaseAnswer, 1)
	go func() {
		a, l, err := renewCall(s.URL, "account:renew", "owner-renew", l.Token, 10_000)
		renewed <- leaseAnswer{a, l, err}
	}()
	if r := testkit.CancelSyncWait(t, p, false, renewed); r.err != nil || r.a.Status != http.StatusServiceUnavailable {
		t.Fatalf("renew with a cancelled sync wait: %v %v; want 503", r.a, r.err)
	}
	released := make(chan leaseAnswer, 1)
	go func() {
		a, err := releaseCall(s.URL, "account:renew", "owner-renew", l.Token)
		released <- leaseAnswer{a: a, err: err}
	}()
	if r := testkit.CancelSyncWait(t, p, false, released); r.err != nil || r.a.Status != http.StatusServiceUnavailable {
		t.Fatalf("release with a cancelled sync wait: %v %v; want 503", r.a, r.err)
	}
	p.ReleaseStandby()
}

// kill -9 of lockdb's primary and a promotion: lock-server keeps serving without
// a restart, answering 503 UNAVAILABLE (never anything else) while no server
// accepts writes; afterwards tokens go on from where the synchronously committed
// grants left them.
func TestServesAcrossFailover(t *testing.T) {
	p, s := onPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first := mustAcquire(t, s.URL, "account:a", "owner-1", 10_000)
	mustRelease(t, s.URL, "account:a", "owner-1", first.Token)

	if err := p.KillPrimary(); err != nil {
		t.Fatal(err)
	}
	// No server accepts writes: every call is 503 UNAVAILABLE, and readiness is DOWN.
	for range 3 {
		a, _, err := acquireCall(s.URL, "account:a", "owner-2", 10_000)
		if err != nil || a.Status != http.StatusServiceUnavailable || a.problem().Code != lockapi.CodeUnavailable {
			t.Fatalf("acquire with the primary dead: %v %v; want 503 UNAVAILABLE", a, err)
		}
	}
	if resp, err := testHTTP.Get(s.URL + "/readyz"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("readiness with the primary dead: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	if err := p.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	// The same lock-server, the same pool: it finds the new primary.
	second := mustAcquire(t, s.URL, "account:a", "owner-2", 10_000)
	if second.Token != first.Token+1 {
		t.Fatalf("token after the failover = %d, want %d: the grant before it was committed synchronously", second.Token, first.Token+1)
	}
	mustRenew(t, s.URL, "account:a", "owner-2", second.Token, 10_000)
	mustRelease(t, s.URL, "account:a", "owner-2", second.Token)
	if resp, err := testHTTP.Get(s.URL + "/readyz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("readiness after the promotion: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}

// A lockdb whose fsync is off is refused unless UNSAFE_NON_DURABLE_DB is set
// (docs/contracts/configuration.md); with it, lock-server serves, says so at ERROR
// and shows the gauge.
func TestRefusesLockdbWithFsyncOff(t *testing.T) {
	p := pgtest.Pair(t, pgcluster.PairOptions{}) // a throwaway server: fsync off
	cfg := testConfig(p.URL("lockdb"))
	cfg.UnsafeNonDurableDB = false
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener, cfg.LogOutput = ln, io.Discard
	err = Run(context.Background(), cfg)
	if !errors.Is(err, dbconn.ErrNonDurable) || !strings.Contains(err.Error(), "UNSAFE_NON_DURABLE_DB") {
		t.Fatalf("Run on a lockdb with fsync off: %v; want a refusal naming UNSAFE_NON_DURABLE_DB", err)
	}
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Errorf("a refusing Run left its listener open")
	}

	s := startServer(t, testConfig(p.URL("lockdb")))
	a, err := send(http.MethodGet, s.URL+"/metrics", nil, nil)
	if err != nil || !strings.Contains(string(a.Body), "\ndb_unsafe_non_durable 1\n") {
		t.Errorf("metrics with UNSAFE_NON_DURABLE_DB=true lack db_unsafe_non_durable 1 (%v)", err)
	}
	if logs := s.logs.String(); !strings.Contains(logs, `"level":"ERROR"`) || !strings.Contains(logs, `"event":"unsafe_non_durable_db"`) {
		t.Errorf("start-up log lacks the unsafe_non_durable_db ERROR:\n%s", logs)
	}
}

// PostgreSQL sends the cancelled-wait warning only when client_min_messages is
// warning or more verbose. Whatever the role, the database or the URL sets
// (pgtest.QuietPlaces), a grant, renew or release whose commit's wait was
// cancelled answers 503 UNAVAILABLE, with no token: every transaction raises the
// setting itself (docs/contracts/database.md).
func TestGrantNotDurableWhateverClientMinMessages(t *testing.T) {
	p := pgtest.Pair(t, pgcluster.PairOptions{Sync: true})
	t.Cleanup(p.ReleaseStandby) // before Stop: a held standby would hold the drain's commits
	for _, quiet := range pgtest.QuietPlaces {
		s := startServer(t, testConfig(pgtest.Quiet(t, p, "lockdb", quiet)))
		name := "account:quiet-" + quiet
		if err := p.HoldStandby(); err != nil {
			t.Fatal(err)
		}
		granted := make(chan leaseAnswer, 1)
		go func() {
			a, l, err := acquireCall(s.URL, name+"-grant", "owner", 10_000)
			granted <- leaseAnswer{a, l, err}
		}()
		r := testkit.CancelSyncWait(t, p, false, granted)
		if r.err != nil || r.a.Status != http.StatusServiceUnavailable || r.a.problem().Code != lockapi.CodeUnavailable ||
			strings.Contains(string(r.a.Body), `"token"`) {
			t.Errorf("client_min_messages = error (%s): grant with a cancelled sync wait: %v %v; want 503 UNAVAILABLE, no token", quiet, r.a, r.err)
		}
		p.ReleaseStandby()

		l := mustAcquire(t, s.URL, name, "owner", 10_000)
		if err := p.HoldStandby(); err != nil {
			t.Fatal(err)
		}
		renewed := make(chan leaseAnswer, 1)
		go func() {
			a, l, err := renewCall(s.URL, name, "owner", l.Token, 10_000)
			renewed <- leaseAnswer{a, l, err}
		}()
		if r := testkit.CancelSyncWait(t, p, false, renewed); r.err != nil || r.a.Status != http.StatusServiceUnavailable {
			t.Errorf("client_min_messages = error (%s): renew with a cancelled sync wait: %v %v; want 503", quiet, r.a, r.err)
		}
		released := make(chan leaseAnswer, 1)
		go func() {
			a, err := releaseCall(s.URL, name, "owner", l.Token)
			released <- leaseAnswer{a: a, err: err}
		}()
		if r := testkit.CancelSyncWait(t, p, false, released); r.err != nil || r.a.Status != http.StatusServiceUnavailable {
			t.Errorf("client_min_messages = error (%s): release with a cancelled sync wait: %v %v; want 503", quiet, r.a, r.err)
		}
		p.ReleaseStandby()
		s.stop()
	}
}
