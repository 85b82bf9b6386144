package reconcile_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/internal/identity"
	"lock.dev/internal/logcapture"
	"lock.dev/internal/payment"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/railproxy"
	"lock.dev/internal/railstub"
	"lock.dev/internal/reconcile"
	"lock.dev/internal/stack"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

func TestMain(m *testing.M) {
	// The crashed rail-proxy of the end-to-end test is this binary started again.
	stack.ChildMain(nil)
	os.Exit(pgtest.Main(m))
}

// env is the whole system on fresh databases, and the settings of a reconciler
// pointed at it.
type env struct {
	st *stack.Stack
	// creator creates payouts as the payout-creator workload; payments claims,
	// posts and reads them as the executor workload, and locks takes leases as
	// it (plaintext on a stack without identities).
	creator  *payment.Client
	payments *payment.Client
	locks    *lockclient.Client
	// rail pays at the rail-stub directly, as the rail-proxy workload (the
	// only one the rail takes payments from): a call that bypassed the books.
	rail *railstub.Client
	logs *logcapture.Buffer // the reconciler passes' log
	cfg  reconcile.Config
}

func newEnv(t testing.TB, opts stack.Options) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if opts.PaydbURL == "" {
		opts.PaydbURL = pgtest.PaydbURL(t)
	}
	if opts.LockdbURL == "" {
		opts.LockdbURL = pgtest.LockdbURL(t)
	}
	// payment-resource takes a NOT_PRESENTED settle only once the statement was
	// read past the attempt plus its own window; a deployment sets it as the
	// reconciler's. These tests' reconcilers use 1 s or more (e.cfg.SettleAfter,
	// RECONCILER_SETTLE_AFTER), so a window of 1 s never refuses their settles.
	if _, ok := opts.Env["payment-resource"]["PAYMENT_SETTLE_AFTER"]; !ok {
		env := maps.Clone(opts.Env)
		if env == nil {
			env = map[string]map[string]string{}
		}
		pr := maps.Clone(env["payment-resource"])
		if pr == nil {
			pr = map[string]string{}
		}
		pr["PAYMENT_SETTLE_AFTER"] = "1s"
		env["payment-resource"] = pr
		opts.Env = env
	}
	st, err := stack.Start(ctx, opts)
	if err != nil {
		t.Fatalf("start the system: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("stop the system: %v", err)
		}
	})
	locks, err := lockclient.New(st.LockServerURL, lockclient.WithTLSConfig(st.ClientTLS(identity.NameExecutor, identity.NameLockServer)))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{st: st, logs: &logcapture.Buffer{},
		creator:  payment.NewTLSClient(st.PaymentURL, st.ClientTLS(identity.NamePayoutCreator, identity.NamePaymentResource)),
		payments: payment.NewTLSClient(st.PaymentURL, st.ClientTLS(identity.NameExecutor, identity.NamePaymentResource)),
		locks:    locks,
		rail:     railstub.NewTLSClient(st.StubURL, st.ClientTLS(identity.NameRailProxy, identity.NameRailStub))}
	e.cfg = reconcile.DefaultConfig()
	// The passes run as the reconciler workload: its SVID, or UNSAFE_NO_AUTH on
	// a stack without identities.
	e.cfg.Identity = e.workload(identity.NameReconciler)
	e.cfg.PaydbURL, e.cfg.RailProxyURL, e.cfg.PaymentResourceURL = st.PaydbURL, st.ProxyURL, st.PaymentURL
	e.cfg.SettleToken = st.SettleToken
	e.cfg.SettleAfter = time.Second
	e.cfg.LogLevel = "debug"
	e.cfg.LogOutput = e.logs
	return e
}

// pass runs one reconciler pass and fails the test on an error.
func (e *env) pass(t testing.TB) reconcile.PassReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := reconcile.Pass(ctx, e.cfg)
	if err != nil {
		t.Fatalf("pass: %v\nlog:\n%s", err, e.logs.String())
	}
	if rep.Skipped {
		t.Fatal("pass skipped: nothing else holds the pass lock in this test")
	}
	return rep
}

// waitWindow waits until paydb's clock is past every attempt's submitted_at (and
// every payout's updated_at) plus the settle window, so the next pass may settle
// NOT_PRESENTED and judge PAID_WITHOUT_LINE.
func (e *env) waitWindow(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	var last time.Time
	if err := e.st.Paydb.QueryRow(ctx, `SELECT greatest(
		(SELECT coalesce(max(submitted_at), '-infinity') FROM rail_submission),
		(SELECT coalesce(max(updated_at), '-infinity') FROM payout))`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, e.cfg.SettleAfter+time.Minute, "paydb's clock to pass the settle window", func() bool {
		var now time.Time
		if err := e.st.Paydb.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now.After(last.Add(e.cfg.SettleAfter))
	})
}

// submit posts a submission to a rail-proxy as an executor does (as the
// executor workload, with lease's token and grant); it returns the status and
// the decoded body.
func (e *env) submit(t testing.TB, proxyURL string, p lockapi.SubmissionRequest, lease *lockclient.Lease, owner string) (int, map[string]any) {
	t.Helper()
	token := lease.Token()
	body, _ := json.Marshal(p)
	req, _ := http.NewRequest(http.MethodPost, proxyURL+"/v1/rail/submissions", io.NopCloser(bytes.NewReader(body)))
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(lockapi.HeaderFencingToken, strconv.FormatInt(token, 10))
	req.Header.Set(lockapi.HeaderOwnerID, owner)
	req.Header.Set(lockapi.HeaderIdempotencyKey, fmt.Sprintf("%s:%d", p.PayoutID, token))
	if g := lease.Grant(); g != "" {
		req.Header.Set(lockapi.HeaderFencingGrant, g)
	}
	resp, err := e.st.HTTPClient(identity.NameExecutor, identity.NameRailProxy).Do(req)
	if err != nil {
		t.Fatalf("submit %s: %v", p.PayoutID, err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

func payoutReq(id, account string, amount int64) lockapi.SubmissionRequest {
	return lockapi.SubmissionRequest{PayoutID: id, AccountID: account, AmountMinor: amount, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}
}

// drive takes a payout through one executor cycle by hand, through the rail-proxy
// at proxyURL: create, lease, claim, submit, post what the proxy said (200 PAID,
// 422 DECLINED, 409 RAIL_AMBIGUOUS AMBIGUOUS), release. It returns the status posted.
func (e *env) drive(t testing.TB, proxyURL string, p lockapi.SubmissionRequest) string {
	t.Helper()
	ctx := context.Background()
	if _, err := e.creator.Create(ctx, p); err != nil {
		t.Fatalf("create %s: %v", p.PayoutID, err)
	}
	const owner = "test-driver"
	lease, err := e.locks.Acquire(ctx, lockapi.AccountLockName(p.AccountID), owner, 30*time.Second)
	if err != nil {
		t.Fatalf("lease %s: %v", p.AccountID, err)
	}
	defer func() { _ = lease.Release(ctx) }()
	token, grant := lease.Token(), lease.Grant()
	if _, err := e.payments.ClaimWithGrant(ctx, p.PayoutID, token, grant, owner); err != nil {
		t.Fatalf("claim %s: %v", p.PayoutID, err)
	}
	status, body := e.submit(t, proxyURL, p, lease, owner)
	var post lockapi.PostRequest
	switch {
	case status == http.StatusOK:
		ref, _ := body["railReference"].(string)
		post = lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: &ref}
	case status == http.StatusUnprocessableEntity:
		var reason *string
		if r, ok := body["declineReason"].(string); ok {
			reason = &r
		}
		post = lockapi.PostRequest{Outcome: lockapi.StatusDeclined, DeclineReason: reason}
	case status == http.StatusConflict && body["code"] == lockapi.CodeRailAmbiguous:
		post = lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous}
	default:
		t.Fatalf("submit %s: %d %v", p.PayoutID, status, body)
	}
	if _, err := e.payments.PostWithGrant(ctx, p.PayoutID, token, grant, owner, post); err != nil {
		t.Fatalf("post %s %s: %v", p.PayoutID, post.Outcome, err)
	}
	return post.Outcome
}

// chaos sets the rail-stub's knobs.
func (e *env) chaos(t testing.TB, latencyMs int, decline, drop float64) {
	t.Helper()
	if _, err := e.st.Stub.SetChaos(context.Background(), latencyMs, decline, drop, nil); err != nil {
		t.Fatal(err)
	}
}

// status reads a payout's status from paydb.
func (e *env) status(t testing.TB, id string) string {
	t.Helper()
	var s string
	if err := e.st.Paydb.QueryRow(context.Background(), `SELECT status FROM payout WHERE payout_id = $1`, id).Scan(&s); err != nil {
		t.Fatalf("status of %s: %v", id, err)
	}
	return s
}

func (e *env) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := e.st.Paydb.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// exceptions lists the recorded exceptions as "KIND payout seq".
func (e *env) exceptions(t testing.TB) []string {
	t.Helper()
	return e.texts(t, `SELECT kind || ' ' || coalesce(payout_id, '-') || ' ' || coalesce(seq::text, '-') FROM reconciliation_exception ORDER BY exception_id`)
}

// texts is query's one text column, row by row.
func (e *env) texts(t testing.TB, query string, args ...any) []string {
	t.Helper()
	rows, err := e.st.Paydb.Query(context.Background(), query, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// calls is the rail-stub's call log: the ground truth.
func (e *env) calls(t testing.TB) []railstub.Call {
	t.Helper()
	cs, err := e.st.Stub.Calls(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// blackholeProxy runs a second rail-proxy on the stack's paydb whose rail accepts
// the connection (and, with identities, completes the TLS handshake as the
// rail) and never reads a byte: every submission through it ends TIMEOUT
// (RAIL_AMBIGUOUS) while the real rail never sees it.
func (e *env) blackholeProxy(t testing.TB) string {
	t.Helper()
	rail, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	railCfg := e.railTLS(t)
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := rail.Accept()
			if err != nil {
				return
			}
			if railCfg != nil {
				tc := tls.Server(c, railCfg)
				_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
				if tc.Handshake() != nil {
					_ = c.Close()
					continue
				}
				c = tc
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	return e.runProxy(t, "blackhole rail-proxy", map[string]string{
		"RAIL_BASE_URL": e.scheme() + rail.Addr().String(), "RAIL_READ_TIMEOUT": "300ms"}, func() {
		_ = rail.Close()
		mu.Lock()
		for _, c := range held {
			_ = c.Close()
		}
		mu.Unlock()
	})
}

// liarProxy runs a second rail-proxy on the stack's paydb whose rail answers
// every payment ACCEPTED with rail reference ref and books nothing: the proxy
// records ACKED, payment-resource's books check lets PAID be posted as the audit
// trail recorded it, and the real rail's statement never shows the payment.
func (e *env) liarProxy(t testing.TB, ref string) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /rail/v1/health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("POST /rail/v1/payments", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		lockapi.WriteJSON(w, http.StatusOK, railstub.PaymentReply{Status: railstub.ResultAccepted, RailReference: ref})
	})
	rail := e.serveRail(t, mux)
	return e.runProxy(t, "lying rail-proxy", map[string]string{"RAIL_BASE_URL": rail}, nil)
}

// railTLS is the server configuration of a test's own rail: rail-stub's SVID,
// so a rail-proxy of the stack takes it for the rail; nil without identities.
func (e *env) railTLS(t testing.TB) *tls.Config {
	t.Helper()
	if !e.st.Secure() {
		return nil
	}
	src, err := e.st.Source(identity.NameRailStub)
	if err != nil {
		t.Fatal(err)
	}
	return src.ServerConfig()
}

// workload is the identity settings of workload name: its SVID's files, or
// UNSAFE_NO_AUTH on a stack without identities.
func (e *env) workload(name string) identity.Settings {
	if !e.st.Secure() {
		return identity.Settings{UnsafeNoAuth: true}
	}
	return identity.Files(e.st.CertsDir, name)
}

func (e *env) scheme() string {
	if e.st.Secure() {
		return "https://"
	}
	return "http://"
}

// serveRail serves h as a rail until the test ends (mutual TLS as rail-stub
// with identities) and returns its base URL.
func (e *env) serveRail(t testing.TB, h http.Handler) string {
	t.Helper()
	return e.serveAs(t, identity.NameRailStub, h)
}

// serveAs serves h as the workload name until the test ends (mutual TLS with
// its SVID with identities, plaintext without) and returns its base URL.
func (e *env) serveAs(t testing.TB, name string, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := e.scheme() + ln.Addr().String()
	if e.st.Secure() {
		src, err := e.st.Source(name)
		if err != nil {
			t.Fatal(err)
		}
		ln = tls.NewListener(ln, src.ServerConfig())
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return url
}

// refusedAttempt creates p, claims it under a fresh lease as an executor does,
// and presents it to rail-proxy as presented (its own fields changed): the books
// refuse it, 409 NOT_IN_BOOKS naming mismatch, and the payout stays CLAIMED.
func (e *env) refusedAttempt(t testing.TB, p, presented lockapi.SubmissionRequest, mismatch string) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.creator.Create(ctx, p); err != nil {
		t.Fatalf("create %s: %v", p.PayoutID, err)
	}
	const owner = "test-driver"
	lease, err := e.locks.Acquire(ctx, lockapi.AccountLockName(p.AccountID), owner, 30*time.Second)
	if err != nil {
		t.Fatalf("lease %s: %v", p.AccountID, err)
	}
	defer func() { _ = lease.Release(ctx) }()
	if _, err := e.payments.ClaimWithGrant(ctx, p.PayoutID, lease.Token(), lease.Grant(), owner); err != nil {
		t.Fatalf("claim %s: %v", p.PayoutID, err)
	}
	status, body := e.submit(t, e.st.ProxyURL, presented, lease, owner)
	if status != http.StatusConflict || body["code"] != lockapi.CodeNotInBooks || body["mismatch"] != mismatch {
		t.Fatalf("%s presented otherwise than booked: %d %v, want 409 %s (%s)", p.PayoutID, status, body, lockapi.CodeNotInBooks, mismatch)
	}
}

// runProxy runs a rail-proxy of the stack's kind on its paydb — its identity
// and grant key set with identities, UNSAFE_NO_AUTH without — with the settings
// of env on a free loopback port until the test ends (then stops it and runs
// after), and returns its base URL once it is live.
func (e *env) runProxy(t testing.TB, name string, env map[string]string, after func()) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	vars := e.st.WorkloadEnv(identity.NameRailProxy)
	maps.Copy(vars, e.st.GrantSettings()["rail-proxy"])
	vars["PAYDB_URL"] = e.st.PaydbURL
	vars["UNSAFE_NON_DURABLE_DB"] = "true" // the throwaway test cluster runs with fsync off
	vars["RAIL_PROXY_ADDR"] = ln.Addr().String()
	maps.Copy(vars, env)
	_, cfg, err := railproxy.ParseConfig(nil, func(k string) string { return vars[k] })
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	cfg.Listener, cfg.LogOutput = ln, io.Discard
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- railproxy.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if after != nil {
			after()
		}
	})
	url := e.scheme() + ln.Addr().String()
	testkit.WaitHTTP(t, e.st.HTTPClient(identity.NameOps, identity.NameRailProxy), 20*time.Second, url+"/livez", http.StatusOK)
	return url
}
