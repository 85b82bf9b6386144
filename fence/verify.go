package fence

import (
	"encoding/base64"
	"errors"
	"math"
	"strings"
	"sync/atomic"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/jsonbody"
	"lock.dev/lockapi"
)

// DefaultCacheSize is how many verified grants a Verifier remembers. A grant is
// verified once per lease and then presented with each of the lease's calls, so
// the cache needs room for the leases live at once (renewals keep the same
// grant) — a few thousand is many times that, at about half a kilobyte each.
const DefaultCacheSize = 4096

// allowedAlgorithms is the whole list go-jose may accept: EdDSA, never "none",
// never an HMAC that could be "signed" with the public key as its secret.
var allowedAlgorithms = []jose.SignatureAlgorithm{jose.EdDSA}

// Verifier checks a grant against its key set and against what the request
// presents, in the order of docs/contracts/signed-grants.md. It is safe for
// concurrent use.
type Verifier struct {
	cacheSize int
	// cur is the key set and the cache of grants verified with it, swapped
	// together: a grant remembered under a set is never believed under the next
	// one, so a key removed from the set stops passing at the swap.
	cur atomic.Pointer[keyed]
}

// keyed is a key set with the grants verified by it.
type keyed struct {
	keys  *KeySet
	cache *cache
}

// NewVerifier verifies with keys, remembering up to cacheSize verified grants
// (DefaultCacheSize when cacheSize ≤ 0).
func NewVerifier(keys *KeySet, cacheSize int) (*Verifier, error) {
	if keys.Len() == 0 {
		return nil, errors.New("grant verifier: no key to verify with")
	}
	if cacheSize <= 0 {
		cacheSize = DefaultCacheSize
	}
	v := &Verifier{cacheSize: cacheSize}
	v.cur.Store(&keyed{keys: keys, cache: newCache(cacheSize)})
	return v, nil
}

// Keys is the set grants are verified with.
func (v *Verifier) Keys() *KeySet { return v.cur.Load().keys }

// SetKeys verifies with keys from now on (a key set file re-read after a
// rotation), with an empty cache: no grant verified under the previous set
// passes without being verified again.
func (v *Verifier) SetKeys(keys *KeySet) error {
	if keys.Len() == 0 {
		return errors.New("grant verifier: no key to verify with")
	}
	v.cur.Store(&keyed{keys: keys, cache: newCache(v.cacheSize)})
	return nil
}

// Verify checks grant g against what the request presents. It returns the
// grant's claims when g is a grant lock-server signed, with one of the set's
// keys, of p.Token on p.Lock to p.Owner; otherwise a *Rejection with the first
// reason of the order of docs/contracts/signed-grants.md that applies.
//
// Verify does not compare the grant's workload (wid): that takes the caller's
// verified identity, which MatchWorkload and Middleware compare.
//
// The signature is checked once per grant string: a grant that verified is
// remembered with its claims, and a later request presenting the same string only
// has its lock, token and owner compared — so a remembered grant of one lock
// or token or owner passes for no other. Only grants that verified (signature and
// issuer) are remembered: a caller without lock-server's key cannot put anything
// in the cache, nor push a real grant out of it.
func (v *Verifier) Verify(g string, p Presented) (Claims, error) {
	c, r := v.verify(g, p)
	if r != nil {
		// Never a nil *Rejection in a non-nil error.
		return Claims{}, r
	}
	return c, nil
}

func (v *Verifier) verify(g string, p Presented) (Claims, *Rejection) {
	if g == "" {
		return Claims{}, reject(ReasonMissing, "X-Fencing-Grant is required with X-Fencing-Token")
	}
	// One load: the set a grant is verified with is the set whose cache
	// remembers it.
	cur := v.cur.Load()
	c, ok := cur.cache.get(g)
	if !ok {
		var r *Rejection
		if c, r = verify(cur.keys, g); r != nil {
			return Claims{}, r
		}
		cur.cache.put(g, c)
	}
	if r := match(c, p); r != nil {
		return Claims{}, r
	}
	return c, nil
}

// verify checks everything about g that does not depend on the request:
// malformed, unknown_key, bad_signature, wrong_issuer, in that order.
func verify(keys *KeySet, g string) (Claims, *Rejection) {
	if len(g) > MaxGrantBytes {
		return Claims{}, reject(ReasonMalformed, "the grant is longer than %d bytes", MaxGrantBytes)
	}
	if r := checkCanonical(g); r != nil {
		return Claims{}, r
	}
	// The header is read strictly here (go-jose reads it leniently: a member given
	// twice counts once, unknown members pass), because the rules on it — typ,
	// kid, nothing else — are ours to enforce, and must come before the key lookup.
	h, _, _ := strings.Cut(g, ".")
	hb, err := base64.RawURLEncoding.Strict().DecodeString(h)
	if err != nil {
		return Claims{}, reject(ReasonMalformed, "the grant's header is not base64url")
	}
	kid, r := parseHeader(hb)
	if r != nil {
		return Claims{}, r
	}
	jws, err := jose.ParseSignedCompact(g, allowedAlgorithms)
	if err != nil {
		return Claims{}, reject(ReasonMalformed, "the grant is not a compact JWS signed with EdDSA")
	}
	// Read before the signature is checked only to judge the claims' shape
	// (docs/contracts/signed-grants.md orders malformed before unknown_key);
	// nothing read here is trusted until the signature has verified.
	c, r := parseClaims(jws.UnsafePayloadWithoutVerification())
	if r != nil {
		return Claims{}, r
	}
	key, ok := keys.Lookup(kid)
	if !ok {
		return Claims{}, reject(ReasonUnknownKey, "the grant's kid names no key this service verifies with")
	}
	if _, err := jws.Verify(key); err != nil {
		return Claims{}, reject(ReasonBadSignature, "the grant's signature does not verify")
	}
	if c.Issuer != Issuer {
		return Claims{}, reject(ReasonWrongIssuer, "the grant was not issued by %s", Issuer)
	}
	return c, nil
}

// checkCanonical refuses a grant that is not exactly three parts, each the one
// canonical unpadded base64url spelling of its bytes. go-jose decodes the claims
// and signature leniently (padding stripped, a last character's unused bits
// ignored), so without this one grant could be presented under many spellings:
// each a different string to the cache, and a real grant's signature edited in
// its last character would still verify.
func checkCanonical(g string) *Rejection {
	// Strict decoding still skips CR and LF; only the alphabet and the two dots
	// may appear.
	dots := 0
	for i := 0; i < len(g); i++ {
		switch c := g[i]; {
		case c == '.':
			dots++
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return reject(ReasonMalformed, "the grant is not three base64url parts")
		}
	}
	if dots != 2 {
		return reject(ReasonMalformed, "the grant is not three base64url parts")
	}
	// Strict: the unused low bits of a part's last character must be zero.
	enc := base64.RawURLEncoding.Strict()
	rest := g
	for _, name := range [...]string{"header", "claims", "signature"} {
		var part string
		part, rest, _ = strings.Cut(rest, ".")
		if _, err := enc.DecodeString(part); err != nil {
			return reject(ReasonMalformed, "the grant's %s is not canonical base64url", name)
		}
	}
	return nil
}

// parseHeader checks the protected header: exactly alg "EdDSA", typ
// "lockgrant+jwt" and a non-empty kid, each once. Any other member — crit, b64,
// jwk, jku, x5u … — is refused: each is a way for a token to steer its own
// verification, and lock-server never writes one.
func parseHeader(b []byte) (string, *Rejection) {
	o, errs := jsonbody.ParseObject(b)
	if errs != nil {
		return "", reject(ReasonMalformed, "the grant's header is not a JSON object")
	}
	alg, _ := o.String("alg", true, false, nil)
	typ, _ := o.String("typ", true, false, nil)
	kid, _ := o.String("kid", true, false, nil)
	if errs := o.Finish(); len(errs) > 0 {
		return "", reject(ReasonMalformed, "the grant's header member %s %s", errs[0].Field, errs[0].Problem)
	}
	switch {
	case alg != Algorithm:
		return "", reject(ReasonMalformed, "the grant's header alg must be %s", Algorithm)
	case typ != Type:
		return "", reject(ReasonMalformed, "the grant's header typ must be %s", Type)
	case kid == "":
		return "", reject(ReasonMalformed, "the grant's header has an empty kid")
	}
	return kid, nil
}

// parseClaims checks the claims' shape: iss, lock, tok (a canonical decimal
// token, as a JSON string), sub and iat (an integer), each exactly once, wid (a
// SPIFFE ID string) at most once, and nothing else. An unknown claim is refused rather than ignored: a claim added
// later (an expiry, say) must never be silently skipped by a verifier that does
// not know it.
func parseClaims(b []byte) (Claims, *Rejection) {
	o, errs := jsonbody.ParseObject(b)
	if errs != nil {
		return Claims{}, reject(ReasonMalformed, "the grant's claims are not a JSON object")
	}
	var c Claims
	var tok string
	c.Issuer, _ = o.String("iss", true, false, nil)
	c.Lock, _ = o.String("lock", true, false, lockapi.ValidateLockName)
	tok, _ = o.String("tok", true, false, nil)
	c.Subject, _ = o.String("sub", true, false, lockapi.ValidateOwnerID)
	c.IssuedAt, _ = o.Int64("iat", true, 0, math.MaxInt64)
	c.Workload, _ = o.String("wid", false, false, validateWorkload)
	if errs := o.Finish(); len(errs) > 0 {
		return Claims{}, reject(ReasonMalformed, "the grant's claim %s %s", errs[0].Field, errs[0].Problem)
	}
	t, err := lockapi.ParseToken(tok)
	if err != nil {
		return Claims{}, reject(ReasonMalformed, "the grant's claim tok must be a decimal token string")
	}
	c.Token = t
	return c, nil
}

// validateWorkload accepts a SPIFFE ID: wid is compared with a verified peer's
// ID as a string, so only the one spelling go-spiffe gives an ID can ever match.
func validateWorkload(s string) error {
	id, err := spiffeid.FromString(s)
	if err != nil {
		return errors.New("must be a SPIFFE ID")
	}
	if id.String() != s {
		return errors.New("must be a SPIFFE ID in its canonical form")
	}
	return nil
}

// match compares a verified grant with what the request presents: lock, token,
// owner, in that order. The details name what the request presented, never what
// the grant says.
func match(c Claims, p Presented) *Rejection {
	switch {
	case c.Lock != p.Lock:
		return reject(ReasonLockMismatch, "the grant is not a grant of lock %s", p.Lock)
	case c.Token != p.Token:
		return reject(ReasonTokenMismatch, "the grant is not a grant of token %d (X-Fencing-Token)", p.Token)
	case c.Subject != p.Owner:
		return reject(ReasonOwnerMismatch, "the grant was not granted to owner %s (X-Owner-Id)", p.Owner)
	}
	return nil
}
