package granttest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"lock.dev/fence"
	"lock.dev/internal/grant"
)

// KeyPair is a signing key with its signer and the key set that verifies it.
type KeyPair struct {
	Priv   ed25519.PrivateKey
	Pub    ed25519.PublicKey
	KID    string
	Signer *grant.Signer
	Set    *fence.KeySet
}

// NewKeyPair makes a fresh key pair in memory.
func NewKeyPair(t testing.TB) KeyPair {
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
	return KeyPair{Priv: priv, Pub: pub, KID: s.KeyID(), Signer: s, Set: set}
}

// Sign is k's grant of lock at token to owner, acquired at a fixed instant so
// that two signings of the same lease are the same bytes.
func (k KeyPair) Sign(t testing.TB, lock string, token int64, owner string) string {
	t.Helper()
	g, err := k.Signer.Sign(lock, token, owner, time.Unix(1_700_000_000, 0))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Must turns a (string, error) call into its string, failing t on the error.
func Must(t testing.TB) func(string, error) string {
	return func(s string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

// DecodePart is part i of grant g (0 the header, 1 the claims), decoded.
func DecodePart(t testing.TB, g string, i int) string {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(strings.Split(g, ".")[i])
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
