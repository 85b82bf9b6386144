// Package forge makes the grants an attacker would try — unsigned, HMAC-"signed"
// with the public key, signed with the attacker's own key, real grants with a claim
// edited — for the tests of both fence points and for lockdemo's rogue client. It
// never appears on a service's path: services only verify.
package forge

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	jose "github.com/go-jose/go-jose/v4"

	"lock.dev/fence"
	"lock.dev/internal/grant"
)

var b64 = base64.RawURLEncoding

// Claims are a grant's claims as a JSON object, so a forgery can give any member
// any type (tok as a number, say) or leave one out.
type Claims map[string]any

// Header is a grant's protected header as a JSON object.
type Header map[string]any

// GrantClaims are the claims lock-server would write for token on lock to owner.
func GrantClaims(lock string, token int64, owner string) Claims {
	return Claims{"iss": grant.Issuer, "lock": lock, "tok": fmt.Sprint(token), "sub": owner, "iat": int64(1_700_000_000)}
}

// GrantHeader is the header lock-server would write with key id kid.
func GrantHeader(kid string) Header {
	return Header{"alg": grant.Algorithm, "typ": grant.Type, "kid": kid}
}

func encode(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("forge: %w", err)
	}
	return b64.EncodeToString(b), nil
}

// input is the signing input: base64url(header) "." base64url(claims).
func input(h Header, c Claims) (string, error) {
	hs, err := encode(h)
	if err != nil {
		return "", err
	}
	cs, err := encode(c)
	if err != nil {
		return "", err
	}
	return hs + "." + cs, nil
}

func with(h Header, alg string) Header {
	h2 := Header{}
	for k, v := range h {
		h2[k] = v
	}
	h2["alg"] = alg
	return h2
}

// Raw joins a header and claims, both given as JSON text, with sig (already
// base64url).
func Raw(headerJSON, claimsJSON, sig string) string {
	return b64.EncodeToString([]byte(headerJSON)) + "." + b64.EncodeToString([]byte(claimsJSON)) + "." + sig
}

// Unsigned is an "alg":"none" token with an empty signature: the oldest trick.
func Unsigned(h Header, c Claims) (string, error) {
	in, err := input(with(h, "none"), c)
	return in + ".", err
}

// HMAC is an "alg":"HS256" token whose MAC key is secret — an attacker passes the
// verifier's public key as the secret, hoping a library picks the algorithm from
// the token (algorithm confusion).
func HMAC(secret []byte, h Header, c Claims) (string, error) {
	in, err := input(with(h, "HS256"), c)
	if err != nil {
		return "", err
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(in))
	return in + "." + b64.EncodeToString(m.Sum(nil)), nil
}

// Sign signs any header and claims with key: a real signature over whatever the
// caller wants said (an attacker's own key, or — in tests — the real key with a
// claim lock-server would never write).
func Sign(key ed25519.PrivateKey, h Header, c Claims) (string, error) {
	in, err := input(h, c)
	if err != nil {
		return "", err
	}
	return in + "." + b64.EncodeToString(ed25519.Sign(key, []byte(in))), nil
}

// OwnKey signs lock-server's claims for token on lock to owner with the attacker's
// key, naming that key's own id as kid.
func OwnKey(key ed25519.PrivateKey, lock string, token int64, owner string) (string, error) {
	pub, ok := key.Public().(ed25519.PublicKey)
	if !ok {
		return "", fmt.Errorf("forge: not an Ed25519 key")
	}
	kid, err := fence.KeyID(pub)
	if err != nil {
		return "", err
	}
	return Sign(key, GrantHeader(kid), GrantClaims(lock, token, owner))
}

// EditClaims changes a real grant's claims and keeps its header and signature:
// what an attacker who saw a grant in transit can do.
func EditClaims(g string, edit func(Claims)) (string, error) {
	parts := strings.Split(g, ".")
	if len(parts) != 3 {
		return "", fmt.Errorf("forge: not a compact JWS")
	}
	b, err := b64.DecodeString(parts[1])
	if err != nil {
		return "", fmt.Errorf("forge: claims: %w", err)
	}
	var c Claims
	if err := json.Unmarshal(b, &c); err != nil {
		return "", fmt.Errorf("forge: claims: %w", err)
	}
	edit(c)
	cs, err := encode(c)
	if err != nil {
		return "", err
	}
	return parts[0] + "." + cs + "." + parts[2], nil
}

// EditToken is EditClaims setting tok to token.
func EditToken(g string, token int64) (string, error) {
	return EditClaims(g, func(c Claims) { c["tok"] = fmt.Sprint(token) })
}

// PublicKeyJSON is the public key as an RFC 7517 JWK — the bytes an attacker
// would feed an HMAC as its "secret".
func PublicKeyJSON(pub ed25519.PublicKey) ([]byte, error) {
	return json.Marshal(jose.JSONWebKey{Key: pub})
}

// NonCanonical respells part i (0 header, 1 claims, 2 signature) of grant g: its
// last character becomes another that a lenient base64url decoder reads as the
// same bytes (the character's unused low bits set). It fails when the part's
// length leaves no unused bits (a multiple of 3 bytes): there is no other
// spelling then.
func NonCanonical(g string, i int) (string, error) {
	parts := strings.Split(g, ".")
	if len(parts) != 3 || i < 0 || i > 2 {
		return "", fmt.Errorf("forge: not a compact JWS, or no part %d", i)
	}
	p := parts[i]
	var unused uint
	switch len(p) % 4 {
	case 2:
		unused = 4 // 12 bits for 1 byte
	case 3:
		unused = 2 // 18 bits for 2 bytes
	default:
		return "", fmt.Errorf("forge: part %d has no unused bits to set", i)
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	v := strings.IndexByte(alphabet, p[len(p)-1])
	if v < 0 {
		return "", fmt.Errorf("forge: part %d is not base64url", i)
	}
	parts[i] = p[:len(p)-1] + string(alphabet[v|(1<<unused-1)])
	return strings.Join(parts, "."), nil
}
