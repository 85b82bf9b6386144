package fence

import (
	"crypto"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	jose "github.com/go-jose/go-jose/v4"
)

// MaxKeySetBytes bounds what ReadKeySet reads of a file: a key set of a few
// hundred keys fits many times over.
const MaxKeySetBytes = 1 << 20

// KeyID is the key id of pub: its RFC 7638 JWK thumbprint, SHA-256, base64url
// without padding. Being derived from the key, it cannot name another key.
func KeyID(pub ed25519.PublicKey) (string, error) {
	jwk := jose.JSONWebKey{Key: pub}
	tp, err := jwk.Thumbprint(crypto.SHA256)
	if err != nil {
		return "", fmt.Errorf("thumbprint: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(tp), nil
}

// PublicKey is one verification key and its key id.
type PublicKey struct {
	ID  string
	Key ed25519.PublicKey
}

// KeySet is a set of Ed25519 public keys by key id: what grants are verified
// with, and what lock-server publishes at GET /v1/keys. It is immutable once
// built, so any number of goroutines may use it.
type KeySet struct {
	keys []PublicKey
}

// NewKeySet builds a set of keys; a key given twice is kept once.
func NewKeySet(keys ...ed25519.PublicKey) (*KeySet, error) {
	s := &KeySet{}
	for _, k := range keys {
		if len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("an Ed25519 public key is %d bytes, got %d", ed25519.PublicKeySize, len(k))
		}
		id, err := KeyID(k)
		if err != nil {
			return nil, err
		}
		s.add(PublicKey{ID: id, Key: k})
	}
	return s, nil
}

func (s *KeySet) add(k PublicKey) {
	if _, ok := s.Lookup(k.ID); !ok {
		s.keys = append(s.keys, k)
	}
}

// Join is a set with the keys of s, then those of others: a verifier given the
// current and the next key accepts grants of both during a rotation.
func (s *KeySet) Join(others ...*KeySet) *KeySet {
	out := &KeySet{}
	for _, set := range append([]*KeySet{s}, others...) {
		if set == nil {
			continue
		}
		for _, k := range set.keys {
			out.add(k)
		}
	}
	return out
}

// Lookup finds the key named kid. A set holds a handful of keys: a scan beats a map.
func (s *KeySet) Lookup(kid string) (ed25519.PublicKey, bool) {
	if s == nil {
		return nil, false
	}
	for _, k := range s.keys {
		if k.ID == kid {
			return k.Key, true
		}
	}
	return nil, false
}

// Len is the number of keys.
func (s *KeySet) Len() int {
	if s == nil {
		return 0
	}
	return len(s.keys)
}

// IDs lists the key ids, in the set's order.
func (s *KeySet) IDs() []string {
	ids := make([]string, 0, s.Len())
	if s != nil {
		for _, k := range s.keys {
			ids = append(ids, k.ID)
		}
	}
	return ids
}

// jwks is a JWK Set as written: every key with use "sig" and alg "EdDSA".
type jwks struct {
	Keys []jose.JSONWebKey `json:"keys"`
}

// MarshalJSON writes the set as an RFC 7517 JWK Set:
// {"keys":[{"kty":"OKP","crv":"Ed25519","x":…,"kid":…,"use":"sig","alg":"EdDSA"}]}.
func (s *KeySet) MarshalJSON() ([]byte, error) {
	out := jwks{Keys: make([]jose.JSONWebKey, 0, s.Len())}
	if s != nil {
		for _, k := range s.keys {
			out.Keys = append(out.Keys, jose.JSONWebKey{Key: k.Key, KeyID: k.ID, Use: "sig", Algorithm: Algorithm})
		}
	}
	return json.Marshal(out)
}

// ParseKeySet reads a JWK Set, such as lock-server's GET /v1/keys answer or the
// jwks.json of `lock-server keygen`. Keys of other types (RSA, EC, symmetric,
// X25519) are skipped and counted in ignored: a shared JWK Set may hold them, and
// a grant is only ever verified with Ed25519. An Ed25519 key must be usable
// exactly as docs/contracts/signed-grants.md says, or the whole set is refused:
// public only (private material in a verifier's file is a leak, not a key), use
// "sig" and alg "EdDSA" when given, and a kid, when given, equal to its RFC 7638
// thumbprint (any other kid would let a file name one key with another's id). A
// set with no usable key is refused too.
func ParseKeySet(b []byte) (set *KeySet, ignored int, err error) {
	var raw struct {
		Keys *[]json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, 0, errors.New("is not a JSON JWK Set")
	}
	if raw.Keys == nil {
		return nil, 0, errors.New(`is not a JWK Set: no "keys" member`)
	}
	set = &KeySet{}
	for i, rk := range *raw.Keys {
		var k jose.JSONWebKey
		if err := k.UnmarshalJSON(rk); err != nil {
			if errors.Is(err, jose.ErrUnsupportedKeyType) {
				ignored++
				continue
			}
			return nil, 0, fmt.Errorf("key %d cannot be read: %v", i, err)
		}
		pub, isEd := k.Key.(ed25519.PublicKey)
		if _, priv := k.Key.(ed25519.PrivateKey); priv {
			return nil, 0, fmt.Errorf("key %d holds private key material (\"d\"): a key set file holds public keys only", i)
		}
		if !isEd {
			ignored++
			continue
		}
		if k.Use != "" && k.Use != "sig" {
			return nil, 0, fmt.Errorf("key %d has use %q, want \"sig\"", i, k.Use)
		}
		if k.Algorithm != "" && k.Algorithm != Algorithm {
			return nil, 0, fmt.Errorf("key %d has alg %q, want %q", i, k.Algorithm, Algorithm)
		}
		id, err := KeyID(pub)
		if err != nil {
			return nil, 0, fmt.Errorf("key %d: %v", i, err)
		}
		if k.KeyID != "" && k.KeyID != id {
			return nil, 0, fmt.Errorf("key %d has kid %q, but its RFC 7638 thumbprint is %q", i, k.KeyID, id)
		}
		set.add(PublicKey{ID: id, Key: pub})
	}
	if set.Len() == 0 {
		return nil, ignored, fmt.Errorf("holds no usable Ed25519 key (%d keys of other types ignored)", ignored)
	}
	return set, ignored, nil
}

// ReadKeySet reads a JWK Set file (see ParseKeySet) of at most MaxKeySetBytes.
// Its errors read after the file's name or setting: "… is not a JSON JWK Set".
func ReadKeySet(path string) (set *KeySet, ignored int, err error) {
	b, err := readKeySetFile(path)
	if err != nil {
		return nil, 0, err
	}
	return ParseKeySet(b)
}

// readKeySetFile reads the bytes of a key set file, refusing anything but a
// regular file of at most MaxKeySetBytes.
func readKeySetFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot be read: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("cannot be read: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, errors.New("is not a regular file")
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxKeySetBytes+1))
	if err != nil {
		return nil, fmt.Errorf("cannot be read: %w", err)
	}
	if len(b) > MaxKeySetBytes {
		return nil, fmt.Errorf("is larger than %d bytes", MaxKeySetBytes)
	}
	return b, nil
}
