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
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/api"
	"lock.dev/internal/fastserve"
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
)

// Stub is one rail-stub: its call log, chaos and HTTP surface.
type Stub struct {
	logger   *slog.Logger
	calls    *callLog
	chaos    *chaos
	reg      *prometheus.Registry
	metrics  *metrics
	health   *serve.Health
	handler  http.Handler
	closeLog func() // writes the log lines still batched

	// stopping is closed when shutdown begins; delayed replies still pending
	// drainReplies later are dropped, so the drain ends inside its grace.
	stopping     chan struct{}
	stopOnce     sync.Once
	drainReplies time.Duration
}

// New builds a stub from cfg. With a call-log file configured it loads the calls
// already in the file (seq continues after the last) and keeps the file open until
// Close.
func New(cfg Config) (*Stub, error) {
	if err := cfg.Validate(); err != nil {
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
	}
	s.metrics = newMetrics(s.reg)
	if cfg.CallLogPath != "" {
		s.health.Add("callLog", func(context.Context) error { return s.calls.health() })
	}
	s.handler = serve.Handler(s.routes(), logger)

	n, next := calls.count()
	logger.Info("rail-stub configured", "event", "rail_stub_started",
		"latencyMs", cfg.LatencyMs, "declineRate", cfg.DeclineRate, "dropRate", cfg.DropRate,
		"seed", seed, "seedChosen", chosen, "callLog", cfg.CallLogPath, "callsLoaded", n, "nextSeq", next)
	return s, nil
}

// routes is the whole API of rail-stub.
func (s *Stub) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /rail/v1/payments", s.handlePayment)
	mux.HandleFunc("GET /rail/v1/calls", s.handleListCalls)
	mux.HandleFunc("DELETE /rail/v1/calls", s.handleResetCalls)
	mux.HandleFunc("GET /rail/v1/admin/chaos", s.handleGetChaos)
	mux.HandleFunc("PUT /rail/v1/admin/chaos", s.handlePutChaos)
	mux.HandleFunc("GET /rail/v1/health", s.handleHealth)
	mux.Handle("GET /openapi.json", api.Handler(api.RailStub))
	serve.Mount(mux, s.health, s.reg)
	return mux
}

// Handler serves every route, health and metrics included.
func (s *Stub) Handler() http.Handler { return s.handler }

// Close stops booking calls (later ones answer 503, unrecorded), closes the
// call-log file after a last fsync, and writes the log lines still batched.
func (s *Stub) Close() error {
	err := s.calls.close()
	s.closeLog()
	return err
}

// stop tells pending delayed replies that shutdown has begun.
func (s *Stub) stop() { s.stopOnce.Do(func() { close(s.stopping) }) }

// Run serves a stub until ctx is cancelled, then drains and returns nil.
func Run(ctx context.Context, cfg Config) (err error) {
	s, err := New(cfg)
	if err != nil {
		if cfg.Listener != nil {
			_ = cfg.Listener.Close()
		}
		return err
	}
	defer func() {
		if cerr := s.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	ln, err := serve.Listen(cfg.Addr, cfg.Listener)
	if err != nil {
		return err
	}
	stopAfter := context.AfterFunc(ctx, s.stop)
	defer stopAfter()
	if err := fastserve.ServeFast(ctx, ln, s.handler, s.health, s.logger); err != nil {
		return fmt.Errorf("rail-stub: %w", err)
	}
	return nil
}
