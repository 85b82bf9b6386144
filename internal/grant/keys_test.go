package grant_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/grant"
)

// keygen writes the pair docs/contracts/signed-grants.md names with the modes it
// names; the private key reads back, the key set holds its public half under its
// thumbprint.
func TestKeygenWritesThePair(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys", "lock-server")
	kid, err := grant.Keygen(dir)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{
		dir:                                      0o700,
		filepath.Join(dir, grant.SigningKeyFile): 0o600,
		filepath.Join(dir, grant.KeySetFile):     0o644,
	} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s has mode %o, want %o", path, st.Mode().Perm(), want)
		}
	}
	priv, loose, err := grant.ReadSigningKey(filepath.Join(dir, grant.SigningKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if loose {
		t.Error("a 0600 key file is reported as readable by others")
	}
	set, ignored, err := grant.ReadKeySet(filepath.Join(dir, grant.KeySetFile))
	if err != nil || ignored != 0 {
		t.Fatalf("key set: %v (ignored %d)", err, ignored)
	}
	pub, ok := set.Lookup(kid)
	if !ok || !pub.Equal(priv.Public()) || set.Len() != 1 {
		t.Fatalf("the key set does not hold the new key under kid %s: %v", kid, set.IDs())
	}
	b, _ := os.ReadFile(filepath.Join(dir, grant.KeySetFile))
	var doc struct {
		Keys []map[string]string `json:"keys"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || len(doc.Keys) != 1 {
		t.Fatalf("jwks.json: %s", b)
	}
	k := doc.Keys[0]
	if k["kty"] != "OKP" || k["crv"] != "Ed25519" || k["use"] != "sig" || k["alg"] != "EdDSA" || k["kid"] != kid || k["x"] == "" || k["d"] != "" {
		t.Errorf("jwks.json key %v is not the public JWK docs/contracts/signed-grants.md describes", k)
	}
	// The signer made from the file signs grants the set verifies.
	s, err := grant.NewSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	g, err := s.Sign("account:a", 1, "o", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	v := newVerifier(t, set, 0)
	if _, r := v.Verify(g, grant.Presented{Lock: "account:a", Token: 1, Owner: "o"}); r != nil {
		t.Error(r)
	}
}

func TestKeygenRefusesToOverwrite(t *testing.T) {
	for _, existing := range []string{grant.SigningKeyFile, grant.KeySetFile} {
		dir := t.TempDir()
		path := filepath.Join(dir, existing)
		if err := os.WriteFile(path, []byte("keep me"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := grant.Keygen(dir); err == nil || !strings.Contains(err.Error(), "refusing to overwrite") {
			t.Errorf("with %s present: %v, want a refusal", existing, err)
		}
		if b, _ := os.ReadFile(path); string(b) != "keep me" {
			t.Errorf("%s was overwritten", existing)
		}
		entries, _ := os.ReadDir(dir)
		if len(entries) != 1 {
			t.Errorf("keygen left %d files after refusing, want only the existing one", len(entries))
		}
	}
}

func writeFile(t *testing.T, name string, b []byte, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func pkcs8PEM(t *testing.T, key any) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func TestReadSigningKeyRefusesWhatIsNotAnEd25519Key(t *testing.T) {
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	good := pkcs8PEM(t, ed)
	cases := map[string][]byte{
		"not PEM":          []byte("hello"),
		"an EC key":        pkcs8PEM(t, ec),
		"an RSA key":       pkcs8PEM(t, rk),
		"two PEM blocks":   append(append([]byte{}, good...), good...),
		"a public key":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte{1, 2, 3}}),
		"garbage in PEM":   pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2, 3}}),
		"an empty file":    {},
		"a JWK, not a PEM": []byte(`{"kty":"OKP"}`),
	}
	for name, b := range cases {
		if _, _, err := grant.ReadSigningKey(writeFile(t, "k.pem", b, 0o600)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, _, err := grant.ReadSigningKey(filepath.Join(t.TempDir(), "absent.pem")); err == nil {
		t.Error("a missing file: accepted")
	}
	if _, _, err := grant.ReadSigningKey(t.TempDir()); err == nil {
		t.Error("a directory: accepted")
	}
	_, loose, err := grant.ReadSigningKey(writeFile(t, "k.pem", good, 0o644))
	if err != nil || !loose {
		t.Errorf("a 0644 key file: loose=%v err=%v, want it read and reported readable by others", loose, err)
	}
}
