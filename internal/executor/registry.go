package executor

import (
	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/internal/serve"
)

// MetricsRegistry is executor's registry as Run builds it — the Go and process
// collectors and every executor family, zero-initialised
// (docs/contracts/observability.md) — without starting anything. Deployment checks
// read metric names from it, so that a dashboard panel or an alert rule naming a
// metric the service does not export fails a test (internal/deploytest).
func MetricsRegistry() *prometheus.Registry {
	reg := serve.NewRegistry()
	_, _ = newMetrics(reg) // registering in a fresh registry cannot clash
	return reg
}
