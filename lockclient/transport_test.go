package lockclient_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// An acquire answered 307 is an error, not a second request.
func TestAcquireFollowsNoRedirect(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("/elsewhere/", func(w http.ResponseWriter, _ *http.Request) {
		elsewhere.Add(1)
		lockapi.WriteJSON(w, 200, lockapi.Lease{LockName: "account:a", OwnerID: "o", Token: 1, TTLMs: 1000})
	})
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere"+r.URL.Path, http.StatusTemporaryRedirect)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	if l, err := lockclient.New(srv.URL).Acquire(context.Background(), "account:a", "o", time.Second); err == nil {
		_ = l.Release(context.Background())
		t.Fatal("an acquire answered 307 succeeded")
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the redirect target received %d requests, want none", n)
	}
}

const envProxyChild = "LOCKCLIENT_ENV_PROXY_CHILD"

// HTTP_PROXY and HTTPS_PROXY change nothing: an acquire goes to
// lock-server directly, so no proxy can retry it (a second grant to the same
// owner would hand out a token nobody learns). The proxy settings are read once
// per process, so a child process runs the client with them set; it calls a name
// that does not resolve (loopback addresses are never proxied): directly, that
// fails at once; through the environment's proxy, the proxy would receive it.
func TestAcquireIgnoresEnvironmentProxy(t *testing.T) {
	if testkit.InChild(envProxyChild) {
		req, _ := http.NewRequest(http.MethodPost, "http://lock-server.invalid:8081/v1/locks/account:a/acquire", nil)
		if u, err := http.ProxyFromEnvironment(req); err != nil || u == nil {
			t.Fatalf("the environment's proxy is not in effect in the child (%v, %v): the test would prove nothing", u, err)
		}
		c := lockclient.New("http://lock-server.invalid:8081", lockclient.WithRequestTimeout(5*time.Second))
		if l, err := c.Acquire(context.Background(), "account:a", "o", time.Second); err == nil {
			_ = l.Release(context.Background())
		}
		return
	}
	t.Parallel()
	var seen atomic.Int32
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		seen.Add(1)
		lockapi.WriteJSON(w, 200, lockapi.Lease{LockName: "account:a", OwnerID: "o", Token: 1, TTLMs: 1000})
	}))
	defer proxy.Close()
	testkit.RerunInChild(t, envProxyChild, testkit.ProxyEnv(proxy.URL)...)
	if n := seen.Load(); n != 0 {
		t.Fatalf("the environment's proxy received %d requests, want none", n)
	}
}
