package railproxy

import (
	"log/slog"
	"net/http"
	"testing"

	"lock.dev/api"
	"lock.dev/internal/apitest"
	"lock.dev/internal/serve"
)

// rail-proxy serves its own OpenAPI document at GET /openapi.json.
func TestServesItsOpenAPIDocument(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	mux := http.NewServeMux()
	routes(mux, &admitter{rail: &railClient{}, metrics: &metrics{}}, nil, nil, logger)
	apitest.ServesDocument(t, serve.Handler(mux, logger), api.RailProxy)
}
