package lockserver

import (
	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/internal/identity"
	"lock.dev/internal/service"
)

// MetricsRegistry is lock-server's registry as Run builds it, every family
// zero-initialised, without starting anything (service.Registry).
func MetricsRegistry() *prometheus.Registry {
	return service.Registry(func(reg prometheus.Registerer) { newMetrics(reg) }, service.DatabaseFamilies,
		identity.AuthFamilies, identity.ExpiryFamilies, identity.AuthzFamilies(routes...))
}
