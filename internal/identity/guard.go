package identity

import (
	"log/slog"
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/lockapi"
)

// Guard authorises each route's callers by their SPIFFE IDs
// (docs/contracts/workload-identity.md). A caller without the route's role gets
// 403 FORBIDDEN naming its identity, is logged (forbidden, WARN) and counted
// (authz_denied_total{route}); the route's handler does not run, so nothing is
// written and nothing called.
type Guard struct {
	enabled bool // false under UNSAFE_NO_AUTH without TLS: no caller can be named
	logger  *slog.Logger
	denied  *prometheus.CounterVec
}

// NewGuard is the Guard of a service whose routes (the operationIds of its
// OpenAPI document) are routes; authz_denied_total is registered in reg with
// every route at zero. enabled is whether the service serves mutual TLS: a
// disabled Guard lets every caller through (UNSAFE_NO_AUTH, logged at start).
func NewGuard(enabled bool, routes []string, reg prometheus.Registerer, logger *slog.Logger) *Guard {
	g := &Guard{enabled: enabled, logger: logger, denied: newDenied()}
	for _, r := range routes {
		g.denied.WithLabelValues(r)
	}
	_ = reg.Register(g.denied)
	return g
}

func newDenied() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "authz_denied_total",
		Help: "Requests refused 403 FORBIDDEN: the caller's workload lacks the route's role."}, []string{"route"})
}

// AuthzFamilies registers authz_denied_total with routes at zero, as NewGuard
// does, for a registry built without running the service (deployment checks).
func AuthzFamilies(routes ...string) func(prometheus.Registerer) {
	return func(reg prometheus.Registerer) {
		d := newDenied()
		for _, r := range routes {
			d.WithLabelValues(r)
		}
		_ = reg.Register(d)
	}
}

// Enabled reports whether callers are verified.
func (g *Guard) Enabled() bool { return g.enabled }

// Allow runs h for callers whose SPIFFE ID is one of allowed, and refuses every
// other caller of route. A request with no verified peer on a service that
// requires one is refused too: fail closed.
func (g *Guard) Allow(route string, allowed []spiffeid.ID, h http.HandlerFunc) http.HandlerFunc {
	if !g.enabled {
		return h
	}
	denied := g.denied.WithLabelValues(route)
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := PeerID(r)
		if err == nil && slices.Contains(allowed, id) {
			h(w, r)
			return
		}
		who := id.String()
		if err != nil {
			who = ""
		}
		denied.Inc()
		g.logger.Warn("request refused: the caller's workload lacks the route's role; nothing written, nothing called",
			"event", "forbidden", "identity", who, "route", route)
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeForbidden,
			"this workload may not call "+route, map[string]any{"identity": who}))
	}
}

// Caller is the verified SPIFFE ID of r's caller as recorded with a write
// (docs/contracts/workload-identity.md, who did it): "" when the service runs
// without identities, so a record says plainly that nobody was verified.
func (g *Guard) Caller(r *http.Request) string {
	if !g.enabled {
		return ""
	}
	id, err := PeerID(r)
	if err != nil {
		return ""
	}
	return id.String()
}
