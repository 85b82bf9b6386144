package lockserver

import (
	"log/slog"
	"testing"

	"lock.dev/api"
	"lock.dev/internal/apitest"
	"lock.dev/internal/serve"
)

// lock-server serves its own OpenAPI document at GET /openapi.json.
func TestServesItsOpenAPIDocument(t *testing.T) {
	reg := serve.NewRegistry()
	h := newServer(nil, newMetrics(reg), serve.NewHealth(), reg, slog.New(slog.DiscardHandler), DefaultConfig(), grants{})
	apitest.ServesDocument(t, h, api.LockServer)
}
