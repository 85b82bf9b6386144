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
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
)

// newServer lists the whole API.
func newServer(h *handlers, health *serve.Health, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payouts", h.create)
	mux.HandleFunc("GET /v1/payouts", h.list)
	mux.HandleFunc("GET /v1/payouts/{id}", h.get)
	mux.HandleFunc("POST /v1/payouts/{id}/claim", h.claim)
	mux.HandleFunc("POST /v1/payouts/{id}/post", h.post)
	if h.settleToken != "" { // docs/contracts/reconciliation.md: no token, no settle endpoint (404)
		mux.HandleFunc("POST /v1/payouts/{id}/settle", h.settle)
	}
	mux.Handle("GET /openapi.json", api.Handler(api.PaymentResource))
	serve.Mount(mux, health, reg)
	return serve.Handler(mux, h.logger)
}

// Run serves payment-resource until ctx is cancelled, then drains and returns
// nil. It refuses to start when paydb's schema is behind, or cannot be read.
func Run(ctx context.Context, cfg Config) error {
	return service.Run(cfg.spec(), func(sv *service.Service) error {
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
		gate, err := sv.GrantGate(ctx, keys, true)
		if err != nil {
			return err
		}
		st := &store{pool: pool, books: cfg.BooksCheck, settleAfter: cfg.SettleAfter}
		h := &handlers{store: st, metrics: m, logger: sv.Logger, dbTimeout: cfg.dbTimeout(), settleToken: cfg.SettleToken, grants: gate}
		return sv.Serve(ctx, newServer(h, sv.Health, sv.Registry), serve.Serve, func(string) {
			sv.Logger.Info("starting", "maxConns", cfg.PaydbMaxConns, "dbTimeout", cfg.dbTimeout().String(),
				"settleEndpoint", cfg.SettleToken != "", "booksCheck", cfg.BooksCheck, "settleAfter", cfg.SettleAfter.String())
		})
	})
}

// Migrate applies paydb's whole migration tree and returns. Concurrent and
// repeated runs are safe (goose holds an advisory lock).
func Migrate(ctx context.Context, cfg Config) error {
	return service.Migrate(ctx, cfg.spec())
}
