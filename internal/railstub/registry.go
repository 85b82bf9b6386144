package railstub

import (
	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/internal/serve"
)

// MetricsRegistry is rail-stub's registry as Run builds it — the Go and process
// collectors and every rail-stub family, zero-initialised
// (docs/contracts/observability.md) — without starting anything. Deployment checks
// read metric names from it, so that a dashboard panel or an alert rule naming a
// metric the service does not export fails a test (internal/deploytest).
func MetricsRegistry() *prometheus.Registry {
	reg := serve.NewRegistry()
	newMetrics(reg)
	return reg
}
