package lockserver

import (
	"log/slog"
	"testing"

	"lock.dev/api"
	"lock.dev/internal/apitest"
	"lock.dev/internal/identity"
	"lock.dev/internal/serve"
)

// lock-server serves its own OpenAPI document at GET /openapi.json.
func TestServesItsOpenAPIDocument(t *testing.T) {
	reg := serve.NewRegistry()
	logger := slog.New(slog.DiscardHandler)
	// about the document, not identity (docs/contracts/workload-identity.md): a guard that verifies nobody.
	acc := access{guard: identity.NewGuard(false, routes, reg, logger)}
	h := newServer(nil, newMetrics(reg), serve.NewHealth(), reg, logger, DefaultConfig(), grants{}, acc)
	apitest.ServesDocument(t, h, api.LockServer)
}
