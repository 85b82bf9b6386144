package payment_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/grant"
	"lock.dev/internal/grant/forge"
	"lock.dev/internal/grant/granttest"
	"lock.dev/internal/payment"
	"lock.dev/internal/serve"
	"lock.dev/lockapi"
)

// fenced sends a claim (body "") or a post with the given grants (nil: none).
func (e *env) fenced(t testing.TB, id, call string, token int64, owner string, grants []string, body string) (int, map[string]any, http.Header) {
	t.Helper()
	h := map[string][]string{
		lockapi.HeaderFencingToken: {strconv.FormatInt(token, 10)},
		lockapi.HeaderOwnerID:      {owner},
	}
	if grants != nil {
		h[lockapi.HeaderFencingGrant] = grants
	}
	if body != "" {
		h["Content-Type"] = []string{"application/json"}
	}
	req, err := http.NewRequest(http.MethodPost, e.base+"/v1/payouts/"+id+"/"+call, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m, resp.Header
}

// At payment-resource: every refusal reason of docs/contracts/signed-grants.md answers 401
// GRANT_REJECTED with its reason for a claim and for a post — alg none, an HS256
// grant keyed with the public key, tok one off X-Fencing-Token, a grant of acct-1
// used for a payout of acct-10 among them — and changes no payout, writes no
// ledger entry, moves no counter but grant_rejected_total.
func TestGrantRefusalsChangeNothing(t *testing.T) {
	t.Parallel()
	key, keysFile := granttest.Keys(t)
	// About grant refusals; the honest post at the end is of a payout that never
	// went to the rail: books unchecked.
	e := start(t, booksUnchecked, func(c *payment.Config) { c.GrantKeysFile = keysFile })
	e.create(t, "p-1", "acct-1", 500)
	e.create(t, "p-10", "acct-10", 700)
	// p-1 is claimed and awaiting its post by an honest holder with token 40.
	if _, err := e.client.ClaimWithGrant(context.Background(), "p-1", 40, granttest.Sign(t, key, "acct-1", 40, "worker-1"), "worker-1"); err != nil {
		t.Fatal(err)
	}
	before := e.snapshot(t)

	cases, err := forge.Catalogue(key, "acct-1", 42, "worker-1")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{}
	for _, c := range cases {
		id := "p-1"
		if c.Account == "acct-10" {
			id = "p-10" // the payout's account decides which lock the grant must be of
		}
		for _, call := range []struct{ name, body string }{{"claim", ""}, {"post", `{"outcome":"PAID","railReference":"RS-x"}`}} {
			st, body, hdr := e.fenced(t, id, call.name, c.Token, c.Owner, c.Grants, call.body)
			if st != 401 || body["code"] != lockapi.CodeGrantRejected || body["reason"] != c.Reason ||
				hdr.Get("WWW-Authenticate") != `LockGrant realm="lock.dev"` {
				t.Errorf("%s, %s: %d %v, want 401 GRANT_REJECTED reason %s", c.Name, call.name, st, body, c.Reason)
			}
			want[c.Reason]++
		}
	}
	if after := e.snapshot(t); after != before {
		t.Errorf("refused calls changed paydb:\nbefore %s\nafter  %s", before, after)
	}
	for _, r := range grant.Reasons {
		if got := e.metric(t, `grant_rejected_total{reason="`+r+`"}`); got != want[r] {
			t.Errorf("grant_rejected_total{reason=%q} = %v, want %v", r, got, want[r])
		}
	}
	if got := e.metric(t, `lock_fenced_out_total{resource="payout"}`); got != 0 {
		t.Errorf("lock_fenced_out_total = %v, want 0", got)
	}
	if got := e.metric(t, `payout_transition_total{to="claimed"}`); got != 1 {
		t.Errorf(`payout_transition_total{to="claimed"} = %v, want the honest claim only`, got)
	}
	if ev := e.logs.events(t, "grant_rejected"); len(ev) != 2*len(cases) {
		t.Errorf("%d grant_rejected events, want %d", len(ev), 2*len(cases))
	}
	logs := e.logs.String()
	for _, c := range cases {
		for _, g := range c.Grants {
			for _, part := range strings.Split(g, ".") {
				if len(part) > 16 && strings.Contains(logs, part) {
					t.Errorf("%s: a part of the grant is in the log", c.Name)
				}
			}
		}
	}
	// The honest holder's post, with its grant, still lands.
	if _, err := e.client.PostWithGrant(context.Background(), "p-1", 40, granttest.Sign(t, key, "acct-1", 40, "worker-1"), "worker-1",
		lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr("RS-1")}); err != nil {
		t.Errorf("honest post: %v", err)
	}
}

// Precedence at payment-resource (docs/contracts/signed-grants.md): 400 first, then
// NOT_FOUND (the payout's account is needed), then the grant — before PAYOUT_FINAL
// and FENCED_OUT, so a caller without a grant learns nothing of the payout's state.
func TestGrantPrecedenceAtPaymentResource(t *testing.T) {
	t.Parallel()
	key, keysFile := granttest.Keys(t)
	// About the grant's precedence; its DECLINED payout never went to the rail:
	// books unchecked.
	e := start(t, booksUnchecked, func(c *payment.Config) { c.GrantKeysFile = keysFile })
	e.create(t, "p-final", "acct-1", 500)
	e.create(t, "p-claimed", "acct-1", 500)
	g := func(token int64) string { return granttest.Sign(t, key, "acct-1", token, "w") }
	ctx := context.Background()
	if _, err := e.client.ClaimWithGrant(ctx, "p-final", 10, g(10), "w"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.PostWithGrant(ctx, "p-final", 10, g(10), "w", lockapi.PostRequest{Outcome: lockapi.StatusDeclined}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.ClaimWithGrant(ctx, "p-claimed", 20, g(20), "w"); err != nil {
		t.Fatal(err)
	}

	if st, body, _ := e.fenced(t, "p-final", "post", 10, "w", nil, `{"outcome":"BOGUS"}`); st != 400 {
		t.Errorf("malformed post without a grant: %d %v, want 400", st, body)
	}
	if st, body, _ := e.fenced(t, "p-nope", "claim", 10, "w", nil, ""); st != 404 || body["code"] != lockapi.CodeNotFound {
		t.Errorf("unknown payout without a grant: %d %v, want 404", st, body)
	}
	if st, body, _ := e.fenced(t, "p-final", "claim", 11, "w", nil, ""); st != 401 || body["reason"] != grant.ReasonMissing {
		t.Errorf("final payout without a grant: %d %v, want 401 missing (before PAYOUT_FINAL)", st, body)
	}
	if st, body, _ := e.fenced(t, "p-claimed", "claim", 5, "w", nil, ""); st != 401 || body["reason"] != grant.ReasonMissing {
		t.Errorf("stale token without a grant: %d %v, want 401 missing (before FENCED_OUT)", st, body)
	}
	// With their grants the same calls reach PAYOUT_FINAL and FENCED_OUT.
	if _, err := e.client.ClaimWithGrant(ctx, "p-final", 11, g(11), "w"); err == nil {
		t.Error("claim of a final payout succeeded")
	} else {
		asProblem(t, err, 409, lockapi.CodePayoutFinal)
	}
	if _, err := e.client.ClaimWithGrant(ctx, "p-claimed", 5, g(5), "w"); err == nil {
		t.Error("stale claim succeeded")
	} else {
		asProblem(t, err, 409, lockapi.CodeFencedOut)
	}
}

// At payment-resource: without a key set claims and posts need no
// grant, and the start-up log says grants are not verified.
func TestPaymentWithoutGrantKeys(t *testing.T) {
	t.Parallel()
	e := start(t)
	e.create(t, "p-1", "acct-1", 500)
	e.claim(t, "p-1", 3, "w")
	ev := e.logs.events(t, "grants_not_verified")
	if len(ev) != 1 || ev[0]["level"] != "WARN" || ev[0]["setting"] != "PAYMENT_GRANT_KEYS_FILE" {
		t.Errorf("start-up: %v, want one grants_not_verified WARN naming PAYMENT_GRANT_KEYS_FILE", ev)
	}
	if got := e.metric(t, `grant_rejected_total{reason="owner_mismatch"}`); got != 0 {
		t.Errorf("grant_rejected_total{reason=owner_mismatch} = %v, want a zero series", got)
	}
}

// unreachablePaydb is a paydb URL nothing answers on, for a test of a setting
// refused before any connection.
const unreachablePaydb = "postgres://paydb@127.0.0.1:1/paydb?connect_timeout=1"

func TestBadPaymentGrantKeysFile(t *testing.T) {
	t.Parallel()
	cfg := payment.DefaultConfig()
	cfg.GrantKeysFile = filepath.Join(t.TempDir(), "absent.json")
	cfg.LogOutput = &syncBuffer{}
	cfg.Identity.UnsafeNoAuth = true // about the key set file, not identity (docs/contracts/workload-identity.md)
	cfg.PaydbURL = unreachablePaydb  // refused before any connection
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := payment.Run(ctx, cfg)
	var ue *serve.UsageError
	if !errors.As(err, &ue) || !strings.Contains(ue.Msg, "PAYMENT_GRANT_KEYS_FILE") {
		t.Errorf("Run = %v, want a usage error naming PAYMENT_GRANT_KEYS_FILE", err)
	}
}
