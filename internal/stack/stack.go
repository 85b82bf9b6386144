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
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/lockdb"
	"lock.dev/internal/lockserver"
	"lock.dev/internal/paydb"
	"lock.dev/internal/payment"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/railproxy"
	"lock.dev/internal/railstub"
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
	// Env adds or overrides settings (the variable names of
	// docs/contracts/configuration.md) per service: "rail-proxy", "rail-stub",
	// "lock-server", "payment-resource", "reconciler".
	Env map[string]map[string]string
	// Log receives every service's JSON log lines; nil discards them.
	Log io.Writer
}

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
	Stub                                         *railstub.Client
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
	if err := s.databases(ctx); err != nil {
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
	s.Stub = railstub.NewClient(s.StubURL)

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
	s.ProxyURL = "http://" + s.proxyAddr
	if err := s.startProxy(ctx); err != nil {
		return nil, err
	}
	if opts.Tap {
		if s.taps, err = startTaps(map[string]string{
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
	if err := waitReady(ctx, s.ProxyURL); err != nil {
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
	url := "http://" + ln.Addr().String()
	if err := waitReady(ctx, url); err != nil {
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

// waitReady polls url/readyz until it answers 200.
func waitReady(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("readyz answered %d", resp.StatusCode)
		}
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
