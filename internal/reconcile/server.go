package reconcile

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/serve"
)

// startupCheckTimeout bounds the schema check before serving.
const startupCheckTimeout = 15 * time.Second

func newLogger(cfg Config) (*slog.Logger, error) {
	var out io.Writer = os.Stdout
	if cfg.LogOutput != nil {
		out = cfg.LogOutput
	}
	return serve.NewLogger(out, ServiceName, cfg.LogLevel)
}

// Run serves the reconciler until ctx is cancelled: a pass at start-up, then one
// every RECONCILER_INTERVAL after the previous ended, with metrics and health on
// RECONCILER_ADDR. On cancellation the pass in progress stops at its next step (its
// open transaction rolls back; what it committed stands) and Run returns nil. It
// refuses to start on a paydb whose schema is behind.
func Run(ctx context.Context, cfg Config) (err error) {
	if cfg.Listener != nil {
		defer func() {
			if err != nil {
				_ = cfg.Listener.Close()
			}
		}()
	}
	if err := cfg.ValidateServe(); err != nil {
		return err
	}
	logger, err := newLogger(cfg)
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
	// The statement copy and its exceptions are re-derived from the rail's
	// statement should paydb forget them, but a paydb with fsync off can forget
	// the payouts' settlements too: refused like the other services do.
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
	m := newMetrics(reg)
	statement := newStatementClient(cfg.RailProxyURL)
	defer statement.close()
	settles := newSettleClient(cfg.PaymentResourceURL, cfg.SettleToken)
	defer settles.close()
	r := &reconciler{store: st, statement: statement, settles: settles, metrics: m, logger: logger, settleAfter: cfg.SettleAfter}
	if seq, err := st.lastSeq(ctx); err == nil {
		m.statementSeq.Set(float64(seq))
	}

	if cfg.SettleAfter < shortSettleWindow {
		logger.Warn("RECONCILER_SETTLE_AFTER is short: a payout is settled NOT_PRESENTED when its call has not reached the statement this long after its attempt; a rail slower to record a call than this would make that wrong (caught later as LINE_CONTRADICTS_PAYOUT)",
			"event", "settle_window_short", "settleAfter", cfg.SettleAfter.String())
	}
	logger.Info("reconciler starting", "railProxyURL", redactURL(cfg.RailProxyURL), "paymentResourceURL", redactURL(cfg.PaymentResourceURL),
		"interval", cfg.Interval.String(), "settleAfter", cfg.SettleAfter.String(), "paydbMaxConns", cfg.PaydbMaxConns)

	pctx, stopPasses := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { r.loop(pctx, cfg.Interval) })
	defer func() {
		stopPasses()
		wg.Wait()
	}()

	health := newHealth(st, statement)
	mux := http.NewServeMux()
	serve.Mount(mux, health, reg)
	ln, err := serve.Listen(cfg.Addr, cfg.Listener)
	if err != nil {
		return err
	}
	return serve.Serve(ctx, ln, serve.Handler(mux, logger), health, logger)
}

// Pass runs one pass with cfg's settings and returns what it did: what Run does
// every RECONCILER_INTERVAL, once, for tests and for an operator's one-off run.
// Its metrics go to a registry of its own; its log to cfg.LogOutput.
func Pass(ctx context.Context, cfg Config) (PassReport, error) {
	if err := cfg.ValidateServe(); err != nil {
		return PassReport{}, err
	}
	logger, err := newLogger(cfg)
	if err != nil {
		return PassReport{}, err
	}
	st, err := openStore(ctx, cfg.PaydbURL, 2)
	if err != nil {
		return PassReport{}, fmt.Errorf("paydb: %w", err)
	}
	defer st.close()
	if err := st.requireSchema(ctx); err != nil {
		return PassReport{}, err
	}
	statement := newStatementClient(cfg.RailProxyURL)
	defer statement.close()
	settles := newSettleClient(cfg.PaymentResourceURL, cfg.SettleToken)
	defer settles.close()
	r := &reconciler{store: st, statement: statement, settles: settles, metrics: newMetrics(prometheus.NewRegistry()),
		logger: logger, settleAfter: cfg.SettleAfter}
	return r.runPass(ctx)
}

// loop runs a pass, then waits interval, until ctx ends.
func (r *reconciler) loop(ctx context.Context, interval time.Duration) {
	for {
		_, _ = r.runPass(ctx)
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// Migrate applies paydb's whole migration tree and returns. Concurrent and
// repeated runs are safe (goose holds an advisory lock).
func Migrate(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	logger, err := newLogger(cfg)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, cfg.PaydbURL, 2)
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
