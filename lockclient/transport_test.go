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
	if l, err := newClient(t, srv.URL).Acquire(context.Background(), "account:a", "o", time.Second); err == nil {
		_ = l.Release(context.Background())
		t.Fatal("an acquire answered 307 succeeded")
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the redirect target received %d requests, want none", n)
	}
}

// HTTP_PROXY and HTTPS_PROXY change nothing: an acquire goes to lock-server
// directly, so no proxy can retry it (a second grant to the same owner would
// hand out a token nobody learns).
func TestAcquireIgnoresEnvironmentProxy(t *testing.T) {
	const url = "http://lock-server.invalid:8081"
	testkit.EnvironmentProxyUnused(t, "LOCKCLIENT_ENV_PROXY_CHILD", url+"/v1/locks/account:a/acquire",
		lockapi.Lease{LockName: "account:a", OwnerID: "o", Token: 1, TTLMs: 1000}, func() {
			c := newClient(t, url, lockclient.WithRequestTimeout(5*time.Second))
			if l, err := c.Acquire(context.Background(), "account:a", "o", time.Second); err == nil {
				_ = l.Release(context.Background())
			}
		})
}
