package railproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"lock.dev/internal/logcapture"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/identity"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/railstub"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// TestMain checks every exchange of the tests with a rail-proxy a test started
// against api/rail-proxy.json — through testHTTP, pollHTTP and
// http.DefaultClient (wrapped here, before any test runs) — and after the tests
// fails the run on a finding no test was told of and on a documented answer no
// test provoked (openapi_test.go).
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	http.DefaultClient.Transport = conformance.TrackedRoundTripper(http.DefaultTransport)
	os.Exit(conformance.Finish(pgtest.Main(m), exempt...))
}

// syncBuffer collects a service's log lines.
type syncBuffer struct{ logcapture.Buffer }

// events returns the decoded log lines whose event is name.
func (b *syncBuffer) events(name string) []map[string]any { return b.Events(name) }

// filter returns the decoded log lines keep accepts.
func (b *syncBuffer) filter(keep func(map[string]any) bool) []map[string]any {
	var out []map[string]any
	for _, l := range b.Lines() {
		if keep(l) {
			out = append(out, l)
		}
	}
	return out
}

// stub is a real rail-stub served on a port-0 listener.
type stub struct {
	URL    string
	Client *railstub.Client
}

func startStub(t testing.TB, latencyMs int) *stub {
	t.Helper()
	return startStubSpeaking(t, latencyMs, railstub.ProtocolStub)
}

// startStubSpeaking is startStub taking payments in protocol (RAIL_STUB_PROTOCOL).
func startStubSpeaking(t testing.TB, latencyMs int, protocol string) *stub {
	t.Helper()
	seed := int64(1)
	cfg := railstub.DefaultConfig()
	cfg.Addr, cfg.LogLevel, cfg.LatencyMs, cfg.Seed, cfg.LogOutput = ":0", "error", latencyMs, &seed, io.Discard
	cfg.Protocol = protocol
	s, err := railstub.New(cfg)
	if err != nil {
		t.Fatalf("rail-stub: %v", err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		srv.Close()
		_ = s.Close()
	})
	return &stub{URL: srv.URL, Client: railstub.NewClient(srv.URL)}
}

// calls returns the stub's call log: the ground truth of what the rail was presented.
func (s *stub) calls(t testing.TB) []railstub.Call {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := s.Client.Calls(ctx)
	if err != nil {
		t.Fatalf("stub calls: %v", err)
	}
	return c
}

func (s *stub) callsFor(t testing.TB, payoutID string) int {
	n := 0
	for _, c := range s.calls(t) {
		if c.Reference == payoutID {
			n++
		}
	}
	return n
}

func (s *stub) chaos(t testing.TB, latencyMs int, declineRate, dropRate float64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.Client.SetChaos(ctx, latencyMs, declineRate, dropRate, nil); err != nil {
		t.Fatalf("stub chaos: %v", err)
	}
}

// proxy is a rail-proxy started with Run on a port-0 listener.
type proxy struct {
	URL    string
	Logs   *syncBuffer
	stop   context.CancelFunc
	done   chan error
	once   sync.Once
	runErr error
}

func testConfig(paydbURL, railURL string) Config {
	cfg := DefaultConfig()
	cfg.PaydbURL = paydbURL
	cfg.UnsafeNonDurableDB = true // the test cluster runs with fsync off
	cfg.RailBaseURL = railURL
	cfg.LogLevel = "debug"
	// These tests are about the fence, the rail call and the audit trail: they
	// submit made-up payouts that no payout row books, so the books check is off
	// here. The books tests (books_test.go) turn it on and book their payouts.
	cfg.BooksCheck = false
	// About the fence, the rail and the audit trail, not identity
	// (docs/contracts/workload-identity.md): plaintext, no grant key set. The
	// identity tests (identity_test.go) set Identity themselves.
	cfg.Identity = identity.Settings{UnsafeNoAuth: true}
	return cfg
}

// startProxy runs a proxy and waits until it serves liveness. It is stopped when
// the test ends (Stop may be called earlier).
func startProxy(t testing.TB, cfg Config) *proxy {
	t.Helper()
	p, err := tryStartProxy(cfg)
	if err != nil {
		t.Fatalf("rail-proxy: %v", err)
	}
	if _, bench := t.(*testing.B); !bench {
		// The exchanges with this proxy are checked against the OpenAPI
		// document, and its findings fail t. Registered before the cleanup that
		// stops the proxy, so it runs after it.
		conformance.Track(t, p.URL)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("rail-proxy Run returned %v", err)
		}
	})
	return p
}

func tryStartProxy(cfg Config) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	logs := &syncBuffer{}
	cfg.Listener = ln
	cfg.LogOutput = logs
	ctx, cancel := context.WithCancel(context.Background())
	p := &proxy{URL: "http://" + ln.Addr().String(), Logs: logs, stop: cancel, done: make(chan error, 1)}
	go func() { p.done <- Run(ctx, cfg) }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-p.done:
			cancel()
			_ = ln.Close()
			return nil, fmt.Errorf("Run returned early: %w (logs: %s)", err, logs.String())
		default:
		}
		resp, err := pollHTTP.Get(p.URL + "/livez")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	return nil, fmt.Errorf("not live after 20s")
}

// Stop cancels Run and returns what it returned.
func (p *proxy) Stop() error {
	p.once.Do(func() {
		p.stop()
		select {
		case p.runErr = <-p.done:
		case <-time.After(30 * time.Second):
			p.runErr = fmt.Errorf("Run did not return within 30s of cancellation")
		}
	})
	return p.runErr
}

// answer is a decoded reply of the proxy: a success body or a problem.
type answer struct {
	Status int
	Body   map[string]any
	Header http.Header
	Err    error // trySubmit: the request itself failed (Status 0)
}

func (a answer) code() string { s, _ := a.Body["code"].(string); return s }

func (a answer) int(name string) int64 {
	switch v := a.Body[name].(type) {
	case json.Number:
		n, _ := v.Int64()
		return n
	case float64:
		return int64(v)
	}
	return -1
}

func (a answer) str(name string) string { s, _ := a.Body[name].(string); return s }

type payout struct {
	PayoutID, AccountID string
	AmountMinor         int64
	Currency            string
	Beneficiary         string
}

func newPayout(id, account string) payout {
	return payout{PayoutID: id, AccountID: account, AmountMinor: 125000, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}
}

func (p payout) body() []byte {
	b, _ := json.Marshal(lockapi.SubmissionRequest{PayoutID: p.PayoutID, AccountID: p.AccountID,
		AmountMinor: p.AmountMinor, Currency: p.Currency, Beneficiary: p.Beneficiary})
	return b
}

// The tests' clients: their exchanges with a proxy a test tracks are checked
// against api/rail-proxy.json.
var (
	testHTTP = &http.Client{Timeout: 30 * time.Second, Transport: conformance.TrackedRoundTripper(nil)}
	pollHTTP = &http.Client{Timeout: time.Second, Transport: conformance.TrackedRoundTripper(nil)}
)

// submit posts a submission the way an executor does.
func submit(t testing.TB, baseURL string, token int64, p payout) answer {
	t.Helper()
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set(lockapi.HeaderFencingToken, strconv.FormatInt(token, 10))
	h.Set(lockapi.HeaderOwnerID, "worker-1")
	h.Set(lockapi.HeaderIdempotencyKey, p.PayoutID+":"+strconv.FormatInt(token, 10))
	return post(t, baseURL, h, p.body())
}

// trySubmit is submit for a goroutine other than the test's: it never stops the
// test (only the test's own goroutine may call t.Fatal); a failed request comes
// back as an answer with Status 0 and Err set, for the test goroutine to judge.
func trySubmit(baseURL string, token int64, p payout) answer {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set(lockapi.HeaderFencingToken, strconv.FormatInt(token, 10))
	h.Set(lockapi.HeaderOwnerID, "worker-1")
	h.Set(lockapi.HeaderIdempotencyKey, p.PayoutID+":"+strconv.FormatInt(token, 10))
	a, err := tryPost(context.Background(), baseURL, h, p.body())
	if err != nil {
		return answer{Err: err}
	}
	return a
}

func post(t testing.TB, baseURL string, h http.Header, body []byte) answer {
	t.Helper()
	a, err := tryPost(context.Background(), baseURL, h, body)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	return a
}

func tryPost(ctx context.Context, baseURL string, h http.Header, body []byte) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/rail/submissions", bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header = h
	resp, err := testHTTP.Do(req)
	if err != nil {
		return answer{}, err
	}
	return decode(resp)
}

func decode(resp *http.Response) (answer, error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{Status: resp.StatusCode, Header: resp.Header}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&a.Body); err != nil {
		return a, fmt.Errorf("status %d, body %q: %w", resp.StatusCode, b, err)
	}
	return a, nil
}

func get(t testing.TB, url string) answer {
	t.Helper()
	resp, err := testHTTP.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	a, err := decode(resp)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return a
}

// scrape returns the metric exposition of path as lines.
func scrape(t testing.TB, url string) string {
	t.Helper()
	resp, err := testHTTP.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	return string(b)
}

// metric returns the value of one series (name with its labels, as exposed), or
// -1 when it is absent.
func metric(t testing.TB, p *proxy, series string) float64 {
	t.Helper()
	return metricAt(t, p.URL, series)
}

// metricAt is metric for the rail-proxy process at base.
func metricAt(t testing.TB, base, series string) float64 {
	t.Helper()
	return testkit.MetricOr(t, testHTTP, base, series, -1)
}

// row is a rail_submission row as the tests inspect it.
type row struct {
	ID            int64
	PayoutID      string
	AccountID     string
	Token         int64
	Outcome       *string
	RailReference *string
	DeclineReason *string
	SubmittedAt   time.Time
	ResolvedAt    *time.Time
}

func rowsOf(t testing.TB, db dbq, payoutID string) []row {
	t.Helper()
	out, err := tryRowsOf(db, payoutID)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tryRowsOf is rowsOf for a goroutine other than the test's.
func tryRowsOf(db dbq, payoutID string) ([]row, error) {
	rs, err := db.Query(context.Background(), `SELECT submission_id, payout_id, account_id, presented_token, outcome,
	       rail_reference, decline_reason, submitted_at, resolved_at
	  FROM rail_submission WHERE payout_id = $1 ORDER BY submission_id`, payoutID)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		if err := rs.Scan(&r.ID, &r.PayoutID, &r.AccountID, &r.Token, &r.Outcome, &r.RailReference, &r.DeclineReason, &r.SubmittedAt, &r.ResolvedAt); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rs.Err()
}

func countRows(t testing.TB, db dbq) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), "SELECT count(*) FROM rail_submission").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func mark(t testing.TB, db dbq, account string) int64 {
	t.Helper()
	var v int64
	err := db.QueryRow(context.Background(), "SELECT highest_token FROM rail_high_water WHERE account_id = $1", account).Scan(&v)
	if err != nil {
		return 0
	}
	return v
}

func outcomeOf(r row) string {
	if r.Outcome == nil {
		return "NULL"
	}
	return *r.Outcome
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, d, what, cond)
}

// startBinary builds cmd/rail-proxy (without -race, so that what is measured is
// the real binary's), starts it on a free loopback port with env added to this
// process's environment, and waits until it is live. It returns its base URL and
// its standard error and process id; the process is killed when the test ends.
func startBinary(t testing.TB, env ...string) (url string, stderr *logcapture.Buffer, pid int) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rail-proxy")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "lock.dev/cmd/rail-proxy").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	cmd := exec.Command(bin)
	// The binary's tests are about memory and throughput, not identity
	// (docs/contracts/workload-identity.md): plaintext, unless env says otherwise.
	cmd.Env = append(append(os.Environ(), "RAIL_PROXY_ADDR="+addr, "UNSAFE_NO_AUTH=true"), env...)
	stderr = &logcapture.Buffer{}
	cmd.Stderr = stderr
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	url = "http://" + addr
	waitLive(t, url)
	return url, stderr, cmd.Process.Pid
}

// waitLive waits up to 20 s for a rail-proxy process at url to answer /livez 200.
func waitLive(t testing.TB, url string) {
	t.Helper()
	testkit.WaitHTTP(t, pollHTTP, 20*time.Second, url+"/livez", http.StatusOK)
}
