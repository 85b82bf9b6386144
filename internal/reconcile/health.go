package reconcile

import (
	"lock.dev/internal/serve"
)

// newHealth builds readiness (docs/contracts/reconciliation.md): db, a ping of the paydb pool,
// and railProxy, rail-proxy answering its liveness within 1 s — without both no
// pass can run. Liveness touches neither.
func newHealth(st *store, statement *statementClient) *serve.Health {
	h := serve.NewHealth()
	h.Add("db", st.ping)
	h.Add("railProxy", statement.livez)
	return h
}
