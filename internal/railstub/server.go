// Package railstub is rail-stub (docs/contracts/rail-stub.md): a test double of a payment rail
// that is token-blind, key-blind and non-idempotent, so that every call it receives
// can move money. It books every call before it does anything else, so its call log
// is the ground truth of what the rail was presented; chaos knobs (latency,
// declines, dropped connections, all reproducible by seed) make it misbehave the
// way real rails do.
package railstub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/api"
	"lock.dev/internal/fastserve"
	"lock.dev/internal/identity"
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
)

// The routes a role guards: the operationIds of api/rail-stub.json, the values
// of authz_denied_total's route label.
const (
	routePay        = "pay"
	routeListCalls  = "listCalls"
	routeResetCalls = "resetCalls"
	routeGetChaos   = "getChaos"
	routePutChaos   = "putChaos"
	// The ISO 20022 mode's payment and statement routes.
	routePayPain001  = "payPain001"
	routeReadCamt053 = "readCamt053"
)

// guardedRoutes are every route a role guards; the rail's health, health,
// metrics and the document need a certificate from the bundle and no role.
func guardedRoutes() []string {
	return []string{routePay, routeListCalls, routeResetCalls, routeGetChaos, routePutChaos, routePayPain001, routeReadCamt053}
}

// Stub is one rail-stub: its call log, chaos and HTTP surface.
type Stub struct {
	logger  *slog.Logger
	calls   *callLog
	chaos   *chaos
	reg     *prometheus.Registry
	metrics *metrics
	health  *serve.Health
	handler http.Handler
	// source is the stub's SVID and trust bundle, nil without identity files;
	// guard checks each route's role when the stub serves mutual TLS.
	source   *identity.Source
	guard    *identity.Guard
	roles    roles
	closeLog func() // writes the log lines still batched
	protocol string // RAIL_STUB_PROTOCOL
	// statements writes the camt.053 files; nil without RAIL_STUB_STATEMENT_DIR.
	statements *statementFiles

	// stopping is closed when shutdown begins; delayed replies still pending
	// drainReplies later are dropped, so the drain ends inside its grace.
	stopping     chan struct{}
	stopOnce     sync.Once
	drainReplies time.Duration
}

// New builds a stub from cfg. With a call-log file configured it loads the calls
// already in the file (seq continues after the last) and keeps the file open until
// Close. With identity files it loads them (an error names the setting) and
// guards each route by its role; without them the handler lets every caller
// through — Run refuses to serve so unless UNSAFE_NO_AUTH=true.
func New(cfg Config) (*Stub, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rs, err := cfg.roles()
	if err != nil {
		return nil, err
	}
	// On stdout the lines are batched: a write(2) per call, on the way to the
	// reply, was an eighth of the stub's CPU.
	logger, closeLog, err := service.NewBatchedLogger(cfg.LogOutput, "rail-stub", cfg.LogLevel)
	if err != nil {
		return nil, err
	}
	seed, chosen := int64(0), cfg.Seed == nil
	if chosen {
		seed = randomSeed()
	} else {
		seed = *cfg.Seed
	}
	calls, torn, err := openCallLog(cfg.CallLogPath)
	if err != nil {
		closeLog()
		return nil, err
	}
	if torn > 0 {
		logger.Warn("cut a torn last line off the call log; that call was never answered",
			"event", "call_log_torn", "callLog", cfg.CallLogPath, "bytes", torn)
	}
	drain := cfg.drainReplies
	if drain <= 0 {
		drain = serve.ShutdownGrace - time.Second
	}
	s := &Stub{
		stopping:     make(chan struct{}),
		drainReplies: drain,
		logger:       logger,
		closeLog:     closeLog,
		calls:        calls,
		chaos:        newChaos(Chaos{LatencyMs: cfg.LatencyMs, DeclineRate: cfg.DeclineRate, DropRate: cfg.DropRate, Seed: seed}),
		reg:          serve.NewRegistry(),
		health:       serve.NewHealth(),
		roles:        rs,
		protocol:     cfg.Protocol,
	}
	s.metrics = newMetrics(s.reg)
	if cfg.Identity.Enabled() {
		if s.source, err = identity.Load(cfg.Identity, logger); err != nil {
			_ = calls.close()
			closeLog()
			return nil, err
		}
		s.source.Register(s.reg)
	}
	if cfg.StatementDir != "" {
		// Before any call can be booked: the loaded calls are all there is.
		if s.statements, err = openStatementFiles(cfg.StatementDir, calls.calls, time.Now().UTC(), calls, s.metrics, logger); err != nil {
			_ = calls.close()
			closeLog()
			return nil, err
		}
		calls.filing = true
	}
	s.guard = identity.NewGuard(s.source != nil, guardedRoutes(), s.reg, logger)
	if cfg.CallLogPath != "" {
		s.health.Add("callLog", func(context.Context) error { return s.calls.health() })
	}
	s.handler = serve.Handler(s.routes(), logger)

	n, next := calls.count()
	logger.Info("rail-stub configured", "event", "rail_stub_started", "protocol", cfg.Protocol,
		"latencyMs", cfg.LatencyMs, "declineRate", cfg.DeclineRate, "dropRate", cfg.DropRate,
		"seed", seed, "seedChosen", chosen, "callLog", cfg.CallLogPath, "callsLoaded", n, "nextSeq", next,
		"statementDir", cfg.StatementDir, "statementEvery", cfg.StatementEvery.String())
	if s.statements != nil {
		go s.statements.run(cfg.StatementEvery)
	}
	return s, nil
}

// routes is the whole API of rail-stub. The role check comes first, before the
// body is read: a caller without the route's role is refused 403 FORBIDDEN with
// nothing booked and nothing changed (docs/contracts/workload-identity.md).
func (s *Stub) routes() *http.ServeMux {
	mux := http.NewServeMux()
	g, r := s.guard, s.roles
	// A rail takes payments in one language: in ISO 20022 mode the JSON
	// payment route is not served (404), the test double's own routes are.
	if s.protocol == ProtocolISO20022 {
		mux.HandleFunc("POST /iso20022/pain.001", g.Allow(routePayPain001, r.clients, s.handlePain001))
		mux.HandleFunc("GET /iso20022/camt.053", g.Allow(routeReadCamt053, r.readers, s.handleCamt053))
		mux.HandleFunc("GET /iso20022/health", s.handleHealth)
	} else {
		mux.HandleFunc("POST /rail/v1/payments", g.Allow(routePay, r.clients, s.handlePayment))
	}
	mux.HandleFunc("GET /rail/v1/calls", g.Allow(routeListCalls, r.readers, s.handleListCalls))
	mux.HandleFunc("DELETE /rail/v1/calls", g.Allow(routeResetCalls, r.admins, s.handleResetCalls))
	mux.HandleFunc("GET /rail/v1/admin/chaos", g.Allow(routeGetChaos, r.admins, s.handleGetChaos))
	mux.HandleFunc("PUT /rail/v1/admin/chaos", g.Allow(routePutChaos, r.admins, s.handlePutChaos))
	mux.HandleFunc("GET /rail/v1/health", s.handleHealth)
	mux.Handle("GET /openapi.json", api.Handler(api.RailStub))
	serve.Mount(mux, s.health, s.reg)
	return mux
}

// Handler serves every route, health and metrics included.
func (s *Stub) Handler() http.Handler { return s.handler }

// Close stops booking calls (later ones answer 503, unrecorded), closes the
// call-log file after a last fsync, writes the final statement file (with
// RAIL_STUB_STATEMENT_DIR), and writes the log lines still batched.
func (s *Stub) Close() error {
	err := s.calls.close()
	if s.statements != nil {
		err = errors.Join(err, s.statements.close())
	}
	s.closeLog()
	return err
}

// stop tells pending delayed replies that shutdown has begun.
func (s *Stub) stop() { s.stopOnce.Do(func() { close(s.stopping) }) }

// Run serves a stub until ctx is cancelled, then drains and returns nil. It
// refuses to start without identity files unless UNSAFE_NO_AUTH=true (the error
// names the first empty setting: exit 2); with them it serves mutual TLS only,
// the files re-read when they change. HEALTH_ADDR, when set, serves the probe
// paths plaintext.
func Run(ctx context.Context, cfg Config) (err error) {
	refuse := func(err error) error {
		for _, ln := range []net.Listener{cfg.Listener, cfg.HealthListener} {
			if ln != nil {
				_ = ln.Close()
			}
		}
		return err
	}
	if err := cfg.Validate(); err != nil {
		return refuse(err)
	}
	if err := cfg.Identity.Check(); err != nil {
		return refuse(err)
	}
	s, err := New(cfg)
	if err != nil {
		return refuse(err)
	}
	defer func() {
		if cerr := s.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	ln, err := serve.Listen(cfg.Addr, cfg.Listener)
	if err != nil {
		if cfg.HealthListener != nil {
			_ = cfg.HealthListener.Close()
		}
		return err
	}
	hctx, stopHealth := context.WithCancel(ctx)
	defer stopHealth()
	healthDone, err := serve.ServeProbes(hctx, cfg.HealthAddr, cfg.HealthListener, s.health, s.reg, s.logger)
	if err != nil {
		_ = ln.Close()
		return err
	}
	ln = identity.Secure(ctx, ln, s.source, s.reg, s.logger, s.source != nil,
		"TLS_CERT_FILE, TLS_KEY_FILE or TLS_CA_FILE is empty: plaintext, callers not verified",
		"clients", identity.IDsString(s.roles.clients), "readers", identity.IDsString(s.roles.readers),
		"admins", identity.IDsString(s.roles.admins))
	stopAfter := context.AfterFunc(ctx, s.stop)
	defer stopAfter()
	err = fastserve.ServeFast(ctx, ln, s.handler, s.health, s.logger)
	stopHealth()
	if herr := <-healthDone; err == nil && herr != nil {
		err = herr
	}
	if err != nil {
		return fmt.Errorf("rail-stub: %w", err)
	}
	return nil
}
