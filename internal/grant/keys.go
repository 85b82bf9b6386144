package grant

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"lock.dev/fence"
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

// ReadKeySetSum is fence.ReadKeySet, also returning the SHA-256 of the file's
// bytes: what a key watch compares to tell a changed file
// (docs/contracts/workload-identity.md: by content, not by modification time).
func ReadKeySetSum(path string) (set *KeySet, ignored int, sum [sha256.Size]byte, err error) {
	b, _, err := readKeyFile(path)
	if err != nil {
		return nil, 0, sum, err
	}
	sum = sha256.Sum256(b)
	set, ignored, err = fence.ParseKeySet(b)
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
	set, err := fence.NewKeySet(pub)
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
