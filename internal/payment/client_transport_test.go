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

// HTTP_PROXY and HTTPS_PROXY change nothing: the client talks to
// payment-resource directly, so no proxy can retry a claim or a post on its own.
func TestClientIgnoresEnvironmentProxy(t *testing.T) {
	const url = "http://payment-resource.invalid:8082"
	testkit.EnvironmentProxyUnused(t, "PAYMENT_CLIENT_ENV_PROXY_CHILD", url+"/v1/payouts/p-1/claim", lockapi.Payout{PayoutID: "p-1"}, func() {
		c := payment.NewClient(url)
		c.Timeout = 5 * time.Second
		_, _ = c.Claim(context.Background(), "p-1", 7, "exec-a")
		_, _ = c.Post(context.Background(), "p-1", 7, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous})
	})
}
