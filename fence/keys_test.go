package fence_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"lock.dev/fence"
)

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
	kid, _ := fence.KeyID(pub)
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
		s, ignored, err := fence.ParseKeySet(c.doc)
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
		if s, _, err := fence.ParseKeySet(doc); err == nil {
			t.Errorf("%s: accepted with keys %v", name, s.IDs())
		}
	}
}

// The set serves as the JWK Set of docs/contracts/signed-grants.md and reads back as itself.
func TestKeySetRoundTrip(t *testing.T) {
	a, b := newKeyPair(t), newKeyPair(t)
	s := a.Set.Join(b.Set, a.Set)
	if s.Len() != 2 {
		t.Fatalf("joined set has %d keys, want 2", s.Len())
	}
	doc, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	back, _, err := fence.ParseKeySet(doc)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(back.IDs(), ",") != a.KID+","+b.KID {
		t.Errorf("read back %v, want [%s %s]", back.IDs(), a.KID, b.KID)
	}
	empty, _ := json.Marshal(&fence.KeySet{})
	if string(empty) != `{"keys":[]}` {
		t.Errorf("an empty set is %s, want {\"keys\":[]}", empty)
	}
}
