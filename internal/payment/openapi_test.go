package payment

import (
	"log/slog"
	"testing"

	"lock.dev/api"
	"lock.dev/internal/apitest"
	"lock.dev/internal/serve"
)

// payment-resource serves its own OpenAPI document at GET /openapi.json.
func TestServesItsOpenAPIDocument(t *testing.T) {
	h := newServer(&handlers{logger: slog.New(slog.DiscardHandler)}, serve.NewHealth(), serve.NewRegistry())
	apitest.ServesDocument(t, h, api.PaymentResource)
}
