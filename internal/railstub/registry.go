package railstub

import (
	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/internal/identity"
	"lock.dev/internal/service"
)

// MetricsRegistry is rail-stub's registry as Run builds it, every family
// zero-initialised, without starting anything (service.Registry).
func MetricsRegistry() *prometheus.Registry {
	return service.Registry(func(reg prometheus.Registerer) { newMetrics(reg) },
		identity.AuthFamilies, identity.ExpiryFamilies, identity.AuthzFamilies(guardedRoutes()...))
}
