// Package granttest makes what the fence points' tests present: a key pair
// written by keygen, honest grants signed with it, and a key set file holding
// several sets at once (the overlap of a rotation). The attacks are package
// forge's. Nothing here is on a service's path.
package granttest

import (
	"crypto/ed25519"
	"os"
	"path/filepath"
	"testing"
	"time"

	"lock.dev/internal/grant"
	"lock.dev/lockapi"
)

// Keys makes a key pair with keygen: the private key (lock-server's) and the
// key set file a fence point is given.
func Keys(t testing.TB) (ed25519.PrivateKey, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "keys")
	if _, err := grant.Keygen(dir); err != nil {
		t.Fatal(err)
	}
	key, _, err := grant.ReadSigningKey(filepath.Join(dir, grant.SigningKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	return key, filepath.Join(dir, grant.KeySetFile)
}

// Sign is the grant lock-server would issue with key for a lease of account's
// lock at token, held by owner, issued now.
func Sign(t testing.TB, key ed25519.PrivateKey, account string, token int64, owner string) string {
	t.Helper()
	return SignFor(t, key, account, token, owner, "")
}

// SignFor is Sign with wid = workload, the SPIFFE ID of the workload that
// acquired the lease (what lock-server serving mutual TLS signs); an empty
// workload writes no wid.
func SignFor(t testing.TB, key ed25519.PrivateKey, account string, token int64, owner, workload string) string {
	t.Helper()
	s, err := grant.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	g, err := s.SignFor(lockapi.AccountLockName(account), token, owner, workload, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// JoinedKeySetFile writes one key set file holding every key of the given key
// set files, in their order, and returns its path.
func JoinedKeySetFile(t testing.TB, files ...string) string {
	t.Helper()
	sets := make([]*grant.KeySet, len(files))
	for i, f := range files {
		s, _, err := grant.ReadKeySet(f)
		if err != nil {
			t.Fatal(err)
		}
		sets[i] = s
	}
	b, err := sets[0].Join(sets[1:]...).MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "joined.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
