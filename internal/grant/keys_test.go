package grant_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
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
	if r := v.Verify(g, grant.Presented{Lock: "account:a", Token: 1, Owner: "o"}); r != nil {
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

func jwk(pub ed25519.PublicKey, extra map[string]any) map[string]any {
	k := map[string]any{"kty": "OKP", "crv": "Ed25519", "x": base64.RawURLEncoding.EncodeToString(pub)}
	for n, v := range extra {
		k[n] = v
	}
	return k
}

func TestParseKeySet(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	pub2, _, _ := ed25519.GenerateKey(rand.Reader)
	kid, _ := grant.KeyID(pub)
	rsaKey := map[string]any{"kty": "RSA", "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw", "e": "AQAB"}
	enc := func(v any) []byte { b, _ := json.Marshal(v); return b }
	set := func(keys ...any) []byte { return enc(map[string]any{"keys": keys}) }

	good := map[string]struct {
		doc     []byte
		ids     []string
		ignored int
	}{
		"minimal":               {set(jwk(pub, nil)), []string{kid}, 0},
		"use, alg and kid":      {set(jwk(pub, map[string]any{"use": "sig", "alg": "EdDSA", "kid": kid})), []string{kid}, 0},
		"an RSA key beside it":  {set(rsaKey, jwk(pub, nil)), []string{kid}, 1},
		"an X25519 key beside":  {set(map[string]any{"kty": "OKP", "crv": "X25519", "x": base64.RawURLEncoding.EncodeToString(pub2)}, jwk(pub, nil)), []string{kid}, 1},
		"the same key twice":    {set(jwk(pub, nil), jwk(pub, map[string]any{"kid": kid})), []string{kid}, 0},
		"other members ignored": {enc(map[string]any{"keys": []any{jwk(pub, nil)}, "note": "rotation"}), []string{kid}, 0},
	}
	for name, c := range good {
		s, ignored, err := grant.ParseKeySet(c.doc)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if strings.Join(s.IDs(), ",") != strings.Join(c.ids, ",") || ignored != c.ignored {
			t.Errorf("%s: ids %v ignored %d, want %v and %d", name, s.IDs(), ignored, c.ids, c.ignored)
		}
	}

	bad := map[string][]byte{
		"not JSON":               []byte("keys"),
		"no keys member":         enc(map[string]any{"key": []any{jwk(pub, nil)}}),
		"no keys":                set(),
		"only an RSA key":        set(rsaKey),
		"a private key":          set(jwk(pub, map[string]any{"d": base64.RawURLEncoding.EncodeToString(priv.Seed())})),
		"use enc":                set(jwk(pub, map[string]any{"use": "enc"})),
		"alg ES256":              set(jwk(pub, map[string]any{"alg": "ES256"})),
		"kid not its thumbprint": set(jwk(pub, map[string]any{"kid": "lock-server-1"})),
		"another key's kid":      set(jwk(pub2, map[string]any{"kid": kid})),
		"x of 31 bytes":          set(map[string]any{"kty": "OKP", "crv": "Ed25519", "x": base64.RawURLEncoding.EncodeToString(pub[:31])}),
		"no kty":                 set(map[string]any{"crv": "Ed25519", "x": base64.RawURLEncoding.EncodeToString(pub)}),
	}
	for name, doc := range bad {
		if s, _, err := grant.ParseKeySet(doc); err == nil {
			t.Errorf("%s: accepted with keys %v", name, s.IDs())
		}
	}
}

// The set serves as the JWK Set of docs/contracts/signed-grants.md and reads back as itself.
func TestKeySetRoundTrip(t *testing.T) {
	a, b := newKeyPair(t), newKeyPair(t)
	s := a.set.Join(b.set, a.set)
	if s.Len() != 2 {
		t.Fatalf("joined set has %d keys, want 2", s.Len())
	}
	doc, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	back, _, err := grant.ParseKeySet(doc)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(back.IDs(), ",") != a.kid+","+b.kid {
		t.Errorf("read back %v, want [%s %s]", back.IDs(), a.kid, b.kid)
	}
	empty, _ := json.Marshal(&grant.KeySet{})
	if string(empty) != `{"keys":[]}` {
		t.Errorf("an empty set is %s, want {\"keys\":[]}", empty)
	}
}
