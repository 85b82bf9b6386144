package grant_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"lock.dev/fence"
	"lock.dev/internal/grant"
)

// keyPair is a signing key with its signer and public key set.
type keyPair struct {
	priv   ed25519.PrivateKey
	pub    ed25519.PublicKey
	kid    string
	signer *grant.Signer
	set    *grant.KeySet
}

func newKeyPair(t testing.TB) keyPair {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := grant.NewSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	set, err := fence.NewKeySet(pub)
	if err != nil {
		t.Fatal(err)
	}
	return keyPair{priv: priv, pub: pub, kid: s.KeyID(), signer: s, set: set}
}

func (k keyPair) sign(t testing.TB, lock string, token int64, owner string) string {
	t.Helper()
	g, err := k.signer.Sign(lock, token, owner, time.Unix(1_700_000_000, 0))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// mustOf turns a (string, error) call into its string, failing t on the error.
func mustOf(t testing.TB) func(string, error) string {
	return func(s string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

func newVerifier(t testing.TB, set *grant.KeySet, size int) *fence.Verifier {
	t.Helper()
	v, err := fence.NewVerifier(set, size)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// refusal is a Verify's refusal, nil when it accepted.
func refusal(_ grant.Claims, err error) *grant.Rejection {
	if err == nil {
		return nil
	}
	var r *grant.Rejection
	if !errors.As(err, &r) {
		return &grant.Rejection{Reason: "not a *fence.Rejection", Detail: err.Error()}
	}
	return r
}

func decodePart(t testing.TB, g string, i int) string {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(strings.Split(g, ".")[i])
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A grant has exactly the shape of docs/contracts/signed-grants.md: EdDSA, typ
// lockgrant+jwt, kid the key's thumbprint; claims iss, lock, tok as a decimal
// string, sub, iat.
func TestSignedGrantHasTheDocumentedShape(t *testing.T) {
	k := newKeyPair(t)
	g := k.sign(t, "account:acct-7", 9223372036854775807, "executor-1")
	var h map[string]any
	if err := json.Unmarshal([]byte(decodePart(t, g, 0)), &h); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"alg": "EdDSA", "typ": "lockgrant+jwt", "kid": k.kid}
	if fmt.Sprint(h) != fmt.Sprint(want) {
		t.Errorf("header %v, want %v", h, want)
	}
	if got, want := decodePart(t, g, 1), `{"iss":"lock-server","lock":"account:acct-7","tok":"9223372036854775807","sub":"executor-1","iat":1700000000}`; got != want {
		t.Errorf("claims %s\nwant   %s", got, want)
	}
	if _, r := newVerifier(t, k.set, 0).Verify(g, grant.Presented{Lock: "account:acct-7", Token: 9223372036854775807, Owner: "executor-1"}); r != nil {
		t.Errorf("a fresh grant is refused: %v", r)
	}
}

// Renewals and GETs re-sign: the same facts must give the same bytes.
func TestSigningIsDeterministic(t *testing.T) {
	k := newKeyPair(t)
	a := k.sign(t, "account:a", 3, "o")
	b := k.sign(t, "account:a", 3, "o")
	if a != b {
		t.Errorf("two signatures of the same grant differ:\n%s\n%s", a, b)
	}
}
