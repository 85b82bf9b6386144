// Package payment is payment-resource (docs/contracts/payments.md): payouts are created,
// claimed by an executor with its fencing token (fence point (a): a PostgreSQL
// row that compares tokens), and posted by that claimant with the rail's outcome;
// a PAID post writes its ledger entry in the same transaction. It also exports
// Client, the Go client the other processes use.
package payment

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/api"
	"lock.dev/internal/identity"
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
)

// The guarded routes: the operationIds of api/payment-resource.json, the
// values of authz_denied_total's route label.
const (
	routeCreate = "createPayout"
	routeList   = "listPayouts"
	routeGet    = "getPayout"
	routeClaim  = "claimPayout"
	routePost   = "postPayout"
	routeSettle = "settlePayout"
)

// routes are every guarded route.
func routes() []string {
	return []string{routeCreate, routeList, routeGet, routeClaim, routePost, routeSettle}
}

// newServer lists the whole API. Each payout route lets only its role's
// workloads through (docs/contracts/workload-identity.md): the role is checked
// before anything of the request is looked at, so a caller without it learns
// nothing and writes nothing. Health, metrics and the document need no role.
func newServer(h *handlers, g *identity.Guard, rs roles, health *serve.Health, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payouts", g.Allow(routeCreate, rs.creators, h.create))
	mux.HandleFunc("GET /v1/payouts", g.Allow(routeList, rs.readers, h.list))
	mux.HandleFunc("GET /v1/payouts/{id}", g.Allow(routeGet, rs.readers, h.get))
	mux.HandleFunc("POST /v1/payouts/{id}/claim", g.Allow(routeClaim, rs.workers, h.claim))
	mux.HandleFunc("POST /v1/payouts/{id}/post", g.Allow(routePost, rs.workers, h.post))
	if h.settleToken != "" { // docs/contracts/reconciliation.md: no token, no settle endpoint (404)
		mux.HandleFunc("POST /v1/payouts/{id}/settle", g.Allow(routeSettle, rs.settlers, h.settle))
	}
	mux.Handle("GET /openapi.json", api.Handler(api.PaymentResource))
	serve.Mount(mux, health, reg)
	return serve.Handler(mux, h.logger)
}

// Run serves payment-resource until ctx is cancelled, then drains and returns
// nil. It refuses to start when paydb's schema is behind, or cannot be read.
func Run(ctx context.Context, cfg Config) error {
	return service.Run(cfg.spec(), func(sv *service.Service) error {
		rs, err := cfg.roles()
		if err != nil {
			return err
		}
		keys, err := service.ReadGrantKeys("PAYMENT_GRANT_KEYS_FILE", cfg.GrantKeysFile)
		if err != nil {
			return err
		}
		pool, err := sv.OpenDB(ctx)
		if err != nil {
			return err
		}
		m, err := newMetrics(sv.Registry, cfg.BooksCheck)
		if err != nil {
			return err
		}
		if !cfg.BooksCheck {
			sv.Logger.Warn("BOOKS ARE NOT CHECKED: posts are not compared with the audit trail nor settles with the statement copy; only for callers whose books live in another database",
				"event", "books_not_checked", "setting", "PAYMENT_BOOKS_CHECK")
		}
		gate, err := sv.GrantGate(ctx, keys, cfg.GrantWidRequired)
		if err != nil {
			return err
		}
		st := &store{pool: pool, books: cfg.BooksCheck, settleAfter: cfg.SettleAfter}
		g := sv.Guard(routes()...)
		h := &handlers{store: st, metrics: m, logger: sv.Logger, dbTimeout: cfg.dbTimeout(), settleToken: cfg.SettleToken,
			railProfile: cfg.RailProfile, grants: gate, caller: g.Caller}
		return sv.Serve(ctx, newServer(h, g, rs, sv.Health, sv.Registry), serve.Serve, func(string) {
			sv.Logger.Info("starting", "maxConns", cfg.PaydbMaxConns, "dbTimeout", cfg.dbTimeout().String(),
				"settleEndpoint", cfg.SettleToken != "", "booksCheck", cfg.BooksCheck, "settleAfter", cfg.SettleAfter.String(), "railProfile", cfg.RailProfile,
				"creators", identity.IDsString(rs.creators), "workers", identity.IDsString(rs.workers),
				"settlers", identity.IDsString(rs.settlers), "readers", identity.IDsString(rs.readers),
				"grantWidRequired", cfg.GrantWidRequired)
		})
	})
}

// Migrate applies paydb's whole migration tree and returns. Concurrent and
// repeated runs are safe (goose holds an advisory lock).
func Migrate(ctx context.Context, cfg Config) error {
	return service.Migrate(ctx, cfg.spec())
}
