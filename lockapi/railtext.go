package lockapi

import (
	"strconv"
	"unicode/utf8"
)

// The rail's own words — the reference it gives an accepted payment, the reason it
// gives a decline — are stored in paydb and shown to people exactly as the rail
// gave them. Text that paydb cannot store, or could store but not show as it is,
// is refused wherever it enters the system (docs/contracts/rail-proxy.md,
// "Storable text"): rail-proxy takes such an answer for no well-formed answer
// (TIMEOUT), the reconciler records such a statement line as an exception, the
// executor never posts it, and payment-resource refuses it with 400.

// Bounds of the rail's words, in characters.
const (
	// MaxRailReferenceLen is ISO 20022's Max35Text, the type of AcctSvcrRef,
	// which is where an ISO 20022 rail puts its reference.
	MaxRailReferenceLen = 35
	// MaxDeclineReasonLen is ISO 20022's Max140Text: room for a status reason
	// code and one line (Max105Text) of its additional information.
	MaxDeclineReasonLen = 140
)

// Problems of text that is not storable; each is a FieldError's problem.
const (
	problemTextUTF8        = "must be valid UTF-8"
	problemTextNUL         = "must not contain NUL characters"
	problemTextControl     = "must not contain control characters"
	problemTextReplacement = "must not contain U+FFFD (the mark of bytes that were not text)"
)

// StorableTextProblem says why s is not text paydb can store and show as it is,
// or "" when it is: valid UTF-8, at most max characters, and none of NUL, the
// other C0 controls (tab and newline included), DEL, the C1 controls
// (U+0080–U+009F) and U+FFFD — the character a decoder puts where bytes were not
// UTF-8, so text carrying it is not the words as they were given. An empty s is
// storable; callers that need a value check that themselves.
//
// It is one loop over the bytes, allocates nothing, and decodes a rune only
// where a byte is not ASCII.
func StorableTextProblem(s string, max int) string {
	n := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == 0:
				return problemTextNUL
			case c < 0x20 || c == 0x7f:
				return problemTextControl
			}
			i++
		} else {
			r, size := utf8.DecodeRuneInString(s[i:])
			switch {
			case r == utf8.RuneError && size == 1:
				return problemTextUTF8
			case r == utf8.RuneError:
				return problemTextReplacement
			case r >= 0x80 && r <= 0x9f:
				return problemTextControl
			}
			i += size
		}
		n++
		if n > max {
			return "must be at most " + strconv.Itoa(max) + " characters"
		}
	}
	return ""
}

// ValidateRailReference checks a rail reference: 1–35 characters of storable
// text (StorableTextProblem).
func ValidateRailReference(s string) error {
	if s == "" {
		return invalid("must not be empty")
	}
	if p := StorableTextProblem(s, MaxRailReferenceLen); p != "" {
		return invalid("%s", p)
	}
	return nil
}

// ValidateDeclineReason checks a decline reason: at most 140 characters of
// storable text (StorableTextProblem). Empty is storable; whether it is accepted
// is the caller's rule.
func ValidateDeclineReason(s string) error {
	if p := StorableTextProblem(s, MaxDeclineReasonLen); p != "" {
		return invalid("%s", p)
	}
	return nil
}
