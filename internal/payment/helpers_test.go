package payment_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/identity"
	"lock.dev/internal/logcapture"
	"lock.dev/internal/payment"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// TestMain checks every exchange of the tests with a payment-resource against
// api/payment-resource.json: the tests' clients are http.DefaultClient (so its
// transport is wrapped here, before any test runs) and each env's
// payment.Client. After the tests it fails the run on a finding no test was
// told of and on a documented answer no test provoked (conformance_test.go).
func TestMain(m *testing.M) {
	http.DefaultClient.Transport = conformance.TrackedRoundTripper(http.DefaultTransport)
	os.Exit(conformance.Finish(pgtest.Main(m), exempt...))
}

// syncBuffer collects the service's log lines.
type syncBuffer struct{ logcapture.Buffer }

// lines returns the parsed log lines whose event is event.
func (s *syncBuffer) events(t testing.TB, event string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", sc.Text())
		}
		if m["event"] == event {
			out = append(out, m)
		}
	}
	return out
}

// env is one payment-resource served by Run over real HTTP on its own paydb.
type env struct {
	base   string
	client *payment.Client
	db     *pgxpool.Pool
	dbURL  string
	logs   *syncBuffer
	// hc sends raw requests and probes readiness: http.DefaultClient, or with
	// identities ops's mutual-TLS client (a reader, as any workload needs a
	// certificate from the bundle for /readyz and /metrics).
	hc *http.Client
	// certs is the directory of the workloads' SVIDs with identities, else "".
	certs string
	// creator creates payouts (create): client, or with identities the
	// payout creator's client (the executor may not create).
	creator *payment.Client
}

// start runs payment-resource on a fresh migrated paydb, on a port-0 listener,
// and waits until it is ready. The server is stopped, and must return nil, when
// the test ends.
func start(t testing.TB, opts ...func(*payment.Config)) *env {
	t.Helper()
	return startOn(t, pgtest.PaydbURL(t), opts...)
}

// booksUnchecked turns PAYMENT_BOOKS_CHECK off, for a test about something else
// whose payouts never went to the rail: it posts outcomes no audit row records,
// or settles with no statement copy. books_test.go tests the check, on.
func booksUnchecked(c *payment.Config) { c.BooksCheck = false }

func startOn(t testing.TB, dbURL string, opts ...func(*payment.Config)) *env {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	cfg := payment.DefaultConfig()
	cfg.PaydbURL = dbURL
	cfg.UnsafeNonDurableDB = true // the test cluster runs with fsync off
	cfg.Listener = ln
	cfg.LogOutput = logs
	cfg.LogLevel = "debug"
	// The tests are about payouts, not identity (docs/contracts/workload-identity.md):
	// plaintext, every caller believed. withIdentities serves mutual TLS instead.
	cfg.Identity = identity.Settings{UnsafeNoAuth: true}
	for _, o := range opts {
		o(&cfg)
	}
	scheme := "http://"
	if cfg.Identity.Enabled() {
		scheme = "https://"
	}
	if _, bench := t.(*testing.B); !bench {
		// The exchanges with this server are checked against the OpenAPI
		// document, and its findings fail t. Registered before the cleanup that
		// stops the server, so it runs after it.
		conformance.Track(t, scheme+ln.Addr().String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- payment.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel, want nil", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("Run did not return after cancel")
		}
	})
	e := &env{base: scheme + ln.Addr().String(), dbURL: dbURL, logs: logs, hc: http.DefaultClient}
	if cfg.Identity.Enabled() {
		e.certs = filepath.Dir(cfg.Identity.CAFile)
		e.hc = e.httpAs(t, identity.NameOps)
		e.client = e.as(t, identity.NameExecutor)
		e.creator = e.as(t, identity.NamePayoutCreator)
	} else {
		e.client = payment.NewClient(e.base)
		e.client.HTTP.Transport = conformance.TrackedRoundTripper(e.client.HTTP.Transport)
		e.creator = e.client
	}
	e.db = pgtest.Pool(t, dbURL)
	testkit.EventuallyState(t, 15*time.Second, "payment-resource to be ready", func() (bool, string) {
		select {
		case err := <-done:
			t.Fatalf("Run returned before ready: %v\nlogs:\n%s", err, logs.String())
		default:
		}
		code, _ := e.readyz(t)
		return code == http.StatusOK, fmt.Sprintf("readyz %d\nlogs:\n%s", code, logs.String())
	})
	return e
}

func (e *env) readyz(t testing.TB) (int, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.base+"/readyz", nil)
	resp, err := e.hc.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

// raw sends one request as given and returns the status and body.
func (e *env) raw(t testing.TB, method, path string, header map[string][]string, body string) (int, []byte) {
	t.Helper()
	status, b, err := e.tryRaw(method, path, header, body)
	if err != nil {
		t.Fatal(err)
	}
	return status, b
}

// tryRaw is raw for goroutines other than the test's: it reports a failure to
// send instead of ending the test (t.Fatal belongs to the test's goroutine).
func (e *env) tryRaw(method, path string, header map[string][]string, body string) (int, []byte, error) {
	return e.tryRawWith(e.hc, method, path, header, body)
}

// tryRawWith is tryRaw sending with hc (a workload's client: httpAs).
func (e *env) tryRawWith(hc *http.Client, method, path string, header map[string][]string, body string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, nil
}

// writeCerts writes SVIDs of the default workloads and of extra names, with
// their CA, into a directory of the test's, and returns it.
func writeCerts(t testing.TB, extra ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: dir, Names: append(identity.DefaultNames(), extra...)}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// withIdentities serves mutual TLS with payment-resource's SVID from certs
// (writeCerts) and verifies grants with keysFile: the set-up of a test about
// identity. The env's client is then the executor's.
func withIdentities(certs, keysFile string) func(*payment.Config) {
	return func(c *payment.Config) {
		c.Identity = identity.Files(certs, identity.NamePaymentResource)
		c.GrantKeysFile = keysFile
	}
}

// tlsAs is the client TLS configuration of workload name (its SVID in e.certs)
// expecting payment-resource's SVID.
func (e *env) tlsAs(t testing.TB, name string) *tls.Config {
	t.Helper()
	src, err := identity.Load(identity.Files(e.certs, name), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return src.ClientConfig(spiffeid.RequireFromSegments(src.TrustDomain(), identity.NamePaymentResource))
}

// as is a payment client calling as workload name over mutual TLS, its
// exchanges checked against the document.
func (e *env) as(t testing.TB, name string) *payment.Client {
	t.Helper()
	c := payment.NewTLSClient(e.base, e.tlsAs(t, name))
	c.HTTP.Transport = conformance.TrackedRoundTripper(c.HTTP.Transport)
	t.Cleanup(c.HTTP.CloseIdleConnections)
	return c
}

// httpAs is a plain HTTP client calling as workload name, for raw requests.
func (e *env) httpAs(t testing.TB, name string) *http.Client {
	t.Helper()
	return e.as(t, name).HTTP
}

func (e *env) create(t testing.TB, id, account string, amount int64) lockapi.Payout {
	t.Helper()
	p, err := e.creator.Create(context.Background(), lockapi.SubmissionRequest{
		PayoutID: id, AccountID: account, AmountMinor: amount, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"})
	if err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	return p
}

func (e *env) claim(t testing.TB, id string, token int64, owner string) lockapi.Payout {
	t.Helper()
	p, err := e.client.Claim(context.Background(), id, token, owner)
	if err != nil {
		t.Fatalf("claim %s with %d by %s: %v", id, token, owner, err)
	}
	return p
}

// metric reads one sample from /metrics, e.g. metric(t, `payout_transition_total{to="paid"}`).
func (e *env) metric(t testing.TB, series string) float64 {
	t.Helper()
	_, b := e.raw(t, http.MethodGet, "/metrics", nil, "")
	fams, err := testkit.ParseMetrics(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	v, ok, err := fams.Lookup(series)
	if err != nil || !ok {
		t.Fatalf("metric %s not exposed (%v)", series, err)
	}
	return v
}

func (e *env) queryInt(t testing.TB, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := e.db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (e *env) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := e.db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// snapshot renders both of payment-resource's tables, to show that nothing was written.
func (e *env) snapshot(t testing.TB) string {
	t.Helper()
	var s string
	err := e.db.QueryRow(context.Background(), `SELECT
	  coalesce((SELECT string_agg(row_to_json(p)::text, E'\n' ORDER BY payout_id) FROM payout p), '') || E'\n--\n' ||
	  coalesce((SELECT string_agg(row_to_json(l)::text, E'\n' ORDER BY entry_id) FROM ledger_entry l), '')`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// asProblem returns err's problem, failing the test when err is not one with code.
func asProblem(t testing.TB, err error, status int, code string) *lockapi.Problem {
	t.Helper()
	p, perr := problemIs(err, status, code)
	if perr != nil {
		t.Fatal(perr)
	}
	return p
}

// problemIs is asProblem for goroutines other than the test's.
func problemIs(err error, status int, code string) (*lockapi.Problem, error) {
	var p *lockapi.Problem
	if !errors.As(err, &p) {
		return nil, fmt.Errorf("err = %v, want a %d %s problem", err, status, code)
	}
	if p.Status != status || p.Code != code {
		return nil, fmt.Errorf("problem = %d %s (%s), want %d %s", p.Status, p.Code, p.Detail, status, code)
	}
	return p, nil
}

func member[T any](t testing.TB, p *lockapi.Problem, name string) T {
	t.Helper()
	v, err := memberOf[T](p, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// memberOf is member for goroutines other than the test's.
func memberOf[T any](p *lockapi.Problem, name string) (T, error) {
	var v T
	ok, err := p.Member(name, &v)
	if !ok || err != nil {
		return v, fmt.Errorf("problem %s: member %s missing or unreadable (%v)", p.Code, name, err)
	}
	return v, nil
}

func ptr[T any](v T) *T { return &v }
