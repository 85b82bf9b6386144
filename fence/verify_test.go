package fence_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"lock.dev/fence"
	"lock.dev/internal/grant/forge"
	"lock.dev/internal/grant/granttest"
)

// keyPair and mustOf are granttest's, shared by the grant and fence tests.
type keyPair = granttest.KeyPair

func newKeyPair(t testing.TB) keyPair { return granttest.NewKeyPair(t) }

func mustOf(t testing.TB) func(string, error) string { return granttest.Must(t) }

// check is v.Verify's refusal, nil when it accepts.
func check(v *fence.Verifier, g string, p fence.Presented) *fence.Rejection {
	_, err := v.Verify(g, p)
	if err == nil {
		return nil
	}
	var r *fence.Rejection
	if !errors.As(err, &r) {
		return &fence.Rejection{Reason: "not a *fence.Rejection", Detail: err.Error()}
	}
	return r
}

func newVerifier(t testing.TB, set *fence.KeySet, size int) *fence.Verifier {
	t.Helper()
	v, err := fence.NewVerifier(set, size)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func decodePart(t testing.TB, g string, i int) string { return granttest.DecodePart(t, g, i) }

// RFC 8037 appendix A.3: the thumbprint of its example Ed25519 key.
func TestKeyIDIsRFC7638Thumbprint(t *testing.T) {
	x, err := base64.RawURLEncoding.DecodeString("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")
	if err != nil {
		t.Fatal(err)
	}
	kid, err := fence.KeyID(ed25519.PublicKey(x))
	if err != nil {
		t.Fatal(err)
	}
	if kid != "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k" {
		t.Errorf("KeyID = %s, want RFC 8037's kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k", kid)
	}
}

// refusalCase is one grant and what the request presents with it.
type refusalCase struct {
	name  string
	grant string
	p     fence.Presented
	want  string // reason
}

// refusalCases is the catalogue: every reason of docs/contracts/signed-grants.md, the attacks it
// names (alg none, HS256 "signed" with the public key, tok off by one, a grant of
// acct-1 for acct-10), and the order in which reasons are checked.
func refusalCases(t testing.TB, k, rogue keyPair) []refusalCase {
	t.Helper()
	m := mustOf(t)
	const lock, token, owner = "account:acct-1", int64(42), "executor-1"
	p := fence.Presented{Lock: lock, Token: token, Owner: owner}
	real := k.Sign(t, lock, token, owner)
	claims := func(edit func(forge.Claims)) forge.Claims {
		c := forge.GrantClaims(lock, token, owner)
		if edit != nil {
			edit(c)
		}
		return c
	}
	header := func(edit func(forge.Header)) forge.Header {
		h := forge.GrantHeader(k.KID)
		if edit != nil {
			edit(h)
		}
		return h
	}
	signed := func(h forge.Header, c forge.Claims) string {
		return m(forge.Sign(k.Priv, h, c))
	}
	pubJWK, err := forge.PublicKeyJSON(k.Pub)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(real, ".")
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	sig[0] ^= 1
	flipped := parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(sig)
	rawHeader := base64.RawURLEncoding.EncodeToString([]byte(decodePart(t, real, 0)))
	// A real grant whose claims part has unused bits to respell: the owner's
	// length moves the claims' length through its three residues.
	var spare string
	var spareP fence.Presented
	for _, o := range []string{owner, owner + "x", owner + "xy"} {
		if g := k.Sign(t, lock, token, o); len(strings.Split(g, ".")[1])%4 != 0 {
			spare, spareP = g, fence.Presented{Lock: lock, Token: token, Owner: o}
			break
		}
	}
	spareParts := strings.Split(spare, ".")
	// A header with spare bits: the kid's length is fixed, so lengthen the
	// header, when it has none, by a space the JSON reader skips; signed for real.
	hj := decodePart(t, real, 0)
	if len(hj)%3 == 0 {
		hj += " "
	}
	spacedHeader := strings.TrimSuffix(forge.Raw(hj, decodePart(t, real, 1), ""), ".")
	spacedHeader += "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(k.Priv, []byte(spacedHeader)))
	if r := check(newVerifier(t, k.Set, 0), spacedHeader, p); r != nil {
		t.Fatalf("the spaced header's grant is refused (%s): the respelled case would prove nothing", r.Reason)
	}

	return []refusalCase{
		{"empty", "", p, fence.ReasonMissing},

		{"one part", "abc", p, fence.ReasonMalformed},
		{"two parts", parts[0] + "." + parts[1], p, fence.ReasonMalformed},
		{"four parts", real + ".x", p, fence.ReasonMalformed},
		{"header not base64url", "!!." + parts[1] + "." + parts[2], p, fence.ReasonMalformed},
		{"header not JSON", base64.RawURLEncoding.EncodeToString([]byte("nope")) + "." + parts[1] + "." + parts[2], p, fence.ReasonMalformed},
		{"claims not JSON", forge.Raw(decodePart(t, real, 0), "nope", parts[2]), p, fence.ReasonMalformed},
		{"claims not base64url", rawHeader + ".!!." + parts[2], p, fence.ReasonMalformed},
		{"alg none", m(forge.Unsigned(header(nil), claims(nil))), p, fence.ReasonMalformed},
		{"HS256 keyed with the public key (algorithm confusion)", m(forge.HMAC(pubJWK, header(nil), claims(nil))), p, fence.ReasonMalformed},
		{"HS256 keyed with the raw public key", m(forge.HMAC(k.Pub, header(nil), claims(nil))), p, fence.ReasonMalformed},
		{"alg RS256", signed(header(func(h forge.Header) { h["alg"] = "RS256" }), claims(nil)), p, fence.ReasonMalformed},
		{"alg Ed25519", signed(header(func(h forge.Header) { h["alg"] = "Ed25519" }), claims(nil)), p, fence.ReasonMalformed},
		{"typ JWT", signed(header(func(h forge.Header) { h["typ"] = "JWT" }), claims(nil)), p, fence.ReasonMalformed},
		{"no typ", signed(header(func(h forge.Header) { delete(h, "typ") }), claims(nil)), p, fence.ReasonMalformed},
		{"no kid", signed(header(func(h forge.Header) { delete(h, "kid") }), claims(nil)), p, fence.ReasonMalformed},
		{"empty kid", signed(header(func(h forge.Header) { h["kid"] = "" }), claims(nil)), p, fence.ReasonMalformed},
		{"kid a number", signed(header(func(h forge.Header) { h["kid"] = 7 }), claims(nil)), p, fence.ReasonMalformed},
		{"header crit", signed(header(func(h forge.Header) { h["crit"] = []string{"b64"}; h["b64"] = false }), claims(nil)), p, fence.ReasonMalformed},
		{"header embeds a jwk", signed(header(func(h forge.Header) { h["jwk"] = map[string]string{"kty": "OKP"} }), claims(nil)), p, fence.ReasonMalformed},
		{"header alg twice", forge.Raw(`{"alg":"none","alg":"EdDSA","typ":"lockgrant+jwt","kid":"`+k.KID+`"}`, decodePart(t, real, 1), parts[2]), p, fence.ReasonMalformed},
		{"tok a JSON number", signed(header(nil), claims(func(c forge.Claims) { c["tok"] = 42 })), p, fence.ReasonMalformed},
		{"tok with a leading zero", signed(header(nil), claims(func(c forge.Claims) { c["tok"] = "042" })), p, fence.ReasonMalformed},
		{"tok beyond int64", signed(header(nil), claims(func(c forge.Claims) { c["tok"] = "9223372036854775808" })), p, fence.ReasonMalformed},
		{"no tok", signed(header(nil), claims(func(c forge.Claims) { delete(c, "tok") })), p, fence.ReasonMalformed},
		{"no iss", signed(header(nil), claims(func(c forge.Claims) { delete(c, "iss") })), p, fence.ReasonMalformed},
		{"no lock", signed(header(nil), claims(func(c forge.Claims) { delete(c, "lock") })), p, fence.ReasonMalformed},
		{"no sub", signed(header(nil), claims(func(c forge.Claims) { delete(c, "sub") })), p, fence.ReasonMalformed},
		{"no iat", signed(header(nil), claims(func(c forge.Claims) { delete(c, "iat") })), p, fence.ReasonMalformed},
		{"iat a string", signed(header(nil), claims(func(c forge.Claims) { c["iat"] = "1700000000" })), p, fence.ReasonMalformed},
		{"lock a number", signed(header(nil), claims(func(c forge.Claims) { c["lock"] = 1 })), p, fence.ReasonMalformed},
		{"sub empty", signed(header(nil), claims(func(c forge.Claims) { c["sub"] = "" })), p, fence.ReasonMalformed},
		{"an unknown claim", signed(header(nil), claims(func(c forge.Claims) { c["exp"] = 1 })), p, fence.ReasonMalformed},
		{"tok twice", forge.Raw(decodePart(t, real, 0), `{"iss":"lock-server","lock":"account:acct-1","tok":"1","tok":"42","sub":"executor-1","iat":1}`, parts[2]), p, fence.ReasonMalformed},
		{"signature's last character respelled (same bytes)", m(forge.NonCanonical(real, 2)), p, fence.ReasonMalformed},
		{"claims' last character respelled (same bytes)", m(forge.NonCanonical(spare, 1)), spareP, fence.ReasonMalformed},
		{"header's last character respelled (same bytes)", m(forge.NonCanonical(spacedHeader, 0)), p, fence.ReasonMalformed},
		{"signature padded with =", real + "==", p, fence.ReasonMalformed},
		{"claims padded with =", spareParts[0] + "." + spareParts[1] + strings.Repeat("=", 4-len(spareParts[1])%4) + "." + spareParts[2], spareP, fence.ReasonMalformed},
		{"a line break inside the signature", parts[0] + "." + parts[1] + "." + parts[2][:10] + "\n" + parts[2][10:], p, fence.ReasonMalformed},
		{"longer than the bound", real + strings.Repeat("A", fence.MaxGrantBytes), p, fence.ReasonMalformed},
		{"malformed before unknown key", m(forge.Sign(rogue.Priv, forge.GrantHeader(rogue.KID), claims(func(c forge.Claims) { c["tok"] = 42 }))), p, fence.ReasonMalformed},

		{"signed by another key", m(forge.OwnKey(rogue.Priv, lock, token, owner)), p, fence.ReasonUnknownKey},
		{"unknown key before wrong issuer", m(forge.Sign(rogue.Priv, forge.GrantHeader(rogue.KID), claims(func(c forge.Claims) { c["iss"] = "rogue" }))), p, fence.ReasonUnknownKey},

		{"token edited in the claims", m(forge.EditToken(real, 9223372036854775807)), fence.Presented{Lock: lock, Token: 9223372036854775807, Owner: owner}, fence.ReasonBadSignature},
		{"lock edited in the claims", m(forge.EditClaims(real, func(c forge.Claims) { c["lock"] = "account:acct-10" })), fence.Presented{Lock: "account:acct-10", Token: token, Owner: owner}, fence.ReasonBadSignature},
		{"signature bit flipped", flipped, p, fence.ReasonBadSignature},
		{"another key under the real kid", m(forge.Sign(rogue.Priv, forge.GrantHeader(k.KID), claims(nil))), p, fence.ReasonBadSignature},
		{"bad signature before lock mismatch", flipped, fence.Presented{Lock: "account:acct-10", Token: token, Owner: owner}, fence.ReasonBadSignature},

		{"issuer not lock-server", signed(header(nil), claims(func(c forge.Claims) { c["iss"] = "lock-server-2" })), p, fence.ReasonWrongIssuer},
		{"wrong issuer before lock mismatch", signed(header(nil), claims(func(c forge.Claims) { c["iss"] = "x" })), fence.Presented{Lock: "account:acct-10", Token: 1, Owner: "y"}, fence.ReasonWrongIssuer},

		{"grant of acct-1 for acct-10", real, fence.Presented{Lock: "account:acct-10", Token: token, Owner: owner}, fence.ReasonLockMismatch},
		{"lock mismatch before token and owner", real, fence.Presented{Lock: "account:acct-2", Token: token + 1, Owner: "other"}, fence.ReasonLockMismatch},

		{"tok one below X-Fencing-Token", real, fence.Presented{Lock: lock, Token: token + 1, Owner: owner}, fence.ReasonTokenMismatch},
		{"tok one above X-Fencing-Token", real, fence.Presented{Lock: lock, Token: token - 1, Owner: owner}, fence.ReasonTokenMismatch},
		{"huge token with a real grant", real, fence.Presented{Lock: lock, Token: 9223372036854775807, Owner: owner}, fence.ReasonTokenMismatch},
		{"token mismatch before owner", real, fence.Presented{Lock: lock, Token: 7, Owner: "other"}, fence.ReasonTokenMismatch},

		{"another owner", real, fence.Presented{Lock: lock, Token: token, Owner: "executor-2"}, fence.ReasonOwnerMismatch},
	}
}

func TestVerifyRefusesInTheDocumentedOrder(t *testing.T) {
	k, rogue := newKeyPair(t), newKeyPair(t)
	v := newVerifier(t, k.Set, 0)
	for _, c := range refusalCases(t, k, rogue) {
		t.Run(c.name, func(t *testing.T) {
			r := check(v, c.grant, c.p)
			if r == nil {
				t.Fatalf("accepted, want %s", c.want)
			}
			if r.Reason != c.want {
				t.Errorf("reason %s (%s), want %s", r.Reason, r.Detail, c.want)
			}
			if c.grant != "" && strings.Contains(r.Detail, c.grant) {
				t.Errorf("the detail quotes the grant")
			}
		})
	}
}

// The cache remembers a grant's claims, not a verdict: a remembered grant of one
// lock, token or owner still passes for no other.
func TestCachedGrantIsMatchedAgainstEachRequest(t *testing.T) {
	k := newKeyPair(t)
	v := newVerifier(t, k.Set, 0)
	g := k.Sign(t, "account:acct-1", 42, "executor-1")
	ok := fence.Presented{Lock: "account:acct-1", Token: 42, Owner: "executor-1"}
	for i := range 3 {
		if r := check(v, g, ok); r != nil {
			t.Fatalf("presentation %d refused: %v", i, r)
		}
	}
	for _, c := range []struct {
		p    fence.Presented
		want string
	}{
		{fence.Presented{Lock: "account:acct-10", Token: 42, Owner: "executor-1"}, fence.ReasonLockMismatch},
		{fence.Presented{Lock: "account:acct-1", Token: 43, Owner: "executor-1"}, fence.ReasonTokenMismatch},
		{fence.Presented{Lock: "account:acct-1", Token: 42, Owner: "executor-2"}, fence.ReasonOwnerMismatch},
	} {
		if r := check(v, g, c.p); r == nil || r.Reason != c.want {
			t.Errorf("cached grant presented as %+v: %v, want %s", c.p, r, c.want)
		}
	}
	if r := check(v, g, ok); r != nil {
		t.Errorf("the grant is refused after refusals of other presentations: %v", r)
	}
}

// A refused grant is never remembered: presented again, it is checked again and
// refused again, and it cannot push real grants out.
func TestRefusedGrantsAreNotRemembered(t *testing.T) {
	k, rogue := newKeyPair(t), newKeyPair(t)
	m := mustOf(t)
	v := newVerifier(t, k.Set, 2)
	real := k.Sign(t, "account:a", 1, "o")
	p := fence.Presented{Lock: "account:a", Token: 1, Owner: "o"}
	if r := check(v, real, p); r != nil {
		t.Fatal(r)
	}
	for i := range 50 {
		bad := m(forge.OwnKey(rogue.Priv, "account:a", int64(i+2), "o"))
		for range 2 {
			if r := check(v, bad, fence.Presented{Lock: "account:a", Token: int64(i + 2), Owner: "o"}); r == nil || r.Reason != fence.ReasonUnknownKey {
				t.Fatalf("forged grant %d: %v", i, r)
			}
		}
	}
	if n := fence.CacheLen(v); n != 1 {
		t.Errorf("cache holds %d grants after 100 refusals, want the 1 real one", n)
	}
}

// The cache is bounded, and a grant pushed out is verified again, not refused.
func TestCacheIsBounded(t *testing.T) {
	k := newKeyPair(t)
	v := newVerifier(t, k.Set, 8)
	for round := range 2 {
		for i := range 100 {
			g := k.Sign(t, "account:a", int64(i+1), "o")
			if r := check(v, g, fence.Presented{Lock: "account:a", Token: int64(i + 1), Owner: "o"}); r != nil {
				t.Fatalf("round %d grant %d: %v", round, i, r)
			}
			if n := fence.CacheLen(v); n > 8 {
				t.Fatalf("cache holds %d grants, bound 8", n)
			}
		}
	}
}

// Many goroutines verify and mismatch the same and different grants at once
// (run with -race): every verdict is right.
func TestVerifyConcurrently(t *testing.T) {
	k := newKeyPair(t)
	v := newVerifier(t, k.Set, 16)
	const accounts = 40
	grants := make([]string, accounts)
	for i := range grants {
		grants[i] = k.Sign(t, fmt.Sprintf("account:acct-%d", i), int64(i+1), "o")
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for n := range 300 {
				i := (n*7 + w) % accounts
				p := fence.Presented{Lock: fmt.Sprintf("account:acct-%d", i), Token: int64(i + 1), Owner: "o"}
				if r := check(v, grants[i], p); r != nil {
					t.Errorf("grant %d refused: %v", i, r)
					return
				}
				other := (i + 1) % accounts
				p.Lock = fmt.Sprintf("account:acct-%d", other)
				if r := check(v, grants[i], p); r == nil || r.Reason != fence.ReasonLockMismatch {
					t.Errorf("grant %d presented for account %d: %v", i, other, r)
					return
				}
			}
		})
	}
	wg.Wait()
}

// Verifiers given the old and the new key accept grants by both;
// once the old key is dropped, its grants are unknown_key.
func TestKeyRotation(t *testing.T) {
	old, cur := newKeyPair(t), newKeyPair(t)
	p := fence.Presented{Lock: "account:a", Token: 5, Owner: "o"}
	byOld, byNew := old.Sign(t, p.Lock, p.Token, p.Owner), cur.Sign(t, p.Lock, p.Token, p.Owner)

	both := newVerifier(t, cur.Set.Join(old.Set), 0)
	for name, g := range map[string]string{"old": byOld, "new": byNew} {
		if r := check(both, g, p); r != nil {
			t.Errorf("old+new verifier refuses the %s key's grant: %v", name, r)
		}
	}
	onlyNew := newVerifier(t, cur.Set, 0)
	if r := check(onlyNew, byNew, p); r != nil {
		t.Errorf("new-only verifier refuses the new key's grant: %v", r)
	}
	if r := check(onlyNew, byOld, p); r == nil || r.Reason != fence.ReasonUnknownKey {
		t.Errorf("new-only verifier on the old key's grant: %v, want unknown_key", r)
	}
}

func TestNewVerifierNeedsAKey(t *testing.T) {
	if _, err := fence.NewVerifier(&fence.KeySet{}, 0); err == nil {
		t.Error("a verifier without keys was built")
	}
}

// FuzzVerify: whatever the input, a verdict from the closed set and no panic;
// anything accepted is exactly the real grant: each part is read as canonical
// base64url, so not even another spelling of the same bytes passes.
func FuzzVerify(f *testing.F) {
	k, rogue := newKeyPair(f), newKeyPair(f)
	real := k.Sign(f, "account:acct-1", 42, "executor-1")
	f.Add(real)
	for _, c := range refusalCases(f, k, rogue) {
		f.Add(c.grant)
	}
	reasons := map[string]bool{}
	for _, r := range fence.Reasons() {
		reasons[r] = true
	}
	f.Fuzz(func(t *testing.T, g string) {
		v := newVerifier(t, k.Set, 4)
		r := check(v, g, fence.Presented{Lock: "account:acct-1", Token: 42, Owner: "executor-1"})
		if r != nil {
			if !reasons[r.Reason] {
				t.Fatalf("reason %q is not in the closed set", r.Reason)
			}
			return
		}
		if g != real {
			t.Fatalf("accepted %q, which is not the real grant", g)
		}
	})
}
