package grant

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"lock.dev/fence"
)

// Signer is lock-server's side: it signs a grant for each lease it hands out. It
// is safe for concurrent use.
//
// A grant is a pure function of (lock, token, owner, acquired-at) and the key:
// Ed25519 signatures are deterministic and the header and claims are written in a
// fixed order, so a renewal or a GET re-signs the same facts into the same bytes as
// the acquire did (docs/contracts/signed-grants.md: "the same grant, byte for
// byte"), without lockdb having to store it.
type Signer struct {
	kid    string
	public *KeySet
	signer jose.Signer
}

// NewSigner signs with key.
func NewSigner(key ed25519.PrivateKey) (*Signer, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("an Ed25519 private key is %d bytes, got %d", ed25519.PrivateKeySize, len(key))
	}
	pub, ok := key.Public().(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("not an Ed25519 key")
	}
	set, err := fence.NewKeySet(pub)
	if err != nil {
		return nil, err
	}
	kid := set.IDs()[0]
	opts := (&jose.SignerOptions{}).WithType(Type)
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: jose.JSONWebKey{Key: key, KeyID: kid}}, opts)
	if err != nil {
		return nil, fmt.Errorf("grant signer: %w", err)
	}
	return &Signer{kid: kid, public: set, signer: s}, nil
}

// KeyID is the id of the signing key, the kid of every grant it signs.
func (s *Signer) KeyID() string { return s.kid }

// PublicKeys is the set holding the signing key's public half.
func (s *Signer) PublicKeys() *KeySet { return s.public }

// wireClaims is the claims object in the order it is written.
type wireClaims struct {
	Issuer   string `json:"iss"`
	Lock     string `json:"lock"`
	Token    string `json:"tok"` // a decimal string: int64 does not fit a JSON number safely
	Subject  string `json:"sub"`
	IssuedAt int64  `json:"iat"`
	Workload string `json:"wid,omitempty"` // the acquirer's SPIFFE ID; absent without identities
}

// Sign returns the grant of token on lock to owner, issued at acquiredAt (lockdb's
// clock at the grant, whole seconds), without wid: what lock-server signs when it
// serves no identities. Its header is {"alg":"EdDSA","kid":…,"typ":"lockgrant+jwt"}.
func (s *Signer) Sign(lock string, token int64, owner string, acquiredAt time.Time) (string, error) {
	return s.SignFor(lock, token, owner, "", acquiredAt)
}

// SignFor is Sign with the claim wid = workload, the SPIFFE ID of the workload
// that acquired the lease (docs/contracts/workload-identity.md), written after
// iat; an empty workload writes no wid.
func (s *Signer) SignFor(lock string, token int64, owner, workload string, acquiredAt time.Time) (string, error) {
	payload, err := json.Marshal(wireClaims{
		Issuer:   Issuer,
		Lock:     lock,
		Token:    strconv.FormatInt(token, 10),
		Subject:  owner,
		IssuedAt: acquiredAt.Unix(),
		Workload: workload,
	})
	if err != nil {
		return "", fmt.Errorf("grant claims: %w", err)
	}
	obj, err := s.signer.Sign(payload)
	if err != nil {
		return "", fmt.Errorf("sign grant: %w", err)
	}
	return obj.CompactSerialize()
}
