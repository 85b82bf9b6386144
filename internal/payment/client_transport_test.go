package payment_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/internal/payment"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// A claim or a post is presented once. A 307 (or 308) comes back
// as an error, and the address it names receives nothing — whatever http.Client
// the caller handed in.
func TestClientFollowsNoRedirect(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("/elsewhere/", func(w http.ResponseWriter, _ *http.Request) {
		elsewhere.Add(1)
		lockapi.WriteJSON(w, 200, lockapi.Payout{PayoutID: "p-1", Status: lockapi.StatusClaimed})
	})
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		code := http.StatusTemporaryRedirect
		if r.URL.Query().Get("status") == "PENDING" {
			code = http.StatusPermanentRedirect
		}
		http.Redirect(w, r, "/elsewhere"+r.URL.Path, code)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx := context.Background()
	for name, c := range map[string]*payment.Client{
		"NewClient":         payment.NewClient(srv.URL),
		"a caller's client": {BaseURL: srv.URL, HTTP: &http.Client{Timeout: 5 * time.Second}},
	} {
		if _, err := c.Claim(ctx, "p-1", 7, "exec-a"); err == nil {
			t.Errorf("%s: a claim answered 307 succeeded", name)
		}
		if _, err := c.Post(ctx, "p-1", 7, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous}); err == nil {
			t.Errorf("%s: a post answered 307 succeeded", name)
		}
		if _, err := c.List(ctx, "PENDING", "", nil, 0); err == nil {
			t.Errorf("%s: a list answered 308 succeeded", name)
		}
		var p *lockapi.Problem
		if _, err := c.Get(ctx, "p-1"); err == nil || errors.As(err, &p) {
			t.Errorf("%s: a get answered 307: %v, want a plain error", name, err)
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the redirect target received %d requests, want none", n)
	}
}

const envProxyChild = "PAYMENT_CLIENT_ENV_PROXY_CHILD"

// HTTP_PROXY and HTTPS_PROXY change nothing: the client talks
// to payment-resource directly, so no proxy can retry a claim or a post on its
// own. The proxy settings are read once per process, so a child process runs the
// client with them set; it calls a name that does not resolve (loopback
// addresses are never proxied): directly, that fails at once; through the
// environment's proxy, the proxy would receive it.
func TestClientIgnoresEnvironmentProxy(t *testing.T) {
	if testkit.InChild(envProxyChild) {
		req, _ := http.NewRequest(http.MethodPost, "http://payment-resource.invalid:8082/v1/payouts/p-1/claim", nil)
		if u, err := http.ProxyFromEnvironment(req); err != nil || u == nil {
			t.Fatalf("the environment's proxy is not in effect in the child (%v, %v): the test would prove nothing", u, err)
		}
		c := payment.NewClient("http://payment-resource.invalid:8082")
		c.Timeout = 5 * time.Second
		_, _ = c.Claim(context.Background(), "p-1", 7, "exec-a")
		_, _ = c.Post(context.Background(), "p-1", 7, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous})
		return
	}
	t.Parallel()
	var seen atomic.Int32
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		seen.Add(1)
		lockapi.WriteJSON(w, 200, lockapi.Payout{PayoutID: "p-1"})
	}))
	defer proxy.Close()
	testkit.RerunInChild(t, envProxyChild, testkit.ProxyEnv(proxy.URL)...)
	if n := seen.Load(); n != 0 {
		t.Fatalf("the environment's proxy received %d requests, want none", n)
	}
}
