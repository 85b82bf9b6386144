package railproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/api"
	"lock.dev/internal/fastserve"
	"lock.dev/internal/grant"
	"lock.dev/internal/identity"
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
)

// The routes a role guards: the operationIds of api/rail-proxy.json, the
// values of authz_denied_total's route label.
const (
	routeSubmit    = "submitPayment"
	routeList      = "listSubmissions"
	routeStatement = "readStatement"
)

// guardedRoutes are every route a role guards.
var guardedRoutes = []string{routeSubmit, routeList, routeStatement}

// routes lists rail-proxy's whole API. The role check comes first, before the
// body is read: a caller without the route's role is refused 403 FORBIDDEN
// having written nothing, called nothing and moved no counter but
// authz_denied_total (docs/contracts/workload-identity.md).
func routes(mux *http.ServeMux, a *admitter, gate *grant.Gate, store *Store, guard *identity.Guard, r roles, logger *slog.Logger) {
	mux.Handle("POST /v1/rail/submissions", guard.Allow(routeSubmit, r.submitters, handleSubmit(a, gate, guard)))
	mux.Handle("GET /v1/rail/submissions", guard.Allow(routeList, r.readers, handleList(store, logger)))
	mux.Handle("GET /v1/rail/statement", guard.Allow(routeStatement, r.readers, handleStatement(a.rail, a.metrics.statementReads, logger))) // statement.go
	mux.Handle("GET /openapi.json", api.Handler(api.RailProxy))
}

// Run serves rail-proxy until ctx is cancelled, then drains: readiness DOWN, no
// new connections, in-flight submissions carried to their answers, and returns
// nil. It refuses to start against a read replica or a schema that is behind.
func Run(ctx context.Context, cfg Config) error {
	return service.Run(cfg.spec(), func(sv *service.Service) error {
		logger, reg := sv.Logger, sv.Registry
		if !cfg.FencingEnabled {
			logger.Error("FENCING IS DISABLED: tokens at or below an account's mark are admitted and forwarded; this exists to demonstrate the hazard, never for production",
				"event", "fencing_disabled")
		}
		if !cfg.BooksCheck {
			logger.Error("BOOKS NOT CHECKED: submissions are admitted without reading the payout row, so a payout nobody booked, or booked otherwise, reaches the rail; only for a gate whose callers' books live in another database (docs/contracts/books.md)",
				"event", "books_not_checked", "setting", "RAIL_PROXY_BOOKS_CHECK")
		}
		rs, err := cfg.roles()
		if err != nil {
			return err
		}
		keys, err := service.ReadGrantKeys("RAIL_PROXY_GRANT_KEYS_FILE", cfg.GrantKeysFile)
		if err != nil {
			return err
		}
		pool, err := sv.OpenDB(ctx)
		if err != nil {
			return err
		}
		store := &Store{pool: pool}
		m := newMetrics(reg, cfg.FencingEnabled, cfg.BooksCheck)
		gate, err := sv.GrantGate(ctx, keys, cfg.GrantWidRequired)
		if err != nil {
			return err
		}
		rail, err := newRailClientFor(cfg, sv) // railtls.go: the rail's identity, or a real rail's host name
		if err != nil {
			return err
		}
		defer rail.close()
		a := &admitter{store: store, rail: rail, metrics: m, logger: logger, fencing: cfg.FencingEnabled,
			books: cfg.BooksCheck, interruptAfter: cfg.InterruptedAfter, groups: newGroups(cfg.MaxGroup), hooks: cfg.hooks}

		// Rows left unresolved by a proxy that died are resolved at start-up, then
		// swept again every interval.
		j := &janitor{store: store, metrics: m, logger: logger, age: cfg.InterruptedAfter, interval: cfg.janitorInterval()}
		if err := j.sweep(ctx); err != nil {
			logger.Warn("start-up sweep of interrupted intents failed; the periodic sweep will retry", "error", err.Error())
		}
		jctx, stopJanitor := context.WithCancel(context.WithoutCancel(ctx))
		var jwg sync.WaitGroup
		jwg.Go(func() { j.run(jctx) })
		defer func() {
			stopJanitor()
			jwg.Wait()
		}()

		// Readiness: db, and railStub (the name stays whatever the rail), the
		// adapter's health GET answered 2xx within 1 s. A proxy that cannot
		// reach the rail is taken out of service — it fails closed — rather than
		// admitting submissions it cannot deliver.
		sv.Health.Add("railStub", rail.Healthy)
		mux := http.NewServeMux()
		routes(mux, a, gate, store, sv.Guard(guardedRoutes...), rs, logger)
		serve.Mount(mux, sv.Health, reg)
		err = sv.Serve(ctx, serve.Handler(mux, logger), fastserve.ServeFast, func(string) {
			logger.Info("rail-proxy starting", "fencingEnabled", cfg.FencingEnabled, "booksCheck", cfg.BooksCheck, "railBaseURL", service.RedactURL(cfg.RailBaseURL), "railProtocol", rail.adapter.Protocol(),
				"railConnectTimeout", cfg.RailConnectTimeout.String(), "railReadTimeout", cfg.RailReadTimeout.String(),
				"interruptedAfter", cfg.InterruptedAfter.String(), "railIdleConnTimeout", cfg.RailIdleConnTimeout.String(),
				"paydbMaxConns", cfg.PaydbMaxConns, "grantWidRequired", cfg.GrantWidRequired,
				"submitters", identity.IDsString(rs.submitters), "readers", identity.IDsString(rs.readers))
		})
		// A submission whose connection outlived the drain grace is still carried to
		// its answer and its row resolved before the pool closes, and a resolving
		// write paydb did not take is still tried until shortly before its row's
		// interrupt_at: a stopping proxy does not abandon an outcome it knows. Each is
		// bounded, by the in-flight bound or by RAIL_PROXY_INTERRUPTED_AFTER, so this
		// wait is too.
		if n := a.late.Load(); n > 0 {
			logger.Warn("waiting for resolving writes paydb has not taken yet before exiting", "pending", n,
				"atMost", cfg.InterruptedAfter.String())
		}
		if !a.wait(cfg.InterruptedAfter + time.Second) {
			logger.Error("submissions still in flight at exit; their rows are left to the janitor")
		}
		return err
	})
}

// refuseStandby refuses a paydb that is a standby: the mark is read, compared and
// advanced in one statement on the primary.
func refuseStandby(ctx context.Context, pool *pgxpool.Pool) error {
	standby, err := (&Store{pool: pool}).InRecovery(ctx)
	if err != nil {
		return fmt.Errorf("paydb: %w", err)
	}
	if standby {
		return errors.New("paydb is a read replica (pg_is_in_recovery() is true): rail-proxy must run against the primary, where the mark is read, compared and advanced in one statement; a replica's mark lags and would admit stale tokens")
	}
	return nil
}

// Migrate applies paydb's migrations (the whole tree, rail-proxy's tables and
// payment-resource's alike) and returns. Safe to run concurrently and repeatedly.
func Migrate(ctx context.Context, cfg Config) error {
	return service.Migrate(ctx, cfg.spec())
}
