// Package stack runs the whole lock.dev system on one machine for tests and
// lockdemo: a throwaway PostgreSQL (or given databases), migrated, and lock-server,
// payment-resource, rail-stub and rail-proxy on free loopback ports. Services are
// configured through their environment variables (docs/contracts/configuration.md),
// exactly as an operator would.
//
// rail-proxy can run as a child process so that it can be crashed (SIGKILL: no
// drain, no resolving writes) and restarted on the same port. A program that uses
// children calls ChildMain first thing in main (or TestMain): the child is this
// same binary started again with LOCKDEV_STACK_CHILD set.
package stack

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/identity"
	"lock.dev/internal/lockdb"
	"lock.dev/internal/lockserver"
	"lock.dev/internal/paydb"
	"lock.dev/internal/payment"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/railproxy"
	"lock.dev/internal/railstub"
	"lock.dev/internal/testkit"
)

// Options shape the system.
type Options struct {
	// PaydbURL and LockdbURL name existing, migrated-or-empty databases; when both
	// are empty a throwaway cluster is started and both databases created on it.
	// A URL may name several hosts (a pgcluster.Pair's URL): the services follow
	// the primary. Services on a database whose fsync is off (every throwaway
	// cluster) get UNSAFE_NON_DURABLE_DB=true unless Env says otherwise.
	PaydbURL, LockdbURL string
	// Replicated, when set and no URL is given, starts paydb and lockdb on a
	// primary and a streaming standby (pgcluster.StartPair) instead of a single
	// throwaway cluster; the services are given the pair's multi-host URLs (both
	// servers, target_session_attrs=read-write), so they follow a promotion
	// without a restart. HoldStandby, KillPrimary, Promote and Failover (failover.go)
	// act on it while the services run. Like every throwaway cluster the pair runs
	// with fsync off (see failover.go for why that does not weaken what a failover
	// test proves).
	Replicated *pgcluster.PairOptions
	// ProxyAsChild runs rail-proxy as a child process (needed for CrashProxy).
	ProxyAsChild bool
	// Tap puts a recording reverse proxy in front of lock-server,
	// payment-resource and rail-proxy (tap.go): ServiceURLs then names the taps,
	// which record every token lock-server answers an acquire with and every
	// answer's status, for the invariant checker and a failover's report.
	Tap bool
	// UnsafeNoAuth runs every service plaintext with UNSAFE_NO_AUTH=true: no
	// certificates, http URLs, and no grants unless Env brings GrantEnv's settings.
	// For tests about something else than identity
	// (docs/contracts/workload-identity.md).
	UnsafeNoAuth bool
	// Workloads are further workload names the certificate set holds SVIDs for,
	// besides identity.DefaultNames (e.g. a second executor identity, for tests
	// that name two holders in the role settings).
	Workloads []string
	// Env adds or overrides settings (the variable names of
	// docs/contracts/configuration.md) per service: "rail-proxy", "rail-stub",
	// "lock-server", "payment-resource", "reconciler". Without UnsafeNoAuth every
	// service is given its SVID's files and the grant settings first, so Env can
	// override them.
	Env map[string]map[string]string
	// Log receives every service's JSON log lines; nil discards them.
	Log io.Writer
	// RailProtocol is the language rail-proxy and rail-stub speak: RailStub
	// ("" too, the services' default) or RailISO20022 — RAIL_STUB_PROTOCOL on
	// rail-stub, RAIL_PROTOCOL on rail-proxy and PAYMENT_RAIL_PROFILE on
	// payment-resource (docs/contracts/iso20022.md). Env may override each.
	RailProtocol string
	// StatementSource is where the reconcilers the stack starts read the rail's
	// statement: StatementProxy ("" too, the default: rail-proxy's statement
	// route) or StatementDir — rail-stub writes its accepted calls as camt.053
	// files to StatementDir (RAIL_STUB_STATEMENT_DIR, one every
	// StatementEvery) and the reconcilers import them from there
	// (RECONCILER_STATEMENT_SOURCE=dir, RECONCILER_STATEMENT_DIR;
	// docs/contracts/reconciliation.md).
	StatementSource string
}

// The values of Options.RailProtocol and Options.StatementSource.
const (
	RailStub       = "stub"
	RailISO20022   = "iso20022"
	StatementProxy = "proxy"
	StatementDir   = "dir"
)

// StatementEvery is RAIL_STUB_STATEMENT_EVERY with StatementSource dir: short,
// so a run's accepted calls reach the books within a second (the services'
// default is 5 s).
const StatementEvery = 500 * time.Millisecond

// Stack is a running system.
type Stack struct {
	opts    Options
	cluster *pgcluster.Cluster
	pair    *pgcluster.Pair // Options.Replicated
	taps    *taps           // Options.Tap

	PaydbURL, LockdbURL string
	Paydb, Lockdb       *pgxpool.Pool

	// unsafe holds UNSAFE_NON_DURABLE_DB=true for the services of a database
	// whose fsync is off, by database ("paydb", "lockdb").
	unsafe map[string]map[string]string

	LockServerURL, PaymentURL, ProxyURL, StubURL string
	// Stub talks to rail-stub as the ops workload (it may read the call log and
	// steer the chaos).
	Stub *railstub.Client
	// CertsDir holds the throwaway certificate set (identity.WriteCerts: ca.pem and
	// {name}.pem/{name}.key for every default name); empty with UnsafeNoAuth.
	// identity.Files(CertsDir, name) are a workload's settings.
	CertsDir string
	// GrantsDir holds the grant key pair (GrantEnv); empty with UnsafeNoAuth.
	GrantsDir string
	// StatementDir is the directory rail-stub writes its camt.053 statement
	// files to and the reconcilers import them from, with Options.StatementSource
	// dir; else empty.
	StatementDir string

	tmp     string                        // removed by Close
	grants  map[string]map[string]string  // GrantEnv's settings, without UnsafeNoAuth
	sources map[string]*identity.Source   // by workload name, loaded on first use (mu)
	clients map[[2]string]*http.Transport // by caller and peer (mu)
	// SettleToken is payment-resource's PAYMENT_SETTLE_TOKEN, drawn at Start
	// (unless Options.Env sets it), which the reconcilers are given.
	SettleToken string

	mu        sync.Mutex
	proxyAddr string
	proxy     stopper
	services  []stopper // in start order; stopped in reverse

	reconcilers []stopper // stopped first (reconciler.go)
}

type stopper interface{ stop() error }

// Start brings the system up and returns when every service is ready.
func Start(ctx context.Context, opts Options) (s *Stack, err error) {
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	st := &Stack{opts: opts}
	s = st
	defer func() {
		if err != nil {
			// s is nil on the error returns; close what was started through st.
			_ = st.Close()
		}
	}()
	if err := opts.checkRail(); err != nil {
		return nil, err
	}
	if err := s.databases(ctx); err != nil {
		return nil, err
	}
	if err := s.identities(); err != nil {
		return nil, err
	}
	if err := s.statementDir(); err != nil {
		return nil, err
	}

	stub, err := s.startInProcess(ctx, "rail-stub", "RAIL_STUB_ADDR", nil, func(ctx context.Context, ln net.Listener, getenv func(string) string) error {
		_, cfg, err := railstub.ParseConfig(nil, getenv)
		if err != nil {
			return err
		}
		cfg.Listener, cfg.LogOutput = ln, opts.Log
		return railstub.Run(ctx, cfg)
	})
	if err != nil {
		return nil, err
	}
	s.StubURL = stub.url
	s.Stub = railstub.NewTLSClient(s.StubURL, s.ClientTLS(identity.NameOps, identity.NameRailStub))

	ls, err := s.startInProcess(ctx, "lock-server", "LOCK_SERVER_ADDR", s.withUnsafe("lockdb", map[string]string{"LOCKDB_URL": s.LockdbURL}),
		func(ctx context.Context, ln net.Listener, getenv func(string) string) error {
			_, cfg, err := lockserver.ParseConfig(nil, getenv)
			if err != nil {
				return err
			}
			cfg.Listener, cfg.LogOutput = ln, opts.Log
			return lockserver.Run(ctx, cfg)
		})
	if err != nil {
		return nil, err
	}
	s.LockServerURL = ls.url

	s.SettleToken = "stack-" + rand.Text()
	if v, ok := opts.Env["payment-resource"]["PAYMENT_SETTLE_TOKEN"]; ok {
		s.SettleToken = v
	}
	pr, err := s.startInProcess(ctx, "payment-resource", "PAYMENT_RESOURCE_ADDR", s.withUnsafe("paydb", map[string]string{"PAYDB_URL": s.PaydbURL, "PAYMENT_SETTLE_TOKEN": s.SettleToken}),
		func(ctx context.Context, ln net.Listener, getenv func(string) string) error {
			_, cfg, err := payment.ParseConfig(nil, getenv)
			if err != nil {
				return err
			}
			cfg.Listener, cfg.LogOutput = ln, opts.Log
			return payment.Run(ctx, cfg)
		})
	if err != nil {
		return nil, err
	}
	s.PaymentURL = pr.url

	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s.proxyAddr = fmt.Sprintf("127.0.0.1:%d", port)
	s.ProxyURL = s.scheme() + s.proxyAddr
	if err := s.startProxy(ctx); err != nil {
		return nil, err
	}
	if opts.Tap {
		if s.taps, err = startTaps(s, map[string]string{
			"lock-server": s.LockServerURL, "payment-resource": s.PaymentURL, "rail-proxy": s.ProxyURL,
		}); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Stack) databases(ctx context.Context) error {
	if s.opts.PaydbURL == "" && s.opts.LockdbURL == "" && s.opts.Replicated != nil {
		p, err := pgcluster.StartPair(ctx, *s.opts.Replicated)
		if err != nil {
			return err
		}
		s.pair = p
		for _, db := range []string{"paydb", "lockdb"} {
			if err := p.CreateDatabase(ctx, db, ""); err != nil {
				return err
			}
		}
		s.PaydbURL, s.LockdbURL = p.URL("paydb"), p.URL("lockdb")
	} else if s.opts.PaydbURL == "" && s.opts.LockdbURL == "" {
		c, err := pgcluster.Start(ctx, pgcluster.Options{})
		if err != nil {
			return err
		}
		s.cluster = c
		for _, db := range []string{"paydb", "lockdb"} {
			if err := c.CreateDatabase(ctx, db, ""); err != nil {
				return err
			}
		}
		s.PaydbURL, s.LockdbURL = c.URL("paydb"), c.URL("lockdb")
	} else {
		s.PaydbURL, s.LockdbURL = s.opts.PaydbURL, s.opts.LockdbURL
		if s.PaydbURL == "" || s.LockdbURL == "" {
			return errors.New("stack: give both PaydbURL and LockdbURL, or neither")
		}
	}
	var err error
	if s.Paydb, err = dbconn.Open(ctx, s.PaydbURL, 10); err != nil {
		return err
	}
	if s.Lockdb, err = dbconn.Open(ctx, s.LockdbURL, 10); err != nil {
		return err
	}
	if _, err := paydb.Tree().Migrate(ctx, s.Paydb, nil); err != nil {
		return err
	}
	if _, err := lockdb.Tree().Migrate(ctx, s.Lockdb, nil); err != nil {
		return err
	}
	s.unsafe = map[string]map[string]string{}
	for db, pool := range map[string]*pgxpool.Pool{"paydb": s.Paydb, "lockdb": s.Lockdb} {
		var fsync string
		if err := pool.QueryRow(ctx, "SELECT current_setting('fsync')").Scan(&fsync); err != nil {
			return fmt.Errorf("stack: %s: reading fsync: %w", db, err)
		}
		if fsync != "on" {
			s.unsafe[db] = map[string]string{"UNSAFE_NON_DURABLE_DB": "true"}
		}
	}
	return nil
}

// withUnsafe adds UNSAFE_NON_DURABLE_DB=true to base when db has fsync off: the
// services refuse such a database otherwise (docs/contracts/configuration.md).
func (s *Stack) withUnsafe(db string, base map[string]string) map[string]string {
	maps.Copy(base, s.unsafe[db])
	return base
}

// env merges base settings with the caller's overrides for service.
func (s *Stack) env(service string, base map[string]string) map[string]string {
	m := map[string]string{"LOG_LEVEL": "info"}
	maps.Copy(m, s.WorkloadEnv(service))
	maps.Copy(m, s.grants[service])
	maps.Copy(m, s.railEnv(service))
	maps.Copy(m, base)
	maps.Copy(m, s.opts.Env[service])
	return m
}

func (s *Stack) proxyEnv() map[string]string {
	return s.env("rail-proxy", s.withUnsafe("paydb", map[string]string{
		"PAYDB_URL":       s.PaydbURL,
		"RAIL_BASE_URL":   s.StubURL,
		"RAIL_PROXY_ADDR": s.proxyAddr,
	}))
}

func (s *Stack) startProxy(ctx context.Context) error {
	env := s.proxyEnv()
	var (
		p   stopper
		err error
	)
	if s.opts.ProxyAsChild {
		p, err = startChild("rail-proxy", env, s.opts.Log)
	} else {
		var ln net.Listener
		ln, err = net.Listen("tcp", s.proxyAddr)
		if err != nil {
			return fmt.Errorf("stack: rail-proxy listen: %w", err)
		}
		p, err = runInProcess("rail-proxy", ln, env, s.opts.Log, runProxy)
	}
	if err != nil {
		return err
	}
	if err := waitReady(ctx, s.ProxyURL, s.HTTPClient(identity.NameOps, identity.NameRailProxy)); err != nil {
		_ = p.stop()
		return fmt.Errorf("stack: rail-proxy: %w", err)
	}
	s.mu.Lock()
	s.proxy = p
	s.mu.Unlock()
	return nil
}

func runProxy(ctx context.Context, ln net.Listener, getenv func(string) string, log io.Writer) error {
	_, cfg, err := railproxy.ParseConfig(nil, getenv)
	if err != nil {
		return err
	}
	cfg.Listener, cfg.LogOutput = ln, log
	return railproxy.Run(ctx, cfg)
}

// CrashProxy kills the rail-proxy child with SIGKILL — in-flight submissions are
// abandoned mid-way, exactly as a crash leaves them — and starts a new one on the
// same address. It needs Options.ProxyAsChild.
func (s *Stack) CrashProxy(ctx context.Context) error {
	s.mu.Lock()
	c, ok := s.proxy.(*Child)
	s.mu.Unlock()
	if !ok {
		return errors.New("stack: CrashProxy needs ProxyAsChild")
	}
	c.kill()
	return s.startProxy(ctx)
}

// Close stops every service, closes the pools and removes a throwaway cluster.
func (s *Stack) Close() error {
	var errs []error
	for i := len(s.reconcilers) - 1; i >= 0; i-- {
		errs = append(errs, s.reconcilers[i].stop())
	}
	s.mu.Lock()
	p := s.proxy
	s.proxy = nil
	s.mu.Unlock()
	if p != nil {
		errs = append(errs, p.stop())
	}
	for i := len(s.services) - 1; i >= 0; i-- {
		errs = append(errs, s.services[i].stop())
	}
	if s.taps != nil {
		errs = append(errs, s.taps.close())
	}
	if s.Paydb != nil {
		s.Paydb.Close()
	}
	if s.Lockdb != nil {
		s.Lockdb.Close()
	}
	if s.cluster != nil {
		errs = append(errs, s.cluster.Stop())
	}
	if s.pair != nil {
		s.pair.ReleaseStandby() // a held standby would hold nothing now, but Stop must reach it
		errs = append(errs, s.pair.Stop())
	}
	s.mu.Lock()
	for _, tr := range s.clients {
		tr.CloseIdleConnections()
	}
	s.mu.Unlock()
	if s.tmp != "" {
		errs = append(errs, os.RemoveAll(s.tmp))
	}
	return errors.Join(errs...)
}

type runFunc func(ctx context.Context, ln net.Listener, getenv func(string) string, log io.Writer) error

type started struct {
	stopper
	url string
}

func (s *Stack) startInProcess(ctx context.Context, service, addrVar string, base map[string]string,
	run func(ctx context.Context, ln net.Listener, getenv func(string) string) error) (started, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return started{}, fmt.Errorf("stack: %s listen: %w", service, err)
	}
	env := s.env(service, base)
	env[addrVar] = ln.Addr().String()
	p, err := runInProcess(service, ln, env, s.opts.Log, func(ctx context.Context, ln net.Listener, getenv func(string) string, _ io.Writer) error {
		return run(ctx, ln, getenv)
	})
	if err != nil {
		return started{}, err
	}
	s.services = append(s.services, p)
	url := s.scheme() + ln.Addr().String()
	if err := waitReady(ctx, url, s.HTTPClient(identity.NameOps, service)); err != nil {
		return started{}, fmt.Errorf("stack: %s: %w", service, err)
	}
	return started{stopper: p, url: url}, nil
}

// inProcess is a service running in a goroutine of this process.
type inProcess struct {
	name   string
	cancel context.CancelFunc
	done   chan error
}

func runInProcess(name string, ln net.Listener, env map[string]string, log io.Writer, run runFunc) (*inProcess, error) {
	ctx, cancel := context.WithCancel(context.Background())
	p := &inProcess{name: name, cancel: cancel, done: make(chan error, 1)}
	getenv := func(k string) string { return env[k] }
	go func() { p.done <- run(ctx, ln, getenv, log) }()
	// A service that fails at start-up (bad setting, schema behind) returns at once.
	select {
	case err := <-p.done:
		cancel()
		return nil, fmt.Errorf("stack: %s exited at start-up: %w", name, err)
	case <-time.After(20 * time.Millisecond):
	}
	return p, nil
}

func (p *inProcess) stop() error {
	p.cancel()
	select {
	case err := <-p.done:
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		return nil
	case <-time.After(15 * time.Second):
		return fmt.Errorf("%s: did not stop within 15s", p.name)
	}
}

// waitReady polls url/readyz through client (on the main listener: with
// identities on, any workload of the bundle may read it) until it answers 200.
func waitReady(ctx context.Context, url string, client *http.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last error
	for {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, url+"/readyz", nil)
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				rcancel()
				return nil
			}
			err = fmt.Errorf("readyz answered %d", resp.StatusCode)
		}
		rcancel()
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("stack: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// identities writes the throwaway certificate set and grant key pair, unless
// Options.UnsafeNoAuth.
func (s *Stack) identities() error {
	if s.opts.UnsafeNoAuth {
		return nil
	}
	tmp, err := s.tempDir()
	if err != nil {
		return fmt.Errorf("stack: identities: %w", err)
	}
	s.CertsDir, s.GrantsDir = filepath.Join(tmp, "certs"), filepath.Join(tmp, "grants")
	names := append(identity.DefaultNames(), s.opts.Workloads...)
	if err := identity.WriteCerts(identity.CertsOptions{Dir: s.CertsDir, Names: names}); err != nil {
		return fmt.Errorf("stack: certificates: %w", err)
	}
	if err := os.Mkdir(s.GrantsDir, 0o700); err != nil {
		return fmt.Errorf("stack: grant keys: %w", err)
	}
	if s.grants, err = GrantEnv(s.GrantsDir); err != nil {
		return fmt.Errorf("stack: grant keys: %w", err)
	}
	return nil
}

// Secure reports whether the stack runs with identities (not Options.UnsafeNoAuth).
func (s *Stack) Secure() bool { return !s.opts.UnsafeNoAuth }

func (s *Stack) scheme() string {
	if s.opts.UnsafeNoAuth {
		return "http://"
	}
	return "https://"
}

// WorkloadEnv is the identity settings of the workload name (one of
// identity.DefaultNames): its SVID's files TLS_CERT_FILE, TLS_KEY_FILE and
// TLS_CA_FILE; with Options.UnsafeNoAuth, UNSAFE_NO_AUTH=true. An executor the
// test starts takes these with ServiceURLs.
func (s *Stack) WorkloadEnv(name string) map[string]string {
	if s.opts.UnsafeNoAuth {
		return map[string]string{"UNSAFE_NO_AUTH": "true"}
	}
	f := identity.Files(s.CertsDir, name)
	return map[string]string{"TLS_CERT_FILE": f.CertFile, "TLS_KEY_FILE": f.KeyFile, "TLS_CA_FILE": f.CAFile}
}

// GrantSettings are the grant settings the stack gave the services, by service
// (GrantEnv's); nil with Options.UnsafeNoAuth.
func (s *Stack) GrantSettings() map[string]map[string]string { return MergeEnv(s.grants) }

// Source is the identity of workload name, loaded from CertsDir once; an error
// with Options.UnsafeNoAuth.
func (s *Stack) Source(name string) (*identity.Source, error) {
	if s.opts.UnsafeNoAuth {
		return nil, errors.New("stack: no identities: the stack runs with UnsafeNoAuth")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if src, ok := s.sources[name]; ok {
		return src, nil
	}
	src, err := identity.Load(identity.Files(s.CertsDir, name), slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, fmt.Errorf("stack: identity of %s: %w", name, err)
	}
	if s.sources == nil {
		s.sources = map[string]*identity.Source{}
	}
	s.sources[name] = src
	return src, nil
}

// ClientTLS is the TLS configuration of a client acting as the workload name
// and expecting its server to be the workload peer (their default SPIFFE IDs, in
// the stack's trust domain); nil with Options.UnsafeNoAuth (plaintext). When
// name's files cannot be loaded, every handshake with it fails saying why.
func (s *Stack) ClientTLS(name, peer string) *tls.Config {
	if s.opts.UnsafeNoAuth {
		return nil
	}
	src, err := s.Source(name)
	if err == nil {
		var id spiffeid.ID
		if id, err = spiffeid.FromString(identity.DefaultID(peer)); err == nil {
			return src.ClientConfig(id)
		}
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return nil, err
	}}
}

// HTTPClient is an HTTP client acting as the workload name towards the service
// peer (ClientTLS; plaintext with Options.UnsafeNoAuth), every call bounded by
// 30 s. Clients of the same name and peer share their connections.
func (s *Stack) HTTPClient(name, peer string) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: s.transport(name, peer)}
}

func (s *Stack) transport(name, peer string) *http.Transport {
	cfg := s.ClientTLS(name, peer)
	s.mu.Lock()
	defer s.mu.Unlock()
	if tr, ok := s.clients[[2]string{name, peer}]; ok {
		return tr
	}
	tr := &http.Transport{
		// No proxy from the environment: the services are addressed directly.
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		TLSClientConfig:     cfg,
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
	}
	if s.clients == nil {
		s.clients = map[[2]string]*http.Transport{}
	}
	s.clients[[2]string{name, peer}] = tr
	return tr
}

// ReadMetric reads one series (as exposed, e.g. `rail_proxy_books_check_enabled`)
// of service's /metrics ("lock-server", "payment-resource", "rail-proxy",
// "rail-stub"), called as the ops workload.
func (s *Stack) ReadMetric(ctx context.Context, service, series string) (float64, error) {
	base := map[string]string{identity.NameLockServer: s.LockServerURL, identity.NamePaymentResource: s.PaymentURL,
		identity.NameRailProxy: s.ProxyURL, identity.NameRailStub: s.StubURL}[service]
	if base == "" {
		return 0, fmt.Errorf("stack: no service %q", service)
	}
	return testkit.ReadMetricWith(ctx, s.HTTPClient(identity.NameOps, service), base, series)
}
