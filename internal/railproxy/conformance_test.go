package railproxy

import (
	"net"
	"net/http"
	"testing"

	"lock.dev/api"
	"lock.dev/internal/apitest"
	"lock.dev/internal/pgtest"
)

// conformance checks every exchange of the tests with a rail-proxy against
// api/rail-proxy.json (startProxy tracks each proxy, and testHTTP, pollHTTP
// and http.DefaultClient carry the traffic; a finding fails the test that made
// the exchange) and collects which documented answers were seen. TestMain then
// fails the run on any documented answer no test provoked, less these
// exemptions.
var conformance = apitest.MustNew(api.RailProxy)

var exempt = []apitest.Exemption{
	// rail-proxy answers 500 INTERNAL only from serve.Handler's recovery of a
	// handler panic: every store or rail failure it knows is a 503 (or the
	// submission's own 409/422). No test can cause a panic without changing
	// the code.
	apitest.Exempt("", "", 500, "only a handler panic answers 500"),
}

// The answers the behavioural tests have no reason to give: the aliases
// (docs/contracts/observability.md) (UP with a rail, DOWN without one) and the
// document itself.
func TestConformanceRareAnswers(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	up := startProxy(t, testConfig(pgtest.PaydbURL(t), rail.URL))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + ln.Addr().String()
	_ = ln.Close()
	down := startProxy(t, testConfig(pgtest.PaydbURL(t), deadURL))
	for _, c := range []struct {
		p    *proxy
		path string
		want int
	}{
		{up, "/actuator/health/liveness", http.StatusOK},
		{up, "/actuator/health/readiness", http.StatusOK},
		{up, "/actuator/health", http.StatusOK},
		{up, "/openapi.json", http.StatusOK},
		{down, "/actuator/health/liveness", http.StatusOK},
		{down, "/actuator/health/readiness", http.StatusServiceUnavailable},
		{down, "/actuator/health", http.StatusServiceUnavailable},
	} {
		resp, err := testHTTP.Get(c.p.URL + c.path)
		if err != nil {
			t.Fatalf("GET %s: %v", c.path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("GET %s: %d, want %d", c.path, resp.StatusCode, c.want)
		}
	}
}
