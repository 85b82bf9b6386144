// Package payment is payment-resource (docs/contracts/payments.md): payouts are created,
// claimed by an executor with its fencing token (fence point (a): a PostgreSQL
// row that compares tokens), and posted by that claimant with the rail's outcome;
// a PAID post writes its ledger entry in the same transaction. It also exports
// Client, the Go client the other processes use.
package payment

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/api"
	"lock.dev/internal/dbconn"
	"lock.dev/internal/grant"
	"lock.dev/internal/serve"
)

// startupCheckTimeout bounds the schema check before serving.
const startupCheckTimeout = 10 * time.Second

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
	if err := cfg.Validate(); err != nil {
		return err
	}
	logger, err := serve.NewLogger(cfg.logOutput(), ServiceName, cfg.LogLevel)
	if err != nil {
		return err
	}
	keys, ignoredKeys, err := loadGrantKeys(cfg.GrantKeysFile)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, cfg.PaydbURL, cfg.PaydbMaxConns)
	if err != nil {
		return fmt.Errorf("paydb: %w", err)
	}
	defer st.close()

	cctx, cancel := context.WithTimeout(ctx, startupCheckTimeout)
	err = st.requireSchema(cctx)
	cancel()
	if err != nil {
		return err
	}

	reg := serve.NewRegistry()
	cctx, cancel = context.WithTimeout(ctx, startupCheckTimeout)
	err = dbconn.RequireDurable(cctx, st.pool, "paydb", cfg.UnsafeNonDurableDB, logger, reg)
	cancel()
	if err != nil {
		return err
	}
	stopWatch, err := dbconn.CheckPreconditions(ctx, st.pool, dbconn.Preconditions{Database: "paydb"}, logger, reg)
	if err != nil {
		return err
	}
	defer stopWatch()
	m, err := newMetrics(reg)
	if err != nil {
		return err
	}
	gate, err := grant.NewGate(keys, 0, reg, logger)
	if err != nil {
		return err
	}
	gate.Announce("PAYMENT_GRANT_KEYS_FILE", ignoredKeys)
	health := serve.NewHealth()
	health.Add("db", st.ping)
	h := &handlers{store: st, metrics: m, logger: logger, dbTimeout: cfg.dbTimeout(), settleToken: cfg.SettleToken, grants: gate}

	ln, err := serve.Listen(cfg.Addr, cfg.Listener)
	if err != nil {
		return err
	}
	logger.Info("starting", "maxConns", cfg.PaydbMaxConns, "dbTimeout", cfg.dbTimeout().String(),
		"settleEndpoint", cfg.SettleToken != "")
	return serve.Serve(ctx, ln, newServer(h, health, reg), health, logger)
}

// Migrate applies paydb's whole migration tree and returns. Concurrent and
// repeated runs are safe (goose holds an advisory lock).
func Migrate(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	logger, err := serve.NewLogger(cfg.logOutput(), ServiceName, cfg.LogLevel)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, cfg.PaydbURL, cfg.PaydbMaxConns)
	if err != nil {
		return fmt.Errorf("paydb: %w", err)
	}
	defer st.close()
	v, err := st.migrate(ctx, logger)
	if err != nil {
		return err
	}
	logger.Info("paydb migrated", "event", "migrated", "version", v)
	return nil
}
