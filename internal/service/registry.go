package service

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/grant"
	"lock.dev/internal/serve"
)

// Registry is a service's registry as its Run builds it — the Go and process
// collectors and every family register adds, zero-initialised — without starting
// anything. Each service's MetricsRegistry is one call of it; deployment checks
// read metric names from those, so that a dashboard panel or an alert rule naming
// a metric the service does not export fails a test (checks/deploytest).
func Registry(register ...func(prometheus.Registerer)) *prometheus.Registry {
	reg := serve.NewRegistry()
	for _, r := range register {
		r(reg)
	}
	return reg
}

// DatabaseFamilies registers what OpenDB registers when it checks the database:
// db_synchronous_standbys.
func DatabaseFamilies(reg prometheus.Registerer) {
	_ = dbconn.RegisterPreconditionMetrics(reg)
}

// GrantFamilies registers what a grant.Gate registers whether or not grants are
// verified: grant_rejected_total and grant_without_wid_total.
func GrantFamilies(reg prometheus.Registerer) {
	_, _ = grant.NewGate(nil, 0, reg, slog.New(slog.DiscardHandler))
}
