package lockclient_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// A worker waits for an account's lock, works under it, and gives it back.
func ExampleClient_Lock() {
	lockServer := exampleLockServer() // in production: https://lock-server:8081 over mutual TLS
	defer lockServer.Close()
	c, err := lockclient.New(lockServer.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	// How long this worker is willing to wait for the lock.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := c.Lock(ctx, lockapi.AccountLockName("acct-7"), "worker-1", 15*time.Second)
	if err != nil {
		fmt.Println("no lease:", err)
		return
	}
	// Work under lease.Context(): it ends the moment the client can no longer
	// vouch for the lease. Every write carries lease.Token().
	fmt.Println("holding", lease.Name(), "with token", lease.Token())
	if err := lease.Release(context.WithoutCancel(ctx)); err != nil {
		fmt.Println("release:", err)
	}
	fmt.Println(lease.Err())
	// Output:
	// holding account:acct-7 with token 42
	// lockclient: lease released
}

// The lease travels with every write, so the resource can compare its token
// with the highest it has seen and refuse a stale holder.
func ExampleLease_SetHeaders() {
	lockServer := exampleLockServer()
	defer lockServer.Close()
	resource := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("token", r.Header.Get(lockapi.HeaderFencingToken), "owner", r.Header.Get(lockapi.HeaderOwnerID),
			"grant", r.Header.Get(lockapi.HeaderFencingGrant))
		w.WriteHeader(http.StatusNoContent)
	}))
	defer resource.Close()

	c, _ := lockclient.New(lockServer.URL)
	lease, err := c.Lock(context.Background(), lockapi.AccountLockName("acct-7"), "worker-1", 15*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer lease.Release(context.Background())

	req, _ := http.NewRequestWithContext(lease.Context(), http.MethodPost, resource.URL+"/v1/payouts/p-1/claim", nil)
	lease.SetHeaders(req)
	resp, err := resource.Client().Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	// Output:
	// token 42 owner worker-1 grant example-grant-of-42
}

// Transport does the same for every request of an HTTP client, and sends
// nothing once the lease has ended.
func ExampleLease_Transport() {
	lockServer := exampleLockServer()
	defer lockServer.Close()
	resource := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println(r.Method, r.URL.Path, "token", r.Header.Get(lockapi.HeaderFencingToken))
	}))
	defer resource.Close()

	c, _ := lockclient.New(lockServer.URL)
	lease, err := c.Lock(context.Background(), lockapi.AccountLockName("acct-7"), "worker-1", 15*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	hc := &http.Client{Transport: lease.Transport(resource.Client().Transport), Timeout: 5 * time.Second}
	if resp, err := hc.Post(resource.URL+"/v1/ledger", "application/json", nil); err == nil {
		resp.Body.Close()
	}
	_ = lease.Release(context.Background())
	_, err = hc.Post(resource.URL+"/v1/ledger", "application/json", nil)
	fmt.Println("after release, refused:", errors.Is(err, lockclient.ErrReleased))
	// Output:
	// POST /v1/ledger token 42
	// after release, refused: true
}

// exampleLockServer answers as lock-server does for one lock — first LOCK_HELD
// (someone else holds it), then a grant of token 42 — so that the examples
// run and print what they say. The package's tests run against the real
// lock-server on a real lockdb.
func exampleLockServer() *httptest.Server {
	var acquires atomic.Int32
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now().UTC()
		lease := lockapi.Lease{LockName: "account:acct-7", OwnerID: r.Header.Get(lockapi.HeaderOwnerID), Token: 42,
			AcquiredAt: now, ExpiresAt: now.Add(15 * time.Second), TTLMs: 15000, Grant: "example-grant-of-42"}
		switch r.URL.Path {
		case "/v1/locks/account:acct-7/acquire":
			if acquires.Add(1) == 1 {
				lockapi.WriteProblem(w, lockapi.NewProblem(http.StatusConflict, lockapi.CodeLockHeld, "",
					map[string]any{"holder": "worker-0", "expiresAt": now.Add(time.Second)}))
				return
			}
			lockapi.WriteJSON(w, http.StatusOK, lease)
		case "/v1/locks/account:acct-7/renew":
			lockapi.WriteJSON(w, http.StatusOK, lease)
		case "/v1/locks/account:acct-7/release":
			w.WriteHeader(http.StatusNoContent)
		default:
			http.NotFound(w, r)
		}
	}))
}
