package fence_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"lock.dev/fence"
	"lock.dev/internal/grant"
	"lock.dev/lockapi"
)

// lockServer stands in for lock-server in the examples: its published JWK Set
// (what GET /v1/keys answers) and the grant it would hand out with a lease.
func lockServer() (jwks []byte, issue func(lock string, token int64, owner string) string) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	signer, err := grant.NewSigner(key)
	if err != nil {
		panic(err)
	}
	jwks, err = json.Marshal(signer.PublicKeys())
	if err != nil {
		panic(err)
	}
	return jwks, func(lock string, token int64, owner string) string {
		g, err := signer.Sign(lock, token, owner, time.Unix(1_700_000_000, 0))
		if err != nil {
			panic(err)
		}
		return g
	}
}

// A resource verifies a grant against what the request presents; a refusal is
// a *fence.Rejection whose Reason is one of the contract's list.
func ExampleVerifier() {
	jwks, issue := lockServer()
	keys, _, err := fence.ParseKeySet(jwks) // or fence.ReadKeySet("jwks.json")
	if err != nil {
		fmt.Println("key set", err)
		return
	}
	v, err := fence.NewVerifier(keys, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	g := issue("ledger:acct-7", 42, "worker-1")

	c, err := v.Verify(g, fence.Presented{Lock: "ledger:acct-7", Token: 42, Owner: "worker-1"})
	fmt.Println(c.Lock, c.Token, c.Subject, err)

	// The same grant presented with a made-up token.
	_, err = v.Verify(g, fence.Presented{Lock: "ledger:acct-7", Token: 9223372036854775807, Owner: "worker-1"})
	var rej *fence.Rejection
	if errors.As(err, &rej) {
		fmt.Println(rej.Reason)
	}
	// Output:
	// ledger:acct-7 42 worker-1 <nil>
	// token_mismatch
}

// A ledger's write route behind the middleware: the handler runs only for a
// grant of the account's lock, with the token and owner presented, and reads
// the verified claims from the request's context.
//
// This example serves plaintext, so it says WithoutMutualTLS; a resource
// serving mutual TLS leaves the option out and the grant's workload (wid) is
// compared with the caller's SPIFFE ID.
func ExampleMiddleware() {
	jwks, issue := lockServer()
	keys, _, _ := fence.ParseKeySet(jwks)
	v, _ := fence.NewVerifier(keys, 0)

	lockOf := func(r *http.Request) (string, error) { return "ledger:" + r.PathValue("account"), nil }
	guard := fence.Middleware(v, lockOf, fence.WithoutMutualTLS())
	mux := http.NewServeMux()
	mux.Handle("POST /ledger/{account}/entries", guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := fence.FromContext(r.Context())
		// Here the handler compares c.Token with the account's mark and
		// writes, in one transaction (package fencepg).
		fmt.Fprintf(w, "written under token %d of %s\n", c.Token, c.Lock)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post := func(token int64, g string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/ledger/acct-7/entries", nil)
		req.Header = lockapi.FencingHeaders(token, g, "worker-1") // what a lockclient worker sends
		resp, err := srv.Client().Do(req)
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
		fmt.Print(resp.StatusCode, " ", strings.TrimLeft(string(body), " "))
	}
	g := issue("ledger:acct-7", 42, "worker-1")
	post(42, g)                                      // the grant's own token
	post(43, g)                                      // a token the grant is not of
	post(42, "")                                     // no grant at all
	post(42, issue("ledger:acct-8", 42, "worker-1")) // a grant of another account
	// Output:
	// 200 written under token 42 of ledger:acct-7
	// 401 GRANT_REJECTED token_mismatch
	// 401 GRANT_REJECTED missing
	// 401 GRANT_REJECTED lock_mismatch
}
