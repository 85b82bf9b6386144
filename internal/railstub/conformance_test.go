package railstub

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"lock.dev/api"
	"lock.dev/internal/apitest"
	"lock.dev/lockapi"
)

// conformance checks every exchange with a stub that startStub serves against
// api/rail-stub.json (the handler is wrapped; a finding fails the test that
// made the exchange) and collects which documented answers were seen.
var conformance = apitest.MustNew(api.RailStub)

// TestMain runs the tests, then fails the run on a finding no test was told of
// and on a documented answer no test provoked, less these exemptions.
func TestMain(m *testing.M) { os.Exit(conformance.Finish(m.Run(), exempt...)) }

var exempt = append(apitest.ServeEndpoints500(),
	// The call list, the chaos settings and health answer from memory: their
	// 500 is only a panic's.
	apitest.Exempt("GET", "/rail/v1/calls", 500, "no failure path but a panic"),
	apitest.Exempt("GET", "/rail/v1/admin/chaos", 500, "no failure path but a panic"),
	apitest.Exempt("PUT", "/rail/v1/admin/chaos", 500, "no failure path but a panic"),
	apitest.Exempt("GET", "/rail/v1/health", 500, "health has no error path but a panic"),
	apitest.Exempt("GET", "/iso20022/health", 500, "health has no error path but a panic"),
	apitest.Exempt("GET", "/iso20022/camt.053", 500, "only when isomsg cannot write a statement of calls the stub checked it can list"))

// The answers the behavioural tests have no reason to give: the aliases
// (docs/contracts/observability.md), the document itself, 413 on the chaos
// settings, and a call log that takes writes but cannot sync them (a pipe: fsync
// fails) — the payment booked but not durable is 500 INTERNAL, the reset that
// cannot truncate it 500, and readiness DOWN on every path.
func TestConformanceRareAnswers(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	ts := startStub(t, func(c *Config) { c.CallLogPath = path })
	do := func(method, p, contentType string, body []byte, want int) reply {
		t.Helper()
		r, err := send(t.Context(), http.DefaultClient, ts.URL, method, p, contentType, body)
		if err != nil {
			t.Fatalf("%s %s: %v", method, p, err)
		}
		if r.status != want {
			t.Errorf("%s %s: %d %s, want %d", method, p, r.status, r.body, want)
		}
		return r
	}
	for _, p := range []string{"/actuator/health/liveness", "/actuator/health/readiness", "/actuator/health", "/openapi.json"} {
		do(http.MethodGet, p, "", nil, http.StatusOK)
	}
	big := append([]byte(`{"latencyMs":0,"x":"`), bytes.Repeat([]byte("a"), 70<<10)...)
	problem(t, do(http.MethodPut, "/rail/v1/admin/chaos", "application/json", append(big, `"}`...), http.StatusRequestEntityTooLarge),
		http.StatusRequestEntityTooLarge, lockapi.CodeInvalidRequest)

	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	ts.calls.mu.Lock()
	logFile := ts.calls.file
	ts.calls.file = pw
	ts.calls.mu.Unlock()
	problem(t, pay(t, ts, payment("p-1")), http.StatusInternalServerError, lockapi.CodeInternal)
	problem(t, do(http.MethodDelete, "/rail/v1/calls", "", nil, http.StatusInternalServerError), http.StatusInternalServerError, lockapi.CodeInternal)
	for _, p := range []string{"/readyz", "/actuator/health/readiness", "/actuator/health"} {
		do(http.MethodGet, p, "", nil, http.StatusServiceUnavailable)
	}
	// Give the stub its file back, so that it closes cleanly.
	ts.calls.mu.Lock()
	ts.calls.file = logFile
	ts.calls.mu.Unlock()
	_ = pw.Close()
}
