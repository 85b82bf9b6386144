// Package executor is the worker of docs/contracts/executor.md: it takes an account's lease
// from lock-server, claims one of the account's payouts with the lease's fencing
// token at payment-resource, submits it through rail-proxy with the same token, and
// posts what the proxy said. A reconcile pass settles payouts left CLAIMED by an
// executor that died or lost track. The executor's own HTTP port serves only
// metrics and health.
//
// Safety never depends on this process's belief that it holds a lease: the claim and
// the post are fenced at payment-resource, the submission at rail-proxy. The lease
// checks here only spare work a newer holder would have fenced anyway.
package executor

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"lock.dev/internal/identity"
	"lock.dev/internal/leasepause"
	"lock.dev/internal/payment"
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
	"lock.dev/lockclient"
)

// scanLimit is how many PENDING payouts one look for work reads; their accounts,
// oldest payout first, are the accounts tried.
const scanLimit = 1000

// reconcileLimit is how many stale CLAIMED payouts one reconcile pass takes on.
const reconcileLimit = 100

type executor struct {
	cfg     Config
	log     *slog.Logger
	fails   *repeatLog // the looks for work's failures, logged once while they repeat
	m       *metrics
	locks   *lockclient.Client
	pauser  *leasepause.Pauser[*lockclient.Lease] // freezes a paused cycle's lease
	payouts *payment.Client
	proxy   *proxyClient

	lockHTTP *http.Client // lockclient's, closed with the others at the end

	mu   sync.Mutex
	busy map[string]bool // accounts a goroutine of this process is working on
	// person: payouts this process found waiting for a person (reconcile.go).
	person map[string]personHold
	rnd    *rand.Rand // the pause draw
	seed   int64      // rnd's seed, logged so a run can be repeated

	running atomic.Int32 // workers running
}

// Run works payouts until ctx is cancelled, then lets each worker finish or
// abandon its current cycle (every step is bounded), releases its leases and
// returns nil.
func Run(ctx context.Context, cfg Config) (err error) {
	sv, err := service.Start(cfg.spec())
	if err != nil {
		return err
	}
	defer sv.Close(&err)
	logger, reg, health := sv.Logger, sv.Registry, sv.Health
	m, err := newMetrics(reg)
	if err != nil {
		return fmt.Errorf("executor: metrics: %w", err)
	}
	peers, err := resolvePeers(sv, cfg)
	if err != nil {
		return err
	}
	ln, err := sv.Listen()
	if err != nil {
		return err
	}
	e, err := newExecutor(cfg, logger, m, peers)
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer e.close()

	// No db component: the executor owns no database. It is ready while its
	// workers run.
	health.Add("workers", e.workersUp)
	mux := http.NewServeMux()
	serve.Mount(mux, health, reg)

	// The metrics server outlives the workers, so the last cycle's counts can
	// still be scraped while they finish. It serves mutual TLS like every other
	// workload (Secure also keeps the SVID the clients present re-read until
	// it ends), and HEALTH_ADDR plaintext for probes and scrapes.
	srvCtx, stopServer := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServer()
	healthDone, err := sv.ServeHealth(srvCtx)
	if err != nil {
		_ = ln.Close()
		return err
	}
	ln = sv.Secure(srvCtx, ln)
	srvErr := make(chan error, 1)
	go func() { srvErr <- serve.Serve(srvCtx, ln, serve.Handler(mux, logger), health, logger) }()

	logger.Info("executor starting", "event", "executor_started", "ownerId", cfg.OwnerID,
		"workers", cfg.Workers, "leaseTtl", cfg.LeaseTTL.String(), "proxyTimeout", cfg.ProxyTimeout.String(),
		"pollInterval", cfg.PollInterval.String(), "reconcileInterval", cfg.reconcileInterval().String(),
		"pauseProbability", cfg.PauseProbability, "pause", cfg.Pause.String(), "seed", e.seed,
		"lockServerUrl", cfg.LockServerURL, "paymentResourceUrl", cfg.PaymentResourceURL, "railProxyUrl", cfg.RailProxyURL,
		"lockServerId", peers.lockID, "paymentResourceId", peers.paymentID, "railProxyId", peers.proxyID)
	if cfg.LeaseTTL < cfg.ProxyTimeout {
		// Allowed (tests shorten leases on purpose), but a submission may then
		// outlive the lease it was made under; the fences keep that safe, the
		// warning says why stale writers may show up.
		logger.Warn("lease TTL is shorter than the proxy timeout: a submission can outlive its lease",
			"event", "lease_ttl_below_proxy_timeout", "leaseTtl", cfg.LeaseTTL.String(), "proxyTimeout", cfg.ProxyTimeout.String())
	}
	if cfg.PauseProbability > 0 {
		logger.Warn("stale-writer pauses are on: for demonstrations and tests only",
			"event", "pauses_enabled", "pauseProbability", cfg.PauseProbability, "pause", cfg.Pause.String())
	}

	// The workers stop when the caller says so, or when the metrics server fails.
	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	var wg sync.WaitGroup
	for i := range cfg.Workers {
		e.running.Add(1)
		wg.Go(func() {
			defer e.running.Add(-1)
			e.worker(wctx, i)
		})
	}
	if cfg.reconcileInterval() > 0 {
		wg.Go(func() { e.reconciler(wctx) })
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-srvErr:
		srvErr = nil
		logger.Error("metrics server failed; stopping the workers", "error", errText(runErr))
	}
	health.Drain()
	stopWorkers()
	wg.Wait()
	logger.Info("workers stopped", "event", "executor_stopped")
	stopServer()
	if srvErr != nil {
		runErr = <-srvErr
	}
	if herr := <-healthDone; runErr == nil && herr != nil {
		runErr = herr
	}
	return runErr
}

// peerTLS is the TLS configuration of each of the executor's clients, every one
// presenting the executor's SVID and expecting its server's SPIFFE ID; all nil
// without identity (UNSAFE_NO_AUTH: plaintext). The IDs are for the log.
type peerTLS struct {
	lock, payment, proxy       *tls.Config
	lockID, paymentID, proxyID string
}

// resolvePeers reads LOCK_SERVER_ID, PAYMENT_RESOURCE_ID and RAIL_PROXY_ID,
// whose defaults are in the executor's own trust domain: known only once its
// SVID is loaded (docs/contracts/workload-identity.md).
func resolvePeers(sv *service.Service, cfg Config) (peerTLS, error) {
	if sv.Identity == nil {
		return peerTLS{}, nil
	}
	td := sv.Identity.TrustDomain()
	lockID, err := identity.ParsePeer("LOCK_SERVER_ID", cfg.LockServerID, td, identity.NameLockServer)
	if err != nil {
		return peerTLS{}, err
	}
	paymentID, err := identity.ParsePeer("PAYMENT_RESOURCE_ID", cfg.PaymentResourceID, td, identity.NamePaymentResource)
	if err != nil {
		return peerTLS{}, err
	}
	proxyID, err := identity.ParsePeer("RAIL_PROXY_ID", cfg.RailProxyID, td, identity.NameRailProxy)
	if err != nil {
		return peerTLS{}, err
	}
	return peerTLS{
		lock: sv.ClientTLS(lockID), payment: sv.ClientTLS(paymentID), proxy: sv.ClientTLS(proxyID),
		lockID: lockID.String(), paymentID: paymentID.String(), proxyID: proxyID.String(),
	}, nil
}

func newExecutor(cfg Config, logger *slog.Logger, m *metrics, peers peerTLS) (*executor, error) {
	// Each worker and the reconcile pass may hold one connection to each
	// service. Every client has a transport of its own sized so, rather than
	// Go's default (two idle connections per host): with mutual TLS a
	// connection that cannot be kept pays a handshake on the next call.
	idle := cfg.Workers + 2
	pc := payment.NewTLSClient(cfg.PaymentResourceURL, peers.payment)
	pc.Timeout = cfg.requestTimeout()
	pc.HTTP = &http.Client{Transport: newTransport(idle, peers.payment), CheckRedirect: noRedirect}
	// Redirects are not followed: a 307/308 would resend an acquire or renew to
	// an address nobody configured.
	lockHTTP := &http.Client{Transport: newTransport(idle, peers.lock), CheckRedirect: noRedirect}
	// The pauser is how pause freezes a cycle's lease (cycle.go).
	pauser := leasepause.New[*lockclient.Lease]()
	locks, err := lockclient.New(cfg.LockServerURL,
		lockclient.WithHTTPClient(lockHTTP),
		lockclient.WithRequestTimeout(cfg.requestTimeout()),
		lockclient.WithLogger(logger),
		lockclient.WithPauser(pauser))
	if err != nil {
		return nil, fmt.Errorf("executor: LOCK_SERVER_URL: %w", err)
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Int64()
	}
	return &executor{
		seed:     seed,
		rnd:      rand.New(rand.NewPCG(uint64(seed), uint64(seed)>>1|1)),
		cfg:      cfg,
		log:      logger,
		m:        m,
		locks:    locks,
		pauser:   pauser,
		payouts:  pc,
		proxy:    newProxyClient(cfg.RailProxyURL, idle, peers.proxy),
		busy:     map[string]bool{},
		person:   map[string]personHold{},
		lockHTTP: lockHTTP,
		fails:    newRepeatLog(logger, repeatEvery, time.Now),
	}, nil
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// newTransport is a transport for one service: no HTTP proxy from the
// environment (the services are addressed directly), idle connections enough for
// every worker, closed before the servers' 60 s idle timeout, and mutual TLS
// with tlsCfg (nil: plaintext). The handshake is bounded like the dial.
func newTransport(idle int, tlsCfg *tls.Config) *http.Transport {
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConns:        idle,
		MaxIdleConnsPerHost: idle,
		IdleConnTimeout:     50 * time.Second,
	}
}

func (e *executor) close() {
	e.proxy.close()
	e.payouts.HTTP.CloseIdleConnections()
	e.lockHTTP.CloseIdleConnections()
}

func (e *executor) workersUp(context.Context) error {
	if n := e.running.Load(); n < int32(e.cfg.Workers) {
		return fmt.Errorf("%d of %d workers running", n, e.cfg.Workers)
	}
	return nil
}

// worker looks for an account with PENDING payouts and works one payout of it per
// cycle; with nothing to do it waits a poll interval.
func (e *executor) worker(ctx context.Context, id int) {
	e.log.Debug("worker started", "worker", id)
	for ctx.Err() == nil {
		if !e.workOnce(ctx) {
			sleep(ctx, e.cfg.PollInterval)
		}
	}
}

// workOnce tries the accounts that have PENDING payouts, the account of the oldest
// payout first, until one cycle claims a payout. It reports whether one did.
func (e *executor) workOnce(ctx context.Context) bool {
	lctx, cancel := context.WithTimeout(ctx, e.cfg.requestTimeout())
	pending, err := e.payouts.List(lctx, "PENDING", "", nil, scanLimit)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			e.fails.failed("scan_failed", "looking for PENDING payouts failed", err)
		}
		return false
	}
	e.fails.recovered("scan_failed")
	tried := map[string]bool{}
	for _, p := range pending {
		if ctx.Err() != nil {
			return false
		}
		if tried[p.AccountID] {
			continue
		}
		tried[p.AccountID] = true
		if !e.take(p.AccountID) {
			continue // another worker of this process is on it
		}
		claimed := e.cycle(ctx, p.AccountID)
		e.free(p.AccountID)
		if claimed {
			return true
		}
	}
	return false
}

// take marks an account as worked on by this process; false when it already is.
// Two workers of one process share an owner id, so lock-server would refuse the
// second anyway; this only spares the call.
func (e *executor) take(accountID string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.busy[accountID] {
		return false
	}
	e.busy[accountID] = true
	return true
}

func (e *executor) free(accountID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.busy, accountID)
}

func (e *executor) drawPause() bool {
	if e.cfg.PauseProbability <= 0 {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rnd.Float64() < e.cfg.PauseProbability
}

// sleep waits d or until ctx is done; it reports whether the full d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// errText is err's message, or "" for nil: log fields stay strings.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
