package payment

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/grant"
	"lock.dev/internal/serve"
)

// MetricsRegistry is payment-resource's registry as Run builds it — the Go and
// process collectors and every payment-resource family, zero-initialised
// (docs/contracts/observability.md) — without starting anything. Deployment checks
// read metric names from it, so that a dashboard panel or an alert rule naming a
// metric the service does not export fails a test (internal/deploytest).
func MetricsRegistry() *prometheus.Registry {
	reg := serve.NewRegistry()
	_, _ = newMetrics(reg) // registering in a fresh registry cannot clash
	// db_synchronous_standbys, as Run registers it when it checks the database.
	_ = dbconn.RegisterPreconditionMetrics(reg)
	// grant_rejected_total, as Run registers it whether or not grants are verified.
	_, _ = grant.NewGate(nil, 0, reg, slog.New(slog.DiscardHandler))
	return reg
}
