// Package api holds the OpenAPI 3.1 documents of the four HTTP services and
// serves each at GET /openapi.json. The documents are authored as JSON, the
// form they are served in, so the bytes a client reads are the bytes in this
// folder; no YAML library ships in the binaries for them.
//
// What the documents promise is checked against the code: api_test.go proves
// every service serves its own, checks/cmd/apivalidate's tests (in the module
// lock.dev/checks, which alone requires libopenapi) that each is a valid
// OpenAPI 3.1 document, and internal/apitest validates real requests and
// responses against them.
package api

import (
	"embed"
	"net/http"

	"lock.dev/lockapi"
)

// Service names a document: the service's binary name (docs/contracts/configuration.md).
type Service string

// The four services with a public HTTP API. The reconciler and the executor serve
// only health and metrics (docs/contracts/observability.md), which need no document
// of their own.
const (
	LockServer      Service = "lock-server"
	PaymentResource Service = "payment-resource"
	RailProxy       Service = "rail-proxy"
	RailStub        Service = "rail-stub"
)

// Services lists every service with a document.
func Services() []Service { return []Service{LockServer, PaymentResource, RailProxy, RailStub} }

//go:embed *.json
var documents embed.FS

// Document returns the service's OpenAPI document as served.
func Document(s Service) ([]byte, error) {
	return documents.ReadFile(string(s) + ".json")
}

// Handler serves the service's document (GET /openapi.json). A service without
// a document answers 500 INTERNAL as problem+json; the tests make that
// impossible for the four above.
func Handler(s Service) http.Handler {
	doc, err := Document(s)
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if err != nil {
			lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeInternal,
				"no OpenAPI document for this service", nil))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(doc)
	})
}
