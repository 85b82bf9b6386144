package jsonbody

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"

	"lock.dev/lockapi"
)

// Object is a strictly parsed JSON object: each member once, nothing after it.
// Fields are taken one by one; every fault is collected, and Finish reports
// members nobody asked for.
type Object struct {
	members []member       // in order of first appearance
	index   map[string]int // name → members index, built only for large objects
	errs    []lockapi.FieldError
}

type member struct {
	name  string
	raw   json.RawMessage // the value's exact bytes, validated
	taken bool
	// notText: the value holds invalid UTF-8 or a lone surrogate; its fault is
	// already recorded and no getter sees it.
	notText bool
}

// indexFrom is the member count above which lookups go through a map; below it a
// linear scan is cheaper than hashing.
const indexFrom = 16

// ParseObject parses b as exactly one JSON object. A body that is not one is a
// single fault on field "body". It validates and splits the object in one pass
// over b (the grammar is encoding/json's: same verdicts, same member values).
func ParseObject(b []byte) (*Object, []lockapi.FieldError) {
	fail := func(p string) (*Object, []lockapi.FieldError) {
		return nil, []lockapi.FieldError{{Field: "body", Problem: p}}
	}
	// The verdict for a body that is not one well-formed object: malformed, or a
	// well-formed first value followed by more, or a single value of another kind.
	notObject := func(i int) (*Object, []lockapi.FieldError) {
		end, ok := scanValue(b, i)
		switch {
		case !ok:
			return fail("must be well-formed JSON")
		case skipSpace(b, end) != len(b):
			return fail("must contain exactly one JSON value (trailing data found)")
		default:
			return fail("must be a JSON object")
		}
	}
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return notObject(i)
	}
	o := &Object{members: make([]member, 0, 8)}
	badName := false
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			if i >= len(b) || b[i] != '"' {
				return notObject(0)
			}
			kend, ok := scanString(b, i)
			if !ok {
				return notObject(0)
			}
			// Judged once the whole body is known to be well-formed: a
			// grammar fault elsewhere is the answer first.
			badName = badName || !isText(b[i:kend])
			k := decodeString(b[i:kend])
			i = skipSpace(b, kend)
			if i >= len(b) || b[i] != ':' {
				return notObject(0)
			}
			i = skipSpace(b, i+1)
			vend, ok := scanValue(b, i)
			if !ok {
				return notObject(0)
			}
			switch {
			case o.find(k) >= 0:
				o.errs = append(o.errs, lockapi.FieldError{Field: k, Problem: "must appear only once"})
			case !isText(b[i:vend]):
				// Refused, not decoded: encoding/json would put U+FFFD in place of
				// each bad byte or lone surrogate, and the caller's text would be
				// stored as something it never sent. The member still counts as
				// given, so it is neither "required" nor "not a known member".
				o.errs = append(o.errs, lockapi.FieldError{Field: k, Problem: notTextValue})
				o.add(k, nil)
				o.members[len(o.members)-1].notText = true
			default:
				o.add(k, json.RawMessage(b[i:vend:vend]))
			}
			i = skipSpace(b, vend)
			if i < len(b) && b[i] == ',' {
				i = skipSpace(b, i+1)
				continue
			}
			if i < len(b) && b[i] == '}' {
				i++
				break
			}
			return notObject(0)
		}
	}
	if skipSpace(b, i) != len(b) {
		return fail("must contain exactly one JSON value (trailing data found)")
	}
	if badName {
		return fail(notTextName)
	}
	return o, nil
}

func (o *Object) add(name string, raw json.RawMessage) {
	o.members = append(o.members, member{name: name, raw: raw})
	if o.index != nil {
		o.index[name] = len(o.members) - 1
	} else if len(o.members) > indexFrom {
		o.index = make(map[string]int, 2*len(o.members))
		for j, m := range o.members {
			o.index[m.name] = j
		}
	}
}

func (o *Object) find(name string) int {
	if o.index != nil {
		if j, ok := o.index[name]; ok {
			return j
		}
		return -1
	}
	for j := range o.members {
		if o.members[j].name == name {
			return j
		}
	}
	return -1
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// scanValue validates the JSON value starting at b[i] and returns the index just
// past it. Nesting is bounded by the body size (64 KiB), so recursion is too.
func scanValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '"':
		return scanString(b, i)
	case c == '{':
		i = skipSpace(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1, true
		}
		for {
			if i >= len(b) || b[i] != '"' {
				return i, false
			}
			end, ok := scanString(b, i)
			if !ok {
				return i, false
			}
			i = skipSpace(b, end)
			if i >= len(b) || b[i] != ':' {
				return i, false
			}
			if i, ok = scanValue(b, skipSpace(b, i+1)); !ok {
				return i, false
			}
			i = skipSpace(b, i)
			if i < len(b) && b[i] == ',' {
				i = skipSpace(b, i+1)
				continue
			}
			if i < len(b) && b[i] == '}' {
				return i + 1, true
			}
			return i, false
		}
	case c == '[':
		i = skipSpace(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, true
		}
		for {
			var ok bool
			if i, ok = scanValue(b, i); !ok {
				return i, false
			}
			i = skipSpace(b, i)
			if i < len(b) && b[i] == ',' {
				i = skipSpace(b, i+1)
				continue
			}
			if i < len(b) && b[i] == ']' {
				return i + 1, true
			}
			return i, false
		}
	case c == 't':
		return scanLiteral(b, i, "true")
	case c == 'f':
		return scanLiteral(b, i, "false")
	case c == 'n':
		return scanLiteral(b, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return scanNumber(b, i)
	default:
		return i, false
	}
}

func scanLiteral(b []byte, i int, lit string) (int, bool) {
	if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
		return i + len(lit), true
	}
	return i, false
}

// scanNumber: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func scanNumber(b []byte, i int) (int, bool) {
	digits := func(i int) int {
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i
	}
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(i + 1)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return j, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(i)
		if j == i {
			return j, false
		}
		i = j
	}
	return i, true
}

// scanString validates the string starting at the quote b[i] and returns the
// index just past its closing quote. Like encoding/json, it rejects control
// characters and bad escapes and lets invalid UTF-8 and lone surrogates through:
// ParseObject refuses those with isText, naming the member they are in.
func scanString(b []byte, i int) (int, bool) {
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c < 0x20:
			return i, false
		case c == '\\':
			i++
			if i >= len(b) {
				return i, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(b)-i < 5 {
					return i, false
				}
				for _, h := range b[i+1 : i+5] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return i, false
					}
				}
				i += 4
			default:
				return i, false
			}
		}
	}
	return i, false
}

// The faults for text that is not Unicode: invalid UTF-8 bytes, or a \u escape
// of a surrogate that is not half of a pair.
const (
	notTextValue = "must be valid UTF-8 text (no invalid bytes, no unpaired \\uD800–\\uDFFF escape)"
	notTextName  = "member names must be valid UTF-8 text (no invalid bytes, no unpaired \\uD800–\\uDFFF escape)"
)

// isText reports whether the JSON value v (already validated) holds only
// Unicode text: valid UTF-8, and every \u escape of a surrogate paired, high
// then low, as RFC 8259 spells a character outside the BMP. utf8.Valid is the
// whole cost for the usual value without a backslash.
func isText(v []byte) bool {
	if !utf8.Valid(v) {
		return false
	}
	for i := bytes.IndexByte(v, '\\'); i >= 0 && i < len(v); {
		// Outside strings a validated value has no backslash, so every one seen
		// here starts an escape.
		if i+1 >= len(v) {
			return false
		}
		if v[i+1] != 'u' {
			i += 2
		} else {
			r, ok := hex4(v, i+2)
			if !ok {
				return false
			}
			i += 6
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return false // a low half with no high half before it
			case r >= 0xD800 && r <= 0xDBFF:
				if i+1 >= len(v) || v[i] != '\\' || v[i+1] != 'u' {
					return false
				}
				lo, ok := hex4(v, i+2)
				if !ok || lo < 0xDC00 || lo > 0xDFFF {
					return false
				}
				i += 6
			}
		}
		j := bytes.IndexByte(v[i:], '\\')
		if j < 0 {
			break
		}
		i += j
	}
	return true
}

// hex4 is the value of the four hex digits at v[i:i+4].
func hex4(v []byte, i int) (rune, bool) {
	if i+4 > len(v) {
		return 0, false
	}
	var r rune
	for _, h := range v[i : i+4] {
		switch {
		case h >= '0' && h <= '9':
			r = r<<4 | rune(h-'0')
		case h >= 'a' && h <= 'f':
			r = r<<4 | rune(h-'a'+10)
		case h >= 'A' && h <= 'F':
			r = r<<4 | rune(h-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// decodeString is the Go value of a validated JSON string literal (quotes
// included). Plain ASCII/UTF-8 without escapes, the usual case, is a copy;
// anything else goes through encoding/json for its exact rules.
func decodeString(lit []byte) string {
	inner := lit[1 : len(lit)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner)
	}
	var s string
	_ = json.Unmarshal(lit, &s) // validated by scanString; cannot fail
	return s
}

func (o *Object) fault(field, problem string) {
	o.errs = append(o.errs, lockapi.FieldError{Field: field, Problem: problem})
}

func (o *Object) take(name string, required bool) (json.RawMessage, bool) {
	j := o.find(name)
	if j < 0 {
		if required {
			o.fault(name, "is required")
		}
		return nil, false
	}
	o.members[j].taken = true
	if o.members[j].notText {
		return nil, false
	}
	return o.members[j].raw, true
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// String takes a string member. A null is treated as absent only when nullable.
// validate, when set, adds its fault.
func (o *Object) String(name string, required, nullable bool, validate func(string) error) (string, bool) {
	raw, ok := o.take(name, required)
	if !ok {
		return "", false
	}
	if isNull(raw) {
		if !nullable {
			o.fault(name, "must not be null")
		}
		return "", false
	}
	if raw[0] != '"' {
		o.fault(name, "must be a string")
		return "", false
	}
	s := decodeString(raw)
	if validate != nil {
		if err := validate(s); err != nil {
			o.fault(name, lockapi.ProblemText(err))
			return "", false
		}
	}
	return s, true
}

// number takes a member that must be a JSON number literal and returns its text;
// notNumber is the fault for anything else (a string, a literal, an object).
func (o *Object) number(name string, required bool, notNumber string) (string, bool) {
	raw, ok := o.take(name, required)
	if !ok {
		return "", false
	}
	s := string(bytes.TrimSpace(raw))
	if s == "null" {
		o.fault(name, "must not be null")
		return "", false
	}
	if s == "" || !(s[0] == '-' || (s[0] >= '0' && s[0] <= '9')) {
		o.fault(name, notNumber)
		return "", false
	}
	return s, true
}

// Int64 takes an integer member: a JSON integer literal (no fraction, no exponent)
// within [min, max].
func (o *Object) Int64(name string, required bool, min, max int64) (int64, bool) {
	s, ok := o.number(name, required, "must be an integer")
	if !ok {
		return 0, false
	}
	if strings.ContainsAny(s, ".eE") {
		o.fault(name, "must be an integer")
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			o.fault(name, "is out of range")
		} else {
			o.fault(name, "must be an integer")
		}
		return 0, false
	}
	if v < min || v > max {
		o.fault(name, "must be between "+strconv.FormatInt(min, 10)+" and "+strconv.FormatInt(max, 10))
		return 0, false
	}
	return v, true
}

// OptionalInt64 takes an optional integer member that may be null: absent and
// null both report false without a fault; anything else is Int64's rules.
func (o *Object) OptionalInt64(name string, min, max int64) (int64, bool) {
	if j := o.find(name); j >= 0 && isNull(o.members[j].raw) {
		o.members[j].taken = true
		return 0, false
	}
	return o.Int64(name, false, min, max)
}

// Float64 takes a number member within [min, max].
func (o *Object) Float64(name string, required bool, min, max float64) (float64, bool) {
	s, ok := o.number(name, required, "must be a number")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < min || v > max {
		o.fault(name, "must be between "+strconv.FormatFloat(min, 'g', -1, 64)+" and "+strconv.FormatFloat(max, 'g', -1, 64))
		return 0, false
	}
	return v, true
}

// Finish reports members that were not asked for and returns every fault found.
func (o *Object) Finish() []lockapi.FieldError {
	for _, m := range o.members {
		if !m.taken && !m.notText {
			o.fault(m.name, "is not a known member")
		}
	}
	return o.errs
}
