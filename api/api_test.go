package api

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// That each document is valid OpenAPI 3.1, with examples that match their
// schemas, is tested with libopenapi in the module lock.dev/checks
// (checks/cmd/apivalidate/documents_test.go), so that lock.dev's go.mod does
// not require it.

// Each service's handler serves exactly its document at GET /openapi.json.
func TestHandlerServesTheDocument(t *testing.T) {
	for _, s := range Services() {
		want, _ := Document(s)
		rec := httptest.NewRecorder()
		Handler(s).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.json", nil))
		if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("%s: status %d, content type %q", s, rec.Code, rec.Header().Get("Content-Type"))
		}
		got, _ := io.ReadAll(rec.Body)
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: served bytes differ from the embedded document", s)
		}
	}
	rec := httptest.NewRecorder()
	Handler("reconciler").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.json", nil))
	if rec.Code != http.StatusInternalServerError || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("a service without a document: status %d, content type %q; want a 500 problem", rec.Code, rec.Header().Get("Content-Type"))
	}
}
