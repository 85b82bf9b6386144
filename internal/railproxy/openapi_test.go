package railproxy

import (
	"log/slog"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/api"
	"lock.dev/internal/apitest"
	"lock.dev/internal/identity"
	"lock.dev/internal/serve"
)

// rail-proxy serves its own OpenAPI document at GET /openapi.json.
func TestServesItsOpenAPIDocument(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	mux := http.NewServeMux()
	guard := identity.NewGuard(false, guardedRoutes, prometheus.NewRegistry(), logger)
	routes(mux, &admitter{rail: &railClient{}, metrics: &metrics{}}, nil, nil, guard, roles{}, logger)
	apitest.ServesDocument(t, serve.Handler(mux, logger), api.RailProxy)
}
