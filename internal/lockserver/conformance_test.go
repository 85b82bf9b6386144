package lockserver

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	"lock.dev/api"
	"lock.dev/internal/apitest"
	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// conformance checks every exchange of the tests with a lock-server against
// api/lock-server.json (startServer tracks each server, testHTTP carries the
// traffic; a finding fails the test that made the exchange) and collects which
// documented answers were seen. TestMain then fails the run on any documented
// answer no test provoked, less these exemptions.
var conformance = apitest.MustNew(api.LockServer)

var exempt = append(apitest.ServeEndpoints500(),
	// The published key set answers from memory: its 500 is only a panic's.
	apitest.Exempt("GET", "/v1/keys", 500, "no failure path but a panic"))

// The answers the behavioural tests have no reason to give: the aliases
// (docs/contracts/observability.md), the document itself, 413 on renew, 503 on the
// grant history, and the 500 INTERNAL of every lease call, provoked by taking
// lockdb's tables away from a running server (an error PostgreSQL reports that is
// not unavailability).
func TestConformanceRareAnswers(t *testing.T) {
	t.Parallel()
	s, proxy := startBehindProxy(t)
	status := func(method, u string, h http.Header, body []byte) answer {
		t.Helper()
		a, err := send(method, u, h, body)
		if err != nil {
			t.Fatalf("%s %s: %v", method, u, err)
		}
		return a
	}
	for _, p := range []string{"/actuator/health/liveness", "/actuator/health/readiness", "/actuator/health", "/openapi.json"} {
		if a := status(http.MethodGet, s.URL+p, nil, nil); a.Status != http.StatusOK {
			t.Errorf("GET %s: %v, want 200", p, a)
		}
	}
	l := mustAcquire(t, s.URL, "c", "a", 60000)
	big := append([]byte(`{"ttlMs":1000,"x":"`), bytes.Repeat([]byte("a"), 70<<10)...)
	a := status(http.MethodPost, lockURL(s.URL, "c", "/renew"), leaseHeaders("a", l.Token), append(big, `"}`...))
	wantProblem(t, "renew with a 70 KiB body", a, http.StatusRequestEntityTooLarge, lockapi.CodeInvalidRequest)

	proxy.Down()
	for _, p := range []string{"/actuator/health/readiness", "/actuator/health"} {
		if a := status(http.MethodGet, s.URL+p, nil, nil); a.Status != http.StatusServiceUnavailable {
			t.Errorf("GET %s with lockdb down: %v, want 503", p, a)
		}
	}
	a = status(http.MethodGet, lockURL(s.URL, "c", "/grants"), nil, nil)
	wantProblem(t, "grants with lockdb down", a, http.StatusServiceUnavailable, lockapi.CodeUnavailable)

	// A second server straight on a lockdb whose tables go away under it.
	dbURL2 := pgtest.LockdbURL(t)
	s2 := startServer(t, testConfig(dbURL2))
	l2 := mustAcquire(t, s2.URL, "c", "a", 60000)
	db := pgtest.Pool(t, dbURL2)
	if _, err := db.Exec(context.Background(), `ALTER TABLE lock_lease RENAME TO lock_lease_gone;
		ALTER TABLE lock_grant RENAME TO lock_grant_gone`); err != nil {
		t.Fatal(err)
	}
	for what, call := range map[string]func() (answer, error){
		"acquire": func() (answer, error) { a, _, err := acquireCall(s2.URL, "c", "b", 60000); return a, err },
		"renew":   func() (answer, error) { a, _, err := renewCall(s2.URL, "c", "a", l2.Token, 60000); return a, err },
		"release": func() (answer, error) { return releaseCall(s2.URL, "c", "a", l2.Token) },
		"get":     func() (answer, error) { return send(http.MethodGet, lockURL(s2.URL, "c", ""), nil, nil) },
		"grants":  func() (answer, error) { return send(http.MethodGet, lockURL(s2.URL, "c", "/grants"), nil, nil) },
	} {
		a, err := call()
		if err != nil {
			t.Fatalf("%s without tables: %v", what, err)
		}
		wantProblem(t, what+" without tables", a, http.StatusInternalServerError, lockapi.CodeInternal)
	}
}
