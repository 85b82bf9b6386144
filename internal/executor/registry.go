package executor

import (
	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/internal/identity"
	"lock.dev/internal/service"
)

// MetricsRegistry is executor's registry as Run builds it, every family
// zero-initialised, without starting anything (service.Registry): its own, and
// auth_enabled and tls_cert_expiry_seconds (it serves no routes a role guards).
func MetricsRegistry() *prometheus.Registry {
	return service.Registry(func(reg prometheus.Registerer) { _, _ = newMetrics(reg) },
		identity.AuthFamilies, identity.ExpiryFamilies)
}
