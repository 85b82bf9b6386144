package lockserver

import (
	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/serve"
)

// MetricsRegistry is lock-server's registry as Run builds it — the Go and process
// collectors and every lock-server family, zero-initialised
// (docs/contracts/observability.md) — without starting anything. Deployment checks
// read metric names from it, so that a dashboard panel or an alert rule naming a
// metric the service does not export fails a test (internal/deploytest).
func MetricsRegistry() *prometheus.Registry {
	reg := serve.NewRegistry()
	newMetrics(reg)
	// db_synchronous_standbys, as Run registers it when it checks the database.
	_ = dbconn.RegisterPreconditionMetrics(reg)
	return reg
}
