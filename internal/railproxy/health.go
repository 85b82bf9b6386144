package railproxy

import (
	"lock.dev/internal/serve"
)

// newHealth builds readiness (docs/contracts/observability.md): db, a ping of the paydb pool, and
// railStub, a GET of the rail's health within 1 s. A proxy that cannot reach the
// rail is taken out of service — it fails closed — rather than admitting
// submissions it cannot deliver. Liveness touches neither.
func newHealth(store *Store, rail *railClient) *serve.Health {
	h := serve.NewHealth()
	h.Add("db", store.Ping)
	h.Add("railStub", rail.Healthy)
	return h
}
