package railstub

import (
	"io"
	"testing"

	"lock.dev/api"
	"lock.dev/internal/apitest"
)

// rail-stub serves its own OpenAPI document at GET /openapi.json.
func TestServesItsOpenAPIDocument(t *testing.T) {
	cfg := DefaultConfig()
	cfg.LogOutput = io.Discard
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	apitest.ServesDocument(t, s.Handler(), api.RailStub)
}
