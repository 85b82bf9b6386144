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
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/api"
	"lock.dev/internal/identity"
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
		if gr.signer == nil {
			sv.NoteAuthMissing("LOCK_SERVER_SIGNING_KEY_FILE is empty: grants are not signed")
		}
		rl, err := cfg.roles()
		if err != nil {
			return err
		}
		acc := access{guard: sv.Guard(routes...), roles: rl}
		pool, err := sv.OpenDB(ctx)
		if err != nil {
			return err
		}
		st := &store{pool: pool, timeout: dbTimeout}
		handler := newServer(st, newMetrics(sv.Registry), sv.Health, sv.Registry, sv.Logger, cfg, gr, acc)
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

// The route names (the operationIds of api/lock-server.json) a role guards:
// authz_denied_total{route}'s closed set.
const (
	routeAcquire = "acquireLock"
	routeRenew   = "renewLock"
	routeRelease = "releaseLock"
	routeGet     = "getLock"
	routeGrants  = "listGrants"
)

var routes = []string{routeAcquire, routeRenew, routeRelease, routeGet, routeGrants}

// access is who may call which route (docs/contracts/workload-identity.md):
// holders take, renew and release leases; holders and readers read a lock;
// readers read its grants history. The guard lets everyone through when the
// service runs without identities.
type access struct {
	guard *identity.Guard
	roles roles
}

// newServer is the whole HTTP surface of lock-server.
func newServer(st *store, m *metrics, health *serve.Health, reg *prometheus.Registry, logger *slog.Logger, cfg Config, gr grants, acc access) http.Handler {
	h := &handler{
		store:    st,
		metrics:  m,
		logger:   logger,
		clock:    cfg.clock(),
		minTTLMs: cfg.MinTTL.Milliseconds(),
		maxTTLMs: cfg.MaxTTL.Milliseconds(),
		grants:   gr,
		caller:   acc.guard.Caller,
	}
	holders, readers := acc.roles.holders, acc.roles.readers
	either := append(slices.Clone(holders), readers...)
	mux := http.NewServeMux()
	// The role is checked first, before the call is read: a workload without
	// it learns nothing and changes nothing (403 FORBIDDEN).
	mux.HandleFunc("POST /v1/locks/{name}/acquire", acc.guard.Allow(routeAcquire, holders, h.acquire))
	mux.HandleFunc("POST /v1/locks/{name}/renew", acc.guard.Allow(routeRenew, holders, h.renew))
	mux.HandleFunc("POST /v1/locks/{name}/release", acc.guard.Allow(routeRelease, holders, h.release))
	mux.HandleFunc("GET /v1/locks/{name}", acc.guard.Allow(routeGet, either, h.getLock))
	mux.HandleFunc("GET /v1/locks/{name}/grants", acc.guard.Allow(routeGrants, readers, h.getGrants))
	mux.HandleFunc("GET /v1/keys", gr.keys)
	mux.Handle("GET /openapi.json", api.Handler(api.LockServer))
	serve.Mount(mux, health, reg)
	return serve.Handler(mux, logger)
}
