package testkit

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"lock.dev/lockapi"
)

// EnvironmentProxyUnused checks that a client never sends its requests through
// the proxy HTTP_PROXY and HTTPS_PROXY name: a proxy could retry a request that
// moves money or hands out a token. call makes the client's requests to url, a
// name that does not resolve (loopback addresses are never proxied): directly,
// they fail at once; through the environment's proxy, the proxy would receive
// them, answering answer as JSON. The proxy settings are read once per process,
// so call runs in a child process (t's test again, told apart by childEnv) with
// them set; t fails when the proxy received anything. Call it first in a
// top-level test: it marks the parent's test parallel.
func EnvironmentProxyUnused(t *testing.T, childEnv, url string, answer any, call func()) {
	if InChild(childEnv) {
		req, _ := http.NewRequest(http.MethodPost, url, nil)
		if u, err := http.ProxyFromEnvironment(req); err != nil || u == nil {
			t.Fatalf("the environment's proxy is not in effect in the child (%v, %v): the test would prove nothing", u, err)
		}
		call()
		return
	}
	t.Parallel()
	var seen atomic.Int32
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		seen.Add(1)
		lockapi.WriteJSON(w, http.StatusOK, answer)
	}))
	defer proxy.Close()
	RerunInChild(t, childEnv, ProxyEnv(proxy.URL)...)
	if n := seen.Load(); n != 0 {
		t.Fatalf("the environment's proxy received %d requests, want none", n)
	}
}
