// Package lockapi holds what every process of lock.dev agrees on over HTTP: the
// fencing headers and their strict parsing, the problem+json codes, and the shared
// request and response shapes (docs/contracts/README.md).
package lockapi

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"unicode"
	"unicode/utf8"

	"lock.dev/internal/iso4217"
)

// Header names of the fenced calls.
const (
	HeaderFencingToken   = "X-Fencing-Token"
	HeaderOwnerID        = "X-Owner-Id"
	HeaderIdempotencyKey = "X-Idempotency-Key"
	// HeaderFencingGrant carries lock-server's signed grant of the token
	// (docs/contracts/signed-grants.md).
	HeaderFencingGrant = "X-Fencing-Grant"
)

// FencingHeaders are the headers of a fenced call: X-Fencing-Token and
// X-Owner-Id, and X-Fencing-Grant when grant is not empty.
func FencingHeaders(token int64, grant, owner string) http.Header {
	h := http.Header{}
	h.Set(HeaderFencingToken, strconv.FormatInt(token, 10))
	h.Set(HeaderOwnerID, owner)
	if grant != "" {
		h.Set(HeaderFencingGrant, grant)
	}
	return h
}

// Value bounds (docs/contracts/README.md).
const (
	MaxBodyBytes       = 64 << 10
	MaxIdentifierLen   = 64
	MaxOwnerIDLen      = 128
	MaxBeneficiaryLen  = 128
	MaxIdempotencyLen  = 255
	MinAmountMinor     = 1
	MaxAmountMinor     = 1_000_000_000_000_000 // 10^15
	maxTokenDigits     = 19
	maxTokenDecimalStr = "9223372036854775807"
)

// ErrInvalid is wrapped by every validation error of this package.
var ErrInvalid = errors.New("invalid value")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// ParseToken parses a fencing token strictly: ^[1-9][0-9]{0,18}$ and at most
// MaxInt64. No sign, no spaces, no leading zero: a token that could be written two
// ways could be compared two ways.
func ParseToken(s string) (int64, error) {
	if s == "" {
		return 0, invalid("must not be empty")
	}
	if len(s) > maxTokenDigits {
		return 0, invalid("must be at most %d digits", maxTokenDigits)
	}
	if s[0] < '1' || s[0] > '9' {
		return 0, invalid("must be a positive decimal integer without sign or leading zero")
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, invalid("must contain only decimal digits")
		}
	}
	if len(s) == maxTokenDigits && s > maxTokenDecimalStr {
		return 0, invalid("must be at most %s", maxTokenDecimalStr)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil { // unreachable after the checks above; kept so a slip cannot panic
		return 0, invalid("not a 64-bit integer")
	}
	return v, nil
}

// ValidateOwnerID checks 1–128 characters of [A-Za-z0-9._:@/-].
func ValidateOwnerID(s string) error {
	if s == "" || len(s) > MaxOwnerIDLen {
		return invalid("must be 1–%d characters", MaxOwnerIDLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '.' && c != '_' && c != ':' && c != '@' && c != '/' && c != '-' {
			return invalid("must contain only A-Z a-z 0-9 . _ : @ / -")
		}
	}
	return nil
}

// ValidateIdentifier checks a payoutId or accountId: 1–64 characters of [A-Za-z0-9._:-].
func ValidateIdentifier(s string) error {
	return validateName(s, MaxIdentifierLen)
}

// ValidateLockName checks a lock name: 1–128 characters of [A-Za-z0-9._:-].
func ValidateLockName(s string) error {
	return validateName(s, 128)
}

func validateName(s string, max int) error {
	if s == "" || len(s) > max {
		return invalid("must be 1–%d characters", max)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '.' && c != '_' && c != ':' && c != '-' {
			return invalid("must contain only A-Z a-z 0-9 . _ : -")
		}
	}
	return nil
}

// ValidateIdempotencyKey checks 1–255 visible ASCII characters (0x21–0x7E).
func ValidateIdempotencyKey(s string) error {
	if s == "" || len(s) > MaxIdempotencyLen {
		return invalid("must be 1–%d characters", MaxIdempotencyLen)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return invalid("must contain only visible ASCII characters")
		}
	}
	return nil
}

// ValidateBeneficiary checks 1–128 printable characters (Unicode, counted as characters).
func ValidateBeneficiary(s string) error {
	if !utf8.ValidString(s) {
		return invalid("must be valid UTF-8")
	}
	n := utf8.RuneCountInString(s)
	if n == 0 || n > MaxBeneficiaryLen {
		return invalid("must be 1–%d characters", MaxBeneficiaryLen)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return invalid("must contain only printable characters")
		}
	}
	return nil
}

// ValidateCurrency checks an ISO 4217 code: three upper-case letters that ISO's
// list of active codes holds (internal/iso4217, SIX's list kept verbatim), not
// any three letters.
func ValidateCurrency(s string) error {
	if len(s) != 3 {
		return invalid("must be three upper-case letters (ISO 4217)")
	}
	for i := 0; i < 3; i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return invalid("must be three upper-case letters (ISO 4217)")
		}
	}
	if !iso4217.Valid(s) {
		return invalid("is an unknown ISO 4217 code: not in ISO 4217's list of active codes (published %s)", iso4217.Published)
	}
	return nil
}

// ValidateAmountMinor checks 1 … 10^15 minor units.
func ValidateAmountMinor(v int64) error {
	if v < MinAmountMinor || v > MaxAmountMinor {
		return invalid("must be between %d and %d", MinAmountMinor, int64(MaxAmountMinor))
	}
	return nil
}

// MaskBeneficiary keeps at most the last four characters: logs may carry no more.
func MaskBeneficiary(s string) string {
	r := []rune(s)
	if len(r) <= 4 {
		return "****"
	}
	return "****" + string(r[len(r)-4:])
}

func isAlnum(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// HeaderValue returns the single value of a header. A missing header, an empty one
// or a repeated one is a fault: a second value is a second opinion about who is
// presenting which token.
func HeaderValue(h http.Header, name string) (string, error) {
	vs := h.Values(name)
	switch {
	case len(vs) == 0:
		return "", invalid("is required")
	case len(vs) > 1:
		return "", invalid("must appear exactly once")
	}
	return vs[0], nil
}

// Fencing is the parsed set of fencing headers of a request.
type Fencing struct {
	Token          int64
	OwnerID        string
	IdempotencyKey string
}

// ParseFencingHeaders reads the headers a fenced call needs. Every fault is
// reported, in header order; want selects which of the three are required.
func ParseFencingHeaders(h http.Header, token, owner, idemKey bool) (Fencing, []FieldError) {
	var f Fencing
	var errs []FieldError
	if token {
		v, err := HeaderValue(h, HeaderFencingToken)
		if err == nil {
			f.Token, err = ParseToken(v)
		}
		if err != nil {
			errs = append(errs, FieldError{Field: HeaderFencingToken, Problem: ProblemText(err)})
		}
	}
	if owner {
		v, err := HeaderValue(h, HeaderOwnerID)
		if err == nil {
			err = ValidateOwnerID(v)
		}
		if err != nil {
			errs = append(errs, FieldError{Field: HeaderOwnerID, Problem: ProblemText(err)})
		} else {
			f.OwnerID = v
		}
	}
	if idemKey {
		v, err := HeaderValue(h, HeaderIdempotencyKey)
		if err == nil {
			err = ValidateIdempotencyKey(v)
		}
		if err != nil {
			errs = append(errs, FieldError{Field: HeaderIdempotencyKey, Problem: ProblemText(err)})
		} else {
			f.IdempotencyKey = v
		}
	}
	return f, errs
}

// ProblemText turns a validation error into the short sentence of errors[].problem.
func ProblemText(err error) string {
	msg := err.Error()
	prefix := ErrInvalid.Error() + ": "
	if len(msg) > len(prefix) && msg[:len(prefix)] == prefix {
		msg = msg[len(prefix):]
	}
	return msg
}
