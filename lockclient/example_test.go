package lockclient_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"lock.dev/fence"
	"lock.dev/internal/grant"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// A worker waits for an account's lock, works under it, and gives it back.
func ExampleClient_Lock() {
	lockServer := exampleLockServer(nil) // in production: https://lock-server:8081 over mutual TLS
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
	lockServer := exampleLockServer(nil)
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
	lockServer := exampleLockServer(nil)
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

// A fence point built with lock.dev/fence: the resource's middleware verifies
// the grant the lease carries, so only a token lock-server really granted, to
// this owner, for this account's lock, reaches the handler — which then
// compares it with the account's mark in the transaction that writes
// (lock.dev/fence/fencepg). A made-up token is refused before the handler.
func ExampleLease_SetHeaders_fence() {
	// lock-server signs each grant; a resource reads its public keys from
	// GET /v1/keys (or a JWK Set file).
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	signer, err := grant.NewSigner(key)
	if err != nil {
		fmt.Println(err)
		return
	}
	lockServer := exampleLockServer(func(owner string) string {
		g, _ := signer.Sign("account:acct-7", 42, owner, time.Unix(1_700_000_000, 0))
		return g
	})
	defer lockServer.Close()
	jwks, _ := json.Marshal(signer.PublicKeys())

	// The resource.
	keys, _, err := fence.ParseKeySet(jwks)
	if err != nil {
		fmt.Println(err)
		return
	}
	v, err := fence.NewVerifier(keys, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	lockOf := func(r *http.Request) (string, error) { return lockapi.AccountLockName(r.PathValue("account")), nil }
	// This example serves plaintext; over mutual TLS leave WithoutMutualTLS
	// out, and the grant's workload is compared with the caller's too.
	guard := fence.Middleware(v, lockOf, fence.WithoutMutualTLS())
	mux := http.NewServeMux()
	mux.Handle("POST /accounts/{account}/entries", guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := fence.FromContext(r.Context())
		fmt.Fprintf(w, "written under token %d of %s", c.Token, c.Lock)
	})))
	resource := httptest.NewServer(mux)
	defer resource.Close()

	// The worker.
	c, _ := lockclient.New(lockServer.URL)
	lease, err := c.Lock(context.Background(), lockapi.AccountLockName("acct-7"), "worker-1", 15*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer lease.Release(context.Background())
	post := func(tamper func(*http.Request)) {
		req, _ := http.NewRequestWithContext(lease.Context(), http.MethodPost, resource.URL+"/accounts/acct-7/entries", nil)
		lease.SetHeaders(req)
		tamper(req)
		resp, err := resource.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var p struct{ Code, Reason string }
		if json.Unmarshal(body, &p) == nil && p.Code != "" {
			fmt.Println(resp.StatusCode, p.Code, p.Reason)
			return
		}
		fmt.Println(resp.StatusCode, string(body))
	}
	post(func(*http.Request) {}) // as the lease is
	post(func(r *http.Request) { r.Header.Set(lockapi.HeaderFencingToken, "43") })
	// Output:
	// 200 written under token 42 of account:acct-7
	// 401 GRANT_REJECTED token_mismatch
}

// exampleLockServer answers as lock-server does for one lock — first LOCK_HELD
// (someone else holds it), then a lease of token 42 with the grant grantOf
// makes for the owner ("example-grant-of-42" when nil) — so that the examples
// run and print what they say. The package's tests run against the real
// lock-server on a real lockdb.
func exampleLockServer(grantOf func(owner string) string) *httptest.Server {
	if grantOf == nil {
		grantOf = func(string) string { return "example-grant-of-42" }
	}
	var acquires atomic.Int32
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now().UTC()
		owner := r.Header.Get(lockapi.HeaderOwnerID)
		lease := lockapi.Lease{LockName: "account:acct-7", OwnerID: owner, Token: 42,
			AcquiredAt: now, ExpiresAt: now.Add(15 * time.Second), TTLMs: 15000, Grant: grantOf(owner)}
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
