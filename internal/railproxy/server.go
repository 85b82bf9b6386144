package railproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/api"
	"lock.dev/internal/dbconn"
	"lock.dev/internal/fastserve"
	"lock.dev/internal/grant"
	"lock.dev/internal/serve"
)

// startupCheckTimeout bounds the checks run before serving.
const startupCheckTimeout = 15 * time.Second

// routes lists rail-proxy's whole API.
func routes(mux *http.ServeMux, a *admitter, gate *grant.Gate, store *Store, logger *slog.Logger) {
	mux.Handle("POST /v1/rail/submissions", handleSubmit(a, gate))
	mux.Handle("GET /v1/rail/submissions", handleList(store, logger))
	mux.Handle("GET /v1/rail/statement", handleStatement(a.rail, a.metrics.statementReads, logger)) // statement.go
	mux.Handle("GET /openapi.json", api.Handler(api.RailProxy))
}

func newLogger(cfg Config) (*slog.Logger, error) {
	var out io.Writer = os.Stdout
	if cfg.LogOutput != nil {
		out = cfg.LogOutput
	}
	return serve.NewLogger(out, "rail-proxy", cfg.LogLevel)
}

// newServeLogger is the logger of a serving proxy: on stdout its lines are
// batched (serve.LogWriter); close writes what is left, and must be called last.
func newServeLogger(cfg Config) (*slog.Logger, func(), error) {
	if cfg.LogOutput != nil {
		l, err := newLogger(cfg)
		return l, func() {}, err
	}
	lw := serve.NewLogWriter(os.Stdout)
	l, err := serve.NewLogger(lw, "rail-proxy", cfg.LogLevel)
	if err != nil {
		_ = lw.Close()
		return nil, nil, err
	}
	return l, func() { _ = lw.Close() }, nil
}

// Run serves rail-proxy until ctx is cancelled, then drains: readiness DOWN, no
// new connections, in-flight submissions carried to their answers, and returns
// nil. It refuses to start against a read replica or a schema that is behind.
func Run(ctx context.Context, cfg Config) (err error) {
	if cfg.Listener != nil {
		// A listener handed in is ours to close, also when start-up fails, so
		// the caller's clients see a refused connection rather than a hang.
		defer func() {
			if err != nil {
				_ = cfg.Listener.Close()
			}
		}()
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	logger, closeLog, err := newServeLogger(cfg)
	if err != nil {
		return err
	}
	defer closeLog()
	if !cfg.FencingEnabled {
		logger.Error("FENCING IS DISABLED: tokens at or below an account's mark are admitted and forwarded; this exists to demonstrate the hazard, never for production",
			"event", "fencing_disabled")
	}
	keys, ignoredKeys, err := loadGrantKeys(cfg.GrantKeysFile)
	if err != nil {
		return err
	}
	store, err := OpenStore(ctx, cfg.PaydbURL, cfg.PaydbMaxConns)
	if err != nil {
		return fmt.Errorf("paydb: %w", err)
	}
	defer store.Close()
	if err := checkPaydb(ctx, store); err != nil {
		return err
	}

	reg := serve.NewRegistry()
	if err := requireDurable(ctx, store, cfg, logger, reg); err != nil {
		return err
	}
	// BackendPID: a COMMIT whose answer was lost is resolved by looking its
	// backend up in pg_stat_activity by the connection's announced pid.
	stopWatch, err := dbconn.CheckPreconditions(ctx, store.pool, dbconn.Preconditions{Database: "paydb", BackendPID: true}, logger, reg)
	if err != nil {
		return err
	}
	defer stopWatch()
	m := newMetrics(reg, cfg.FencingEnabled)
	gate, err := grant.NewGate(keys, 0, reg, logger)
	if err != nil {
		return err
	}
	gate.Announce("RAIL_PROXY_GRANT_KEYS_FILE", ignoredKeys)
	rail := newRailClient(cfg)
	defer rail.close()
	a := &admitter{store: store, rail: rail, metrics: m, logger: logger, fencing: cfg.FencingEnabled,
		interruptAfter: cfg.InterruptedAfter, groups: newGroups(cfg.MaxGroup), hooks: cfg.hooks}

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

	health := newHealth(store, rail)
	mux := http.NewServeMux()
	routes(mux, a, gate, store, logger)
	serve.Mount(mux, health, reg)
	ln, err := serve.Listen(cfg.Addr, cfg.Listener)
	if err != nil {
		return err
	}
	logger.Info("rail-proxy starting", "fencingEnabled", cfg.FencingEnabled, "railBaseURL", redactURL(cfg.RailBaseURL),
		"railConnectTimeout", cfg.RailConnectTimeout.String(), "railReadTimeout", cfg.RailReadTimeout.String(),
		"interruptedAfter", cfg.InterruptedAfter.String(), "railIdleConnTimeout", cfg.RailIdleConnTimeout.String(),
		"paydbMaxConns", cfg.PaydbMaxConns)
	err = fastserve.ServeFast(ctx, ln, serve.Handler(mux, logger), health, logger)
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
}

// checkPaydb refuses a standby and a schema that is behind.
func checkPaydb(ctx context.Context, store *Store) error {
	ctx, cancel := context.WithTimeout(ctx, startupCheckTimeout)
	defer cancel()
	standby, err := store.InRecovery(ctx)
	if err != nil {
		return fmt.Errorf("paydb: %w", err)
	}
	if standby {
		return errors.New("paydb is a read replica (pg_is_in_recovery() is true): rail-proxy must run against the primary, where the mark is read, compared and advanced in one statement; a replica's mark lags and would admit stale tokens")
	}
	return store.RequireSchema(ctx)
}

// requireDurable refuses a paydb whose fsync is off unless UNSAFE_NON_DURABLE_DB
// (docs/contracts/configuration.md): a crash would forget a forwarded intent and the mark with it.
func requireDurable(ctx context.Context, store *Store, cfg Config, logger *slog.Logger, reg prometheus.Registerer) error {
	ctx, cancel := context.WithTimeout(ctx, startupCheckTimeout)
	defer cancel()
	return dbconn.RequireDurable(ctx, store.pool, "paydb", cfg.UnsafeNonDurableDB, logger, reg)
}

// Migrate applies paydb's migrations (the whole tree, rail-proxy's tables and
// payment-resource's alike) and returns. Safe to run concurrently and repeatedly.
func Migrate(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	logger, err := newLogger(cfg)
	if err != nil {
		return err
	}
	store, err := OpenStore(ctx, cfg.PaydbURL, 2)
	if err != nil {
		return fmt.Errorf("paydb: %w", err)
	}
	defer store.Close()
	v, err := store.Migrate(ctx, logger)
	if err != nil {
		return err
	}
	logger.Info("paydb migrated", "version", v)
	return nil
}

// redactURL hides a password in a URL before it is logged.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable)"
	}
	return u.Redacted()
}
