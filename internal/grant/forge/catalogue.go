package forge

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"lock.dev/internal/grant"
	"lock.dev/lockapi"
)

// Case is one presentation a fence point must refuse: the X-Fencing-Grant values
// (nil: no header), what the request presents besides, and the reason
// docs/contracts/signed-grants.md gives.
type Case struct {
	Name    string
	Grants  []string
	Account string // accountId of the submission, or the payout's account
	Token   int64  // X-Fencing-Token
	Owner   string // X-Owner-Id
	Reason  string
}

// Catalogue is every refusal reason of docs/contracts/signed-grants.md, with the
// attacks it must refuse (alg none, HS256 "signed" with the public key, tok off by
// one, a grant of acct-1 for acct-10), against a fence point that verifies with
// key's public half. The honest presentation is a grant of token on account:account
// to owner; every case changes one thing. account must be "acct-1" for the acct-10
// case to mean what it says.
func Catalogue(key ed25519.PrivateKey, account string, token int64, owner string) ([]Case, error) {
	signer, err := grant.NewSigner(key)
	if err != nil {
		return nil, err
	}
	kid := signer.KeyID()
	lock := lockapi.AccountLockName(account)
	real, err := signer.Sign(lock, token, owner, time.Unix(1_700_000_000, 0))
	if err != nil {
		return nil, err
	}
	_, rogue, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	pub, _ := key.Public().(ed25519.PublicKey)
	pubJWK, err := PublicKeyJSON(pub)
	if err != nil {
		return nil, err
	}
	var firstErr error
	m := func(s string, err error) string {
		if err != nil && firstErr == nil {
			firstErr = err
		}
		return s
	}
	claims := func(edit func(Claims)) Claims {
		c := GrantClaims(lock, token, owner)
		if edit != nil {
			edit(c)
		}
		return c
	}
	header := GrantHeader(kid)
	parts := strings.Split(real, ".")
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	sig[0] ^= 1
	flipped := parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(sig)
	one := func(g string) []string { return []string{g} }
	respelled := m(NonCanonical(real, 2))

	cases := []Case{
		{"no X-Fencing-Grant", nil, account, token, owner, grant.ReasonMissing},
		{"an empty X-Fencing-Grant", one(""), account, token, owner, grant.ReasonMissing},
		{"X-Fencing-Grant twice", []string{real, real}, account, token, owner, grant.ReasonMalformed},
		{"not a JWS", one("not-a-grant"), account, token, owner, grant.ReasonMalformed},
		{"signature's last character respelled (same bytes, not canonical base64url)", one(respelled), account, token, owner, grant.ReasonMalformed},
		{"alg none", one(m(Unsigned(header, claims(nil)))), account, token, owner, grant.ReasonMalformed},
		{"HS256 keyed with the public key (algorithm confusion)", one(m(HMAC(pubJWK, header, claims(nil)))), account, token, owner, grant.ReasonMalformed},
		{"tok as a JSON number", one(m(Sign(key, header, claims(func(c Claims) { c["tok"] = token })))), account, token, owner, grant.ReasonMalformed},
		{"signed by the attacker's own key", one(m(OwnKey(rogue, lock, token, owner))), account, token, owner, grant.ReasonUnknownKey},
		{"tok edited in a real grant", one(m(EditToken(real, lockapi.MaxInt64))), account, lockapi.MaxInt64, owner, grant.ReasonBadSignature},
		{"signature bit flipped", one(flipped), account, token, owner, grant.ReasonBadSignature},
		{"issuer not lock-server", one(m(Sign(key, header, claims(func(c Claims) { c["iss"] = "someone" })))), account, token, owner, grant.ReasonWrongIssuer},
		{fmt.Sprintf("grant of %s used for %s0", account, account), one(real), account + "0", token, owner, grant.ReasonLockMismatch},
		{"X-Fencing-Token one above the grant's tok", one(real), account, token + 1, owner, grant.ReasonTokenMismatch},
		{"X-Fencing-Token one below the grant's tok", one(real), account, token - 1, owner, grant.ReasonTokenMismatch},
		{"a real grant with a huge X-Fencing-Token", one(real), account, lockapi.MaxInt64, owner, grant.ReasonTokenMismatch},
		{"another X-Owner-Id", one(real), account, token, owner + "-x", grant.ReasonOwnerMismatch},
	}
	return cases, firstErr
}
