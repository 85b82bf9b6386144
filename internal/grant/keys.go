package grant

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	jose "github.com/go-jose/go-jose/v4"
)

// The files `lock-server keygen --out DIR` writes (docs/contracts/signed-grants.md).
const (
	SigningKeyFile = "signing-key.pem" // PKCS#8 PEM, mode 0600
	KeySetFile     = "jwks.json"       // a JWK Set with the public key, mode 0644
)

// maxKeyFileBytes bounds what is read of a key file: a key set of a few hundred
// keys fits many times over.
const maxKeyFileBytes = 1 << 20

// pemPrivateKey is the PEM block type of a PKCS#8 private key.
const pemPrivateKey = "PRIVATE KEY"

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

// ReadSigningKey reads a PEM PKCS#8 Ed25519 private key, and reports whether the
// file can be read by others than its owner (the caller decides what to say).
func ReadSigningKey(path string) (key ed25519.PrivateKey, groupOrWorldReadable bool, err error) {
	b, mode, err := readKeyFile(path)
	if err != nil {
		return nil, false, err
	}
	block, rest := pem.Decode(b)
	if block == nil {
		return nil, false, errors.New("is not PEM")
	}
	if block.Type != pemPrivateKey {
		return nil, false, fmt.Errorf("holds a PEM %q block, want %q (PKCS#8)", block.Type, pemPrivateKey)
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, false, errors.New("holds more than one PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, false, errors.New("is not a PKCS#8 private key")
	}
	ed, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, false, fmt.Errorf("holds a %T, want an Ed25519 private key", k)
	}
	return ed, mode&0o077 != 0, nil
}

func readKeyFile(path string) ([]byte, os.FileMode, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("cannot be read: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, fmt.Errorf("cannot be read: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, 0, errors.New("is not a regular file")
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return nil, 0, fmt.Errorf("cannot be read: %w", err)
	}
	if len(b) > maxKeyFileBytes {
		return nil, 0, fmt.Errorf("is larger than %d bytes", maxKeyFileBytes)
	}
	return b, st.Mode().Perm(), nil
}

// PublicKey is one verification key and its key id.
type PublicKey struct {
	ID  string
	Key ed25519.PublicKey
}

// KeySet is a set of Ed25519 public keys by key id: what a fence point verifies
// grants with, and what lock-server publishes at GET /v1/keys. It is immutable
// once built, so any number of goroutines may use it.
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

// Join is a set with the keys of s, then those of others.
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

// ParseKeySet reads a JWK Set. Keys of other types (RSA, EC, symmetric, X25519) are
// skipped and counted in ignored: a shared JWK Set may hold them, and a grant is
// only ever verified with Ed25519. An Ed25519 key must be usable exactly as
// docs/contracts/signed-grants.md says, or the whole set is refused: public only
// (private material in a verifier's file is a leak, not a key), use "sig" and alg
// "EdDSA" when given, and a kid, when given, equal to its RFC 7638 thumbprint (any
// other kid would let a file name one key with another's id). A set with no usable
// key is refused too.
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

// ReadKeySet reads a JWK Set file (see ParseKeySet).
func ReadKeySet(path string) (set *KeySet, ignored int, err error) {
	set, ignored, _, err = ReadKeySetSum(path)
	return set, ignored, err
}

// ReadKeySetSum is ReadKeySet, also returning the SHA-256 of the file's bytes:
// what a key watch compares to tell a changed file (docs/contracts/workload-identity.md:
// by content, not by modification time).
func ReadKeySetSum(path string) (set *KeySet, ignored int, sum [sha256.Size]byte, err error) {
	b, _, err := readKeyFile(path)
	if err != nil {
		return nil, 0, sum, err
	}
	sum = sha256.Sum256(b)
	set, ignored, err = ParseKeySet(b)
	return set, ignored, sum, err
}

// Keygen makes a key pair for lock-server: DIR/signing-key.pem (PKCS#8 PEM, mode
// 0600) and DIR/jwks.json (a JWK Set with the public key, mode 0644). It creates
// dir (mode 0700) when it does not exist, and refuses to overwrite either file: a
// key replaced by mistake would orphan every grant signed with it. It returns the
// new key's id.
func Keygen(dir string) (kid string, err error) {
	if dir == "" {
		return "", errors.New("keygen: no directory given")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("keygen: %w", err)
	}
	keyPath, setPath := filepath.Join(dir, SigningKeyFile), filepath.Join(dir, KeySetFile)
	for _, p := range []string{keyPath, setPath} {
		if _, err := os.Lstat(p); err == nil {
			return "", fmt.Errorf("keygen: %s already exists; refusing to overwrite it", p)
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("keygen: %w", err)
		}
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", fmt.Errorf("keygen: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", fmt.Errorf("keygen: %w", err)
	}
	set, err := NewKeySet(pub)
	if err != nil {
		return "", fmt.Errorf("keygen: %w", err)
	}
	setJSON, err := json.Marshal(set)
	if err != nil {
		return "", fmt.Errorf("keygen: %w", err)
	}
	var indented bytes.Buffer
	if err := json.Indent(&indented, setJSON, "", "  "); err != nil {
		return "", fmt.Errorf("keygen: %w", err)
	}
	indented.WriteByte('\n')
	if err := writeNew(keyPath, pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der}), 0o600); err != nil {
		return "", fmt.Errorf("keygen: %w", err)
	}
	if err := writeNew(setPath, indented.Bytes(), 0o644); err != nil {
		// Never leave a private key without its public half: the pair is made again.
		_ = os.Remove(keyPath)
		return "", fmt.Errorf("keygen: %w", err)
	}
	return set.IDs()[0], nil
}

// writeNew creates path (never an existing file), writes b, sets mode exactly (the
// umask only takes bits away; 0644 is what docs/contracts/signed-grants.md says the
// key set is) and syncs.
func writeNew(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode&0o600)
	if err != nil {
		return err
	}
	_, werr := f.Write(b)
	if werr == nil {
		werr = f.Chmod(mode)
	}
	if werr == nil {
		werr = f.Sync()
	}
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}
