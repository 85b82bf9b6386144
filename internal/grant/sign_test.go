package grant_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"lock.dev/fence"
	"lock.dev/internal/grant"
	"lock.dev/internal/grant/granttest"
)

// keyPair and mustOf are granttest's, shared by the grant and fence tests.
type keyPair = granttest.KeyPair

func newKeyPair(t testing.TB) keyPair { return granttest.NewKeyPair(t) }

func mustOf(t testing.TB) func(string, error) string { return granttest.Must(t) }

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

func decodePart(t testing.TB, g string, i int) string { return granttest.DecodePart(t, g, i) }

// A grant has exactly the shape of docs/contracts/signed-grants.md: EdDSA, typ
// lockgrant+jwt, kid the key's thumbprint; claims iss, lock, tok as a decimal
// string, sub, iat.
func TestSignedGrantHasTheDocumentedShape(t *testing.T) {
	k := newKeyPair(t)
	g := k.Sign(t, "account:acct-7", 9223372036854775807, "executor-1")
	var h map[string]any
	if err := json.Unmarshal([]byte(decodePart(t, g, 0)), &h); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"alg": "EdDSA", "typ": "lockgrant+jwt", "kid": k.KID}
	if fmt.Sprint(h) != fmt.Sprint(want) {
		t.Errorf("header %v, want %v", h, want)
	}
	if got, want := decodePart(t, g, 1), `{"iss":"lock-server","lock":"account:acct-7","tok":"9223372036854775807","sub":"executor-1","iat":1700000000}`; got != want {
		t.Errorf("claims %s\nwant   %s", got, want)
	}
	if _, r := newVerifier(t, k.Set, 0).Verify(g, grant.Presented{Lock: "account:acct-7", Token: 9223372036854775807, Owner: "executor-1"}); r != nil {
		t.Errorf("a fresh grant is refused: %v", r)
	}
}

// Renewals and GETs re-sign: the same facts must give the same bytes.
func TestSigningIsDeterministic(t *testing.T) {
	k := newKeyPair(t)
	a := k.Sign(t, "account:a", 3, "o")
	b := k.Sign(t, "account:a", 3, "o")
	if a != b {
		t.Errorf("two signatures of the same grant differ:\n%s\n%s", a, b)
	}
}
