package payment

import (
	"log/slog"
	"testing"

	"lock.dev/api"
	"lock.dev/internal/apitest"
	"lock.dev/internal/identity"
	"lock.dev/internal/serve"
)

// payment-resource serves its own OpenAPI document at GET /openapi.json.
func TestServesItsOpenAPIDocument(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	reg := serve.NewRegistry()
	h := newServer(&handlers{logger: logger}, identity.NewGuard(false, routes(), reg, logger), roles{}, serve.NewHealth(), reg)
	apitest.ServesDocument(t, h, api.PaymentResource)
}
