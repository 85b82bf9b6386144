package lockapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// SettleRequest is the body of POST /v1/payouts/{id}/settle (docs/contracts/reconciliation.md): the
// reconciler settles an AMBIGUOUS payout from the rail's statement. Outcome is
// PAID, DECLINED or NOT_PRESENTED; PAID carries the statement line's
// railReference and seq, DECLINED its seq (and the rail's reason, when it gave
// one), NOT_PRESENTED neither.
type SettleRequest struct {
	Outcome       string  `json:"outcome"`
	RailReference *string `json:"railReference"`
	DeclineReason *string `json:"declineReason"`
	StatementSeq  *int64  `json:"statementSeq"`
}

// MinBearerTokenLen is the shortest PAYMENT_SETTLE_TOKEN accepted: a shared secret
// that lets its holder book money must not be guessable.
const MinBearerTokenLen = 16

// ValidateBearerToken checks a configured bearer token: at least
// MinBearerTokenLen characters of RFC 6750's b64token alphabet (letters, digits
// and -._~+/, then optional trailing '='), so it travels in an Authorization
// header unchanged. The error never quotes the token.
func ValidateBearerToken(s string) error {
	if len(s) < MinBearerTokenLen {
		return invalid("must be at least %d characters", MinBearerTokenLen)
	}
	body := strings.TrimRight(s, "=")
	if body == "" {
		return invalid("must not be only '='")
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("-._~+/", c) >= 0) {
			return invalid("must contain only letters, digits and -._~+/ (then optional trailing '=')")
		}
	}
	return nil
}

// BearerMatches reports whether the request carries exactly one Authorization
// header "Bearer <want>" (the scheme case-insensitive, RFC 7235). The tokens are
// compared as SHA-256 digests in constant time, so neither the content nor the
// length of the secret leaks through the timing of a refusal.
func BearerMatches(h http.Header, want string) bool {
	vs := h.Values("Authorization")
	if len(vs) != 1 || want == "" {
		return false
	}
	scheme, token, ok := strings.Cut(vs[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	got := sha256.Sum256([]byte(token))
	exp := sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(got[:], exp[:]) == 1
}
