package railproxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/grant"
	"lock.dev/internal/grant/forge"
	"lock.dev/internal/grant/granttest"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/serve"
	"lock.dev/lockapi"
)

// submitGranted posts a submission with the given X-Fencing-Grant values (nil:
// none).
func submitGranted(t testing.TB, baseURL string, token int64, owner string, p payout, grants []string) answer {
	t.Helper()
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set(lockapi.HeaderFencingToken, strconv.FormatInt(token, 10))
	h.Set(lockapi.HeaderOwnerID, owner)
	h.Set(lockapi.HeaderIdempotencyKey, p.PayoutID+":"+strconv.FormatInt(token, 10))
	for _, g := range grants {
		h.Add(lockapi.HeaderFencingGrant, g)
	}
	return post(t, baseURL, h, p.body())
}

// At rail-proxy: every refusal reason of docs/contracts/signed-grants.md — alg none, an HS256
// grant keyed with the public key, tok one off X-Fencing-Token, a grant of acct-1
// presented for acct-10 among them — answers 401 GRANT_REJECTED with its reason,
// and leaves nothing behind: no rail_submission row, no rail call, no mark moved,
// no counter but grant_rejected_total.
func TestGrantRefusalsWriteNothingForwardNothing(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	stub := startStub(t, 0)
	key, keysFile := granttest.Keys(t)
	cfg := testConfig(dbURL, stub.URL)
	cfg.GrantKeysFile = keysFile
	p := startProxy(t, cfg)

	// An honest holder of acct-1 sets the mark at 5.
	if a := submitGranted(t, p.URL, 5, "worker-1", newPayout("p-honest", "acct-1"), []string{granttest.Sign(t, key, "acct-1", 5, "worker-1")}); a.Status != 200 {
		t.Fatalf("honest submission: %d %v", a.Status, a.Body)
	}

	cases, err := forge.Catalogue(key, "acct-1", 42, "worker-1")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{}
	for i, c := range cases {
		a := submitGranted(t, p.URL, c.Token, c.Owner, newPayout(fmt.Sprintf("p-rogue-%d", i), c.Account), c.Grants)
		if a.Status != http.StatusUnauthorized || a.code() != lockapi.CodeGrantRejected || a.str("reason") != c.Reason ||
			a.Header.Get("WWW-Authenticate") != `LockGrant realm="lock.dev"` {
			t.Errorf("%s: %d %v (WWW-Authenticate %q), want 401 GRANT_REJECTED reason %s",
				c.Name, a.Status, a.Body, a.Header.Get("WWW-Authenticate"), c.Reason)
		}
		want[c.Reason]++
	}

	if n := countRows(t, db); n != 1 {
		t.Errorf("%d rail_submission rows, want only the honest one", n)
	}
	if calls := stub.calls(t); len(calls) != 1 || calls[0].Reference != "p-honest" {
		t.Errorf("the rail saw %d calls, want only the honest one", len(calls))
	}
	if m := mark(t, db, "acct-1"); m != 5 {
		t.Errorf("acct-1's mark is %d, want 5", m)
	}
	if m := mark(t, db, "acct-10"); m != 0 {
		t.Errorf("acct-10 has a mark (%d): a refused grant reached the gate", m)
	}
	for _, r := range grant.Reasons {
		if got := metric(t, p, `grant_rejected_total{reason="`+r+`"}`); got != want[r] {
			t.Errorf("grant_rejected_total{reason=%q} = %v, want %v", r, got, want[r])
		}
	}
	for _, o := range metricOutcomes {
		w := 0.0
		if o == metricAcked {
			w = 1
		}
		if got := metric(t, p, `rail_submission_total{outcome="`+o+`"}`); got != w {
			t.Errorf("rail_submission_total{outcome=%q} = %v, want %v: a refusal moved it", o, got, w)
		}
	}
	if got := metric(t, p, `lock_fenced_out_total{resource="rail"}`); got != 0 {
		t.Errorf("lock_fenced_out_total = %v, want 0", got)
	}
	ev := p.Logs.events("grant_rejected")
	if len(ev) != len(cases) {
		t.Errorf("%d grant_rejected log events, want %d", len(ev), len(cases))
	}
	for _, e := range ev {
		if e["level"] != "WARN" || e["accountId"] == nil || e["ownerId"] == nil || e["presentedToken"] == nil || e["reason"] == nil {
			t.Errorf("grant_rejected event lacks a field: %v", e)
		}
	}
	logs := p.Logs.String()
	for _, c := range cases {
		for _, g := range c.Grants {
			for _, part := range strings.Split(g, ".") {
				if len(part) > 16 && strings.Contains(logs, part) {
					t.Errorf("%s: a part of the grant is in the log", c.Name)
				}
			}
		}
	}

	// The same request with its own grant is admitted: each refusal was the grant's.
	if a := submitGranted(t, p.URL, 42, "worker-1", newPayout("p-honest-2", "acct-1"), []string{granttest.Sign(t, key, "acct-1", 42, "worker-1")}); a.Status != 200 {
		t.Fatalf("honest submission with token 42: %d %v", a.Status, a.Body)
	}
}

// Precedence (docs/contracts/signed-grants.md): a malformed request stays 400
// whatever its grant; a refused grant answers 401 before the fence, also for a
// token the fence would refuse, so the attempt leaves no FENCED row and no
// fenced_out.
func TestGrantPrecedence(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	stub := startStub(t, 0)
	key, keysFile := granttest.Keys(t)
	cfg := testConfig(dbURL, stub.URL)
	cfg.GrantKeysFile = keysFile
	p := startProxy(t, cfg)

	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set(lockapi.HeaderFencingToken, "7")
	h.Set(lockapi.HeaderOwnerID, "worker-1") // no X-Idempotency-Key, no grant
	if a := post(t, p.URL, h, newPayout("p-1", "acct-1").body()); a.Status != 400 || a.code() != lockapi.CodeInvalidRequest {
		t.Errorf("malformed request without a grant: %d %s, want 400 INVALID_REQUEST", a.Status, a.code())
	}

	if a := submitGranted(t, p.URL, 10, "worker-1", newPayout("p-2", "acct-1"), []string{granttest.Sign(t, key, "acct-1", 10, "worker-1")}); a.Status != 200 {
		t.Fatalf("honest submission: %d %v", a.Status, a.Body)
	}
	// Token 3 is below the mark (10): without a valid grant it is refused for the
	// grant, not fenced.
	a := submitGranted(t, p.URL, 3, "worker-1", newPayout("p-3", "acct-1"), nil)
	if a.Status != 401 || a.str("reason") != grant.ReasonMissing {
		t.Errorf("stale token without a grant: %d %v, want 401 missing", a.Status, a.Body)
	}
	if rows := rowsOf(t, db, "p-3"); len(rows) != 0 {
		t.Errorf("a refused grant left %d rows", len(rows))
	}
	if len(p.Logs.events("fenced_out")) != 0 {
		t.Error("a refused grant was logged fenced_out")
	}
	// With its real grant the same stale token reaches the fence and is FENCED.
	a = submitGranted(t, p.URL, 3, "worker-1", newPayout("p-3", "acct-1"), []string{granttest.Sign(t, key, "acct-1", 3, "worker-1")})
	if a.Status != 409 || a.code() != lockapi.CodeFencedOut {
		t.Errorf("stale token with its grant: %d %v, want 409 FENCED_OUT", a.Status, a.Body)
	}
}

// At rail-proxy: without a key set nothing changes (no grant is
// needed) and the start-up log says grants are not verified.
func TestWithoutGrantKeysNothingChanges(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.PaydbURL(t)
	stub := startStub(t, 0)
	p := startProxy(t, testConfig(dbURL, stub.URL))
	if a := submit(t, p.URL, 5, newPayout("p-1", "acct-1")); a.Status != 200 {
		t.Errorf("submission without a grant: %d %v", a.Status, a.Body)
	}
	ev := p.Logs.events("grants_not_verified")
	if len(ev) != 1 || ev[0]["level"] != "WARN" || ev[0]["setting"] != "RAIL_PROXY_GRANT_KEYS_FILE" {
		t.Errorf("start-up: %v, want one grants_not_verified WARN naming RAIL_PROXY_GRANT_KEYS_FILE", ev)
	}
	if got := metric(t, p, `grant_rejected_total{reason="missing"}`); got != 0 {
		t.Errorf("grant_rejected_total{reason=missing} = %v, want a zero series", got)
	}
}

// Key rotation at rail-proxy: given old and new keys it admits
// grants of both; restarted with the new key only, the old key's grants are
// unknown_key.
func TestGrantKeyRotation(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.PaydbURL(t)
	stub := startStub(t, 0)
	oldKey, oldFile := granttest.Keys(t)
	newKey, newFile := granttest.Keys(t)
	bothFile := granttest.JoinedKeySetFile(t, newFile, oldFile)
	cfg := testConfig(dbURL, stub.URL)
	cfg.GrantKeysFile = bothFile
	p := startProxy(t, cfg)
	if a := submitGranted(t, p.URL, 1, "w", newPayout("p-1", "acct-1"), []string{granttest.Sign(t, oldKey, "acct-1", 1, "w")}); a.Status != 200 {
		t.Errorf("old key's grant with old+new keys: %d %v", a.Status, a.Body)
	}
	if a := submitGranted(t, p.URL, 2, "w", newPayout("p-2", "acct-1"), []string{granttest.Sign(t, newKey, "acct-1", 2, "w")}); a.Status != 200 {
		t.Errorf("new key's grant with old+new keys: %d %v", a.Status, a.Body)
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	cfg.GrantKeysFile = newFile
	p = startProxy(t, cfg)
	if a := submitGranted(t, p.URL, 3, "w", newPayout("p-3", "acct-1"), []string{granttest.Sign(t, oldKey, "acct-1", 3, "w")}); a.Status != 401 || a.str("reason") != grant.ReasonUnknownKey {
		t.Errorf("old key's grant after the old key was dropped: %d %v, want 401 unknown_key", a.Status, a.Body)
	}
	if a := submitGranted(t, p.URL, 4, "w", newPayout("p-4", "acct-1"), []string{granttest.Sign(t, newKey, "acct-1", 4, "w")}); a.Status != 200 {
		t.Errorf("new key's grant with the new key only: %d %v", a.Status, a.Body)
	}
}

// A key file that cannot be read or holds no usable key is a bad setting: Run
// refuses to start, naming it (exit 2).
func TestBadGrantKeysFileIsABadSetting(t *testing.T) {
	t.Parallel()
	_, keysFile := granttest.Keys(t)
	dir := filepath.Dir(keysFile)
	onlyRSA := filepath.Join(t.TempDir(), "rsa.json")
	_ = os.WriteFile(onlyRSA, []byte(`{"keys":[{"kty":"RSA","n":"sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw","e":"AQAB"}]}`), 0o644)
	for _, f := range []string{filepath.Join(dir, "absent.json"), filepath.Join(dir, grant.SigningKeyFile), onlyRSA, dir} {
		cfg := testConfig("postgres://nobody@127.0.0.1:1/none", "http://127.0.0.1:1")
		cfg.GrantKeysFile = f
		cfg.LogOutput = &syncBuffer{}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := Run(ctx, cfg)
		cancel()
		var ue *serve.UsageError
		if !errors.As(err, &ue) || !strings.Contains(ue.Msg, "RAIL_PROXY_GRANT_KEYS_FILE") {
			t.Errorf("%s: Run = %v, want a usage error naming RAIL_PROXY_GRANT_KEYS_FILE", filepath.Base(f), err)
		}
	}
}
