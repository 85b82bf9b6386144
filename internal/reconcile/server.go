package reconcile

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/internal/identity"
	"lock.dev/internal/paydb"
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
)

// Run serves the reconciler until ctx is cancelled: a pass at start-up, then one
// every RECONCILER_INTERVAL after the previous ended, with metrics and health on
// RECONCILER_ADDR. On cancellation the pass in progress stops at its next step (its
// open transaction rolls back; what it committed stands) and Run returns nil. It
// refuses to start on a paydb whose schema is behind.
func Run(ctx context.Context, cfg Config) error {
	return service.Run(cfg.spec(cfg.ValidateServe), func(sv *service.Service) error {
		// The statement copy and its exceptions are re-derived from the rail's
		// statement should paydb forget them, but a paydb with fsync off can forget
		// the payouts' settlements too: refused like the other services do.
		pool, err := sv.OpenDB(ctx)
		if err != nil {
			return err
		}
		st := &store{pool: pool, perAccount: cfg.StatementSource == SourceDir}
		logger, reg := sv.Logger, sv.Registry
		m := newMetrics(reg)
		peers, err := resolvePeers(sv.Identity, cfg)
		if err != nil {
			return err
		}
		settles := newSettleClient(cfg.PaymentResourceURL, cfg.SettleToken, peers.payment)
		defer settles.close()
		r := &reconciler{store: st, settles: settles, metrics: m, logger: logger, settleAfter: cfg.SettleAfter}
		source := []any{"statementSource", cfg.StatementSource}
		if st.perAccount {
			r.files = newStatementDir(cfg.StatementDir)
			source = append(source, "statementDir", cfg.StatementDir)
		} else {
			r.statement = newStatementClient(cfg.RailProxyURL, peers.proxy)
			defer r.statement.close()
			source = append(source, "railProxyURL", service.RedactURL(cfg.RailProxyURL), "railProxyId", peers.proxyID)
		}
		if seq, err := st.lastSeq(ctx); err == nil {
			m.statementSeq.Set(float64(seq))
		}

		if cfg.SettleAfter < shortSettleWindow {
			logger.Warn("RECONCILER_SETTLE_AFTER is short: a payout is settled NOT_PRESENTED when its call has not reached the statement this long after its attempt; a rail slower to record a call than this would make that wrong (caught later as LINE_CONTRADICTS_PAYOUT)",
				"event", "settle_window_short", "settleAfter", cfg.SettleAfter.String())
		}
		logger.Info("reconciler starting", append(source, "paymentResourceURL", service.RedactURL(cfg.PaymentResourceURL),
			"paymentResourceId", peers.paymentID,
			"interval", cfg.Interval.String(), "settleAfter", cfg.SettleAfter.String(), "paydbMaxConns", cfg.PaydbMaxConns)...)

		pctx, stopPasses := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { r.loop(pctx, cfg.Interval) })
		defer func() {
			stopPasses()
			wg.Wait()
		}()

		// Readiness: db, and railProxy answering its liveness within 1 s — without
		// both no pass can run (docs/contracts/reconciliation.md); in dir mode
		// statementDir, the directory readable, instead of railProxy.
		if r.files != nil {
			sv.Health.Add("statementDir", r.files.readable)
		} else {
			sv.Health.Add("railProxy", r.statement.livez)
		}
		mux := http.NewServeMux()
		serve.Mount(mux, sv.Health, reg)
		return sv.Serve(ctx, serve.Handler(mux, logger), serve.Serve, nil)
	})
}

// Pass runs one pass with cfg's settings and returns what it did: what Run does
// every RECONCILER_INTERVAL, once, for tests and for an operator's one-off run.
// Its metrics go to a registry of its own; its log to cfg.LogOutput.
func Pass(ctx context.Context, cfg Config) (PassReport, error) {
	if err := cfg.ValidateServe(); err != nil {
		return PassReport{}, err
	}
	// Fail closed like Run: without identity only under UNSAFE_NO_AUTH.
	if err := cfg.Identity.Check(); err != nil {
		return PassReport{}, err
	}
	logger, err := service.NewLogger(cfg.LogOutput, ServiceName, cfg.LogLevel)
	if err != nil {
		return PassReport{}, err
	}
	var src *identity.Source
	if cfg.Identity.Enabled() {
		// One pass: the files are read once, not watched.
		if src, err = identity.Load(cfg.Identity, logger); err != nil {
			return PassReport{}, err
		}
	}
	peers, err := resolvePeers(src, cfg)
	if err != nil {
		return PassReport{}, err
	}
	st, err := openStore(ctx, cfg.PaydbURL, 2)
	if err != nil {
		return PassReport{}, fmt.Errorf("paydb: %w", err)
	}
	defer st.close()
	if err := paydb.Tree().RequireCurrent(ctx, st.pool, ServiceName+" migrate"); err != nil {
		return PassReport{}, err
	}
	settles := newSettleClient(cfg.PaymentResourceURL, cfg.SettleToken, peers.payment)
	defer settles.close()
	r := &reconciler{store: st, settles: settles, metrics: newMetrics(prometheus.NewRegistry()),
		logger: logger, settleAfter: cfg.SettleAfter}
	if cfg.StatementSource == SourceDir {
		st.perAccount = true
		r.files = newStatementDir(cfg.StatementDir)
	} else {
		r.statement = newStatementClient(cfg.RailProxyURL, peers.proxy)
		defer r.statement.close()
	}
	return r.runPass(ctx)
}

// peerTLS is the TLS configuration of each of the reconciler's clients, both
// presenting its SVID and expecting their server's SPIFFE ID; nil without
// identity (UNSAFE_NO_AUTH: plaintext). The IDs are for the log.
type peerTLS struct {
	proxy, payment     *tls.Config
	proxyID, paymentID string
}

// resolvePeers reads RAIL_PROXY_ID and PAYMENT_RESOURCE_ID, whose defaults are
// in the reconciler's own trust domain: known only once src, its SVID, is
// loaded (docs/contracts/workload-identity.md). src nil: no identity.
func resolvePeers(src *identity.Source, cfg Config) (peerTLS, error) {
	if src == nil {
		return peerTLS{}, nil
	}
	td := src.TrustDomain()
	paymentID, err := identity.ParsePeer("PAYMENT_RESOURCE_ID", cfg.PaymentResourceID, td, identity.NamePaymentResource)
	if err != nil {
		return peerTLS{}, err
	}
	p := peerTLS{payment: src.ClientConfig(paymentID), paymentID: paymentID.String()}
	if cfg.StatementSource == SourceDir {
		return p, nil // rail-proxy is not called: its identity is not needed
	}
	proxyID, err := identity.ParsePeer("RAIL_PROXY_ID", cfg.RailProxyID, td, identity.NameRailProxy)
	if err != nil {
		return peerTLS{}, err
	}
	p.proxy, p.proxyID = src.ClientConfig(proxyID), proxyID.String()
	return p, nil
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
	return service.Migrate(ctx, cfg.spec(cfg.Validate))
}
