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
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/api"
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
)

// Run serves lock-server until ctx is cancelled, then drains (docs/contracts/observability.md) and
// returns nil. It refuses to start when lockdb's schema is behind this binary.
func Run(ctx context.Context, cfg Config) error {
	return service.Run(cfg.spec(), func(sv *service.Service) error {
		gr, err := loadGrants(cfg, sv.Logger)
		if err != nil {
			return err
		}
		pool, err := sv.OpenDB(ctx)
		if err != nil {
			return err
		}
		st := &store{pool: pool, timeout: dbTimeout}
		handler := newServer(st, newMetrics(sv.Registry), sv.Health, sv.Registry, sv.Logger, cfg, gr)
		return sv.Serve(ctx, handler, serve.Serve, func(addr string) {
			sv.Logger.Info("lock-server starting", "addr", addr, "minTtl", cfg.MinTTL.String(),
				"maxTtl", cfg.MaxTTL.String(), "lockdbMaxConns", cfg.LockdbMaxConns)
		})
	})
}

// Migrate applies lockdb's embedded migrations (safe to run concurrently and
// repeatedly) and returns.
func Migrate(ctx context.Context, cfg Config) error {
	return service.Migrate(ctx, cfg.spec())
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
