package lockserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"lock.dev/internal/logcapture"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/identity"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/testkit"
	"lock.dev/internal/testkit/faultproxy"
	"lock.dev/lockapi"
)

// TestMain runs the tests, then fails the run on a conformance finding no test
// was told of and on a documented answer no test provoked (conformance_test.go).
func TestMain(m *testing.M) { os.Exit(conformance.Finish(pgtest.Main(m), exempt...)) }

// testConfig is the default configuration on dbURL, with a small pool.
func testConfig(dbURL string) Config {
	cfg := DefaultConfig()
	cfg.LockdbURL = dbURL
	cfg.LockdbMaxConns = 8
	cfg.UnsafeNonDurableDB = true // the test cluster runs with fsync off
	// about leases, not identity (docs/contracts/workload-identity.md): plaintext,
	// every caller allowed, grants unsigned unless a test gives a key.
	cfg.Identity = identity.Settings{UnsafeNoAuth: true}
	return cfg
}

// testServer is one lock-server running in-process on a port-0 listener.
type testServer struct {
	URL  string
	logs *syncBuffer
	stop func() // cancels Run and waits for it; fails the test if Run failed
}

// startServer runs lock-server with cfg until the test ends (or stop), and waits
// for readiness.
func startServer(t testing.TB, cfg Config) *testServer {
	t.Helper()
	return startServerWith(t, cfg, "http", testHTTP)
}

// startServerWith is startServer for a server reached at scheme (https when
// cfg has identities) through client, which waits for its readiness.
func startServerWith(t testing.TB, cfg Config, scheme string, client *http.Client) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener = ln
	if _, bench := t.(*testing.B); !bench {
		// Every exchange with this server through testHTTP is checked against
		// the OpenAPI document, and its findings fail t. Registered before the
		// cleanup that stops the server, so it runs after it.
		conformance.Track(t, scheme+"://"+ln.Addr().String())
	}
	logs := &syncBuffer{}
	if cfg.LogOutput == nil {
		cfg.LogOutput = logs
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- Run(ctx, cfg) }()
	var once sync.Once
	s := &testServer{URL: scheme + "://" + ln.Addr().String(), logs: logs}
	s.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("Run returned %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("Run did not return after cancel")
			}
		})
	}
	t.Cleanup(s.stop)
	testkit.EventuallyState(t, 20*time.Second, "lock-server to be ready", func() (bool, string) {
		select {
		case err := <-errc:
			t.Fatalf("Run returned before serving: %v", err)
		default:
		}
		resp, err := client.Get(s.URL + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return s
}

// testHTTP is the client of every test: its exchanges with a server a test
// tracks are checked against api/lock-server.json.
var testHTTP = &http.Client{
	Timeout: 15 * time.Second,
	Transport: conformance.TrackedRoundTripper(
		&http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 128, IdleConnTimeout: 30 * time.Second}),
}

// answer is a raw HTTP answer.
type answer struct {
	Status int
	Header http.Header
	Body   []byte
}

func (a answer) problem() *lockapi.Problem {
	return lockapi.ReadProblem(&http.Response{StatusCode: a.Status, Header: a.Header}, a.Body)
}

func (a answer) String() string {
	return fmt.Sprintf("%d %s", a.Status, strings.TrimSpace(string(a.Body)))
}

// send performs one request; it is safe from any goroutine.
func send(method, u string, h http.Header, body []byte) (answer, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		return answer{}, err
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	resp, err := testHTTP.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{Status: resp.StatusCode, Header: resp.Header, Body: b}, err
}

func leaseHeaders(owner string, token int64) http.Header {
	h := http.Header{"Content-Type": {"application/json"}, lockapi.HeaderOwnerID: {owner}}
	if token > 0 {
		h.Set(lockapi.HeaderFencingToken, strconv.FormatInt(token, 10))
	}
	return h
}

func ttlBody(ttlMs int64) []byte { return []byte(fmt.Sprintf(`{"ttlMs":%d}`, ttlMs)) }

func lockURL(base, name, suffix string) string {
	return base + "/v1/locks/" + url.PathEscape(name) + suffix
}

func acquireCall(base, name, owner string, ttlMs int64) (answer, lockapi.Lease, error) {
	a, err := send(http.MethodPost, lockURL(base, name, "/acquire"), leaseHeaders(owner, 0), ttlBody(ttlMs))
	return decodeLease(a, err)
}

func renewCall(base, name, owner string, token, ttlMs int64) (answer, lockapi.Lease, error) {
	a, err := send(http.MethodPost, lockURL(base, name, "/renew"), leaseHeaders(owner, token), ttlBody(ttlMs))
	return decodeLease(a, err)
}

func releaseCall(base, name, owner string, token int64) (answer, error) {
	h := leaseHeaders(owner, token)
	h.Del("Content-Type")
	return send(http.MethodPost, lockURL(base, name, "/release"), h, nil)
}

func decodeLease(a answer, err error) (answer, lockapi.Lease, error) {
	var l lockapi.Lease
	if err != nil || a.Status != http.StatusOK {
		return a, l, err
	}
	return a, l, json.Unmarshal(a.Body, &l)
}

// Helpers for the test goroutine: fail at once on anything unexpected.

func mustAcquire(t *testing.T, base, name, owner string, ttlMs int64) lockapi.Lease {
	t.Helper()
	a, l, err := acquireCall(base, name, owner, ttlMs)
	if err != nil || a.Status != http.StatusOK {
		t.Fatalf("acquire %s by %s: %v %v", name, owner, a, err)
	}
	return l
}

func mustRenew(t *testing.T, base, name, owner string, token, ttlMs int64) lockapi.Lease {
	t.Helper()
	a, l, err := renewCall(base, name, owner, token, ttlMs)
	if err != nil || a.Status != http.StatusOK {
		t.Fatalf("renew %s by %s token %d: %v %v", name, owner, token, a, err)
	}
	return l
}

func mustRelease(t *testing.T, base, name, owner string, token int64) {
	t.Helper()
	a, err := releaseCall(base, name, owner, token)
	if err != nil || a.Status != http.StatusNoContent {
		t.Fatalf("release %s by %s token %d: %v %v", name, owner, token, a, err)
	}
}

// wantProblem checks a problem answer's status and code.
func wantProblem(t *testing.T, what string, a answer, status int, code string) *lockapi.Problem {
	t.Helper()
	p := a.problem()
	if a.Status != status || p == nil || p.Code != code || p.Status != status {
		t.Fatalf("%s: got %v, want %d %s", what, a, status, code)
	}
	return p
}

func getJSON(t *testing.T, u string, dst any) answer {
	t.Helper()
	a, err := send(http.MethodGet, u, nil, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	if a.Status == http.StatusOK && dst != nil {
		if err := json.Unmarshal(a.Body, dst); err != nil {
			t.Fatalf("GET %s: decoding %s: %v", u, a.Body, err)
		}
	}
	return a
}

// dbNow is lockdb's clock.
func dbNow(t *testing.T, q *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	if err := q.QueryRow(context.Background(), "SELECT clock_timestamp()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// waitDBPast sleeps until lockdb's clock is past at.
func waitDBPast(t *testing.T, q *pgxpool.Pool, at time.Time) {
	t.Helper()
	for i := 0; ; i++ {
		now := dbNow(t, q)
		if now.After(at) {
			return
		}
		if i > 1000 {
			t.Fatalf("lockdb clock never passed %s", at)
		}
		time.Sleep(at.Sub(now) + time.Millisecond)
	}
}

// syncBuffer is a log sink several goroutines write to.
type syncBuffer struct{ logcapture.Buffer }

// startBehindProxy starts a lock-server on a fresh lockdb that it reaches only
// through a TCP fault proxy the test controls (Down, Hold, Forward).
func startBehindProxy(t *testing.T) (*testServer, *faultproxy.Proxy) {
	t.Helper()
	proxy, viaURL := testkit.FaultProxyURL(t, pgtest.LockdbURL(t))
	return startServer(t, testConfig(viaURL)), proxy
}
