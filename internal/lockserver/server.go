// Package lockserver is lock-server (docs/contracts/lock-service.md): leases on
// named locks, each grant carrying a fencing token strictly greater than every
// token issued for that lock before. It is a stateless HTTP service over lockdb;
// any number of replicas may share one lockdb, because every decision — who holds a
// lock, whether a lease has expired, which token comes next — is made inside one
// lockdb statement by lockdb's clock, never by a replica's memory or clock.
//
// Files: config.go (settings), server.go (Run, Migrate, routes), handler.go
// (binding and answers), store.go (lockdb; the only file that knows pgx), lock.go
// (the domain and its errors), metrics.go, clock.go (the test hook for the
// server's own, powerless, clock).
package lockserver

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/api"
	"lock.dev/internal/dbconn"
	"lock.dev/internal/serve"
)

const service = "lock-server"

// schemaCheckTimeout bounds the start-up check of lockdb's schema version.
const schemaCheckTimeout = 10 * time.Second

// Run serves lock-server until ctx is cancelled, then drains (docs/contracts/observability.md) and
// returns nil. It refuses to start when lockdb's schema is behind this binary.
func Run(ctx context.Context, cfg Config) (err error) {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Listener != nil {
		// Run owns the listener it was given: closed by the server on shutdown,
		// or here if Run never gets that far.
		defer func() {
			if err != nil {
				_ = cfg.Listener.Close()
			}
		}()
	}
	logger, err := serve.NewLogger(cfg.logOutput(), service, cfg.LogLevel)
	if err != nil {
		return err
	}
	gr, err := loadGrants(cfg, logger)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, cfg.LockdbURL, cfg.LockdbMaxConns)
	if err != nil {
		return fmt.Errorf("lockdb: %w", err)
	}
	defer st.close()

	cctx, cancel := context.WithTimeout(ctx, schemaCheckTimeout)
	err = st.requireSchema(cctx)
	cancel()
	if err != nil {
		return err
	}

	reg := serve.NewRegistry()
	cctx, cancel = context.WithTimeout(ctx, schemaCheckTimeout)
	err = dbconn.RequireDurable(cctx, st.pool, "lockdb", cfg.UnsafeNonDurableDB, logger, reg)
	cancel()
	if err != nil {
		return err
	}
	stopWatch, err := dbconn.CheckPreconditions(ctx, st.pool, dbconn.Preconditions{Database: "lockdb"}, logger, reg)
	if err != nil {
		return err
	}
	defer stopWatch()
	health := serve.NewHealth()
	health.Add("db", st.ping)
	handler := newServer(st, newMetrics(reg), health, reg, logger, cfg, gr)

	ln, err := serve.Listen(cfg.Addr, cfg.Listener)
	if err != nil {
		return err
	}
	logger.Info("lock-server starting", "addr", ln.Addr().String(), "minTtl", cfg.MinTTL.String(),
		"maxTtl", cfg.MaxTTL.String(), "lockdbMaxConns", cfg.LockdbMaxConns)
	return serve.Serve(ctx, ln, handler, health, logger)
}

// Migrate applies lockdb's embedded migrations (safe to run concurrently and
// repeatedly) and returns.
func Migrate(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	logger, err := serve.NewLogger(cfg.logOutput(), service, cfg.LogLevel)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, cfg.LockdbURL, cfg.LockdbMaxConns)
	if err != nil {
		return fmt.Errorf("lockdb: %w", err)
	}
	defer st.close()
	v, err := st.migrate(ctx, logger)
	if err != nil {
		return err
	}
	logger.Info("lockdb migrated", "version", v)
	return nil
}

// newServer is the whole HTTP surface of lock-server.
func newServer(st *store, m *metrics, health *serve.Health, reg *prometheus.Registry, logger *slog.Logger, cfg Config, gr grants) http.Handler {
	h := &handler{
		store:    st,
		metrics:  m,
		logger:   logger,
		clock:    cfg.clock(),
		minTTLMs: cfg.MinTTL.Milliseconds(),
		maxTTLMs: cfg.MaxTTL.Milliseconds(),
		grants:   gr,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/locks/{name}/acquire", h.acquire)
	mux.HandleFunc("POST /v1/locks/{name}/renew", h.renew)
	mux.HandleFunc("POST /v1/locks/{name}/release", h.release)
	mux.HandleFunc("GET /v1/locks/{name}", h.getLock)
	mux.HandleFunc("GET /v1/locks/{name}/grants", h.getGrants)
	mux.HandleFunc("GET /v1/keys", gr.keys)
	mux.Handle("GET /openapi.json", api.Handler(api.LockServer))
	serve.Mount(mux, health, reg)
	return serve.Handler(mux, logger)
}
