package railproxy

import (
	"bytes"
	"encoding/json"
	"math/big"
	"math/rand/v2"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"lock.dev/internal/iso4217"
	"lock.dev/internal/jsonbody"
	"lock.dev/lockapi"
)

// oracleParse is a reference parse of a submission body that shares no code with
// lockapi: the JSON grammar is encoding/json's (json.Valid, a trial decode, then
// tokens), and the field rules are written out again in oracleFields. The
// single-pass parser and its binder must agree with it on every input.
func oracleParse(b []byte) (lockapi.SubmissionRequest, []lockapi.FieldError) {
	var req lockapi.SubmissionRequest
	fail := func(p string) (lockapi.SubmissionRequest, []lockapi.FieldError) {
		return req, []lockapi.FieldError{{Field: "body", Problem: p}}
	}
	if !json.Valid(b) {
		dec := json.NewDecoder(bytes.NewReader(b))
		var v json.RawMessage
		if err := dec.Decode(&v); err == nil {
			return fail("must contain exactly one JSON value (trailing data found)")
		}
		return fail("must be well-formed JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return fail("must be well-formed JSON")
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fail("must be a JSON object")
	}
	var errs []lockapi.FieldError
	badName := false // json.Valid held, so this verdict is the body's only fault
	members := map[string]json.RawMessage{}
	var order []string
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return fail("must be well-formed JSON")
		}
		k, _ := kt.(string)
		// The name's own bytes: the decoder has already turned bad text in it into
		// U+FFFD, so the raw literal is read back from the input.
		keyEnd := dec.InputOffset()
		keyStart := bytes.LastIndexByte(b[:keyEnd-1], '"')
		for keyStart > 0 && oracleEscaped(b[:keyStart]) {
			keyStart = bytes.LastIndexByte(b[:keyStart], '"')
		}
		badName = badName || !oracleIsText(b[keyStart:keyEnd])
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return fail("must be well-formed JSON")
		}
		if _, dup := members[k]; dup {
			errs = append(errs, lockapi.FieldError{Field: k, Problem: "must appear only once"})
			continue
		}
		if !oracleIsText(raw) {
			errs = append(errs, lockapi.FieldError{Field: k, Problem: "must be valid UTF-8 text (no invalid bytes, no unpaired \\uD800–\\uDFFF escape)"})
			raw = nil // present, but no rule sees it
		}
		members[k] = raw
		order = append(order, k)
	}
	if badName {
		return fail("member names must be valid UTF-8 text (no invalid bytes, no unpaired \\uD800–\\uDFFF escape)")
	}
	// The field rules, written here on their own (docs/contracts/README.md), not by
	// calling the binder under test: the oracle judges the members with
	// encoding/json's values, regular expressions and big integers.
	req, errs = oracleFields(members, order, errs)
	return req, errs
}

// oracleEscape finds a JSON value's escapes left to right, each consuming its
// backslash, so `\\u` is an escaped backslash followed by a plain u.
var oracleEscape = regexp.MustCompile(`\\(?:u([0-9a-fA-F]{4})|[^u])`)

// oracleIsText: valid UTF-8, and every surrogate escape a high half directly
// followed by a low half.
func oracleIsText(v []byte) bool {
	if !utf8.Valid(v) {
		return false
	}
	ms := oracleEscape.FindAllSubmatchIndex(v, -1)
	for i := 0; i < len(ms); i++ {
		if ms[i][2] < 0 {
			continue
		}
		u, _ := strconv.ParseUint(string(v[ms[i][2]:ms[i][3]]), 16, 32)
		switch {
		case u >= 0xDC00 && u <= 0xDFFF:
			return false
		case u >= 0xD800 && u <= 0xDBFF:
			if i+1 >= len(ms) || ms[i+1][0] != ms[i][1] || ms[i+1][2] < 0 {
				return false
			}
			lo, _ := strconv.ParseUint(string(v[ms[i+1][2]:ms[i+1][3]]), 16, 32)
			if lo < 0xDC00 || lo > 0xDFFF {
				return false
			}
			i++
		}
	}
	return true
}

// oracleEscaped reports whether the byte after b is escaped: b ends in an odd
// number of backslashes.
func oracleEscaped(b []byte) bool {
	n := 0
	for n < len(b) && b[len(b)-1-n] == '\\' {
		n++
	}
	return n%2 == 1
}

var (
	oracleIdentifier = regexp.MustCompile(`^[A-Za-z0-9._:-]*$`)
	oracleCurrency   = regexp.MustCompile(`^[A-Z]{3}$`)
	// Printable as Go's unicode.IsPrint has it: letters, marks, numbers,
	// punctuation, symbols and the ASCII space.
	oraclePrintable = regexp.MustCompile(`^[\p{L}\p{M}\p{N}\p{P}\p{S} ]*$`)
	oracleMinAmount = big.NewInt(1)
	oracleMaxAmount = new(big.Int).Exp(big.NewInt(10), big.NewInt(15), nil)
)

// oracleFields binds the five submission members: every fault, in the order
// duplicates (already in errs), the five fields in their order, unknown members
// in order of appearance.
func oracleFields(members map[string]json.RawMessage, order []string, errs []lockapi.FieldError) (lockapi.SubmissionRequest, []lockapi.FieldError) {
	var req lockapi.SubmissionRequest
	fault := func(field, problem string) { errs = append(errs, lockapi.FieldError{Field: field, Problem: problem}) }
	str := func(name string, check func(string) string) string {
		raw, ok := members[name]
		if !ok {
			fault(name, "is required")
			return ""
		}
		if raw == nil {
			return "" // not text: already refused
		}
		var v any
		_ = json.Unmarshal(raw, &v) // raw is one valid JSON value
		switch x := v.(type) {
		case nil:
			fault(name, "must not be null")
		case string:
			if p := check(x); p != "" {
				fault(name, p)
				return ""
			}
			return x
		default:
			fault(name, "must be a string")
		}
		return ""
	}
	identifier := func(s string) string {
		switch {
		case len(s) < 1 || len(s) > 64:
			return "must be 1–64 characters"
		case !oracleIdentifier.MatchString(s):
			return "must contain only A-Z a-z 0-9 . _ : -"
		}
		return ""
	}
	req.PayoutID = str("payoutId", identifier)
	req.AccountID = str("accountId", identifier)
	if raw, ok := members["amountMinor"]; !ok {
		fault("amountMinor", "is required")
	} else if raw != nil {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		_ = dec.Decode(&v)
		n, isNum := v.(json.Number)
		amount, isInt := new(big.Int).SetString(string(n), 10)
		switch {
		case v == nil:
			fault("amountMinor", "must not be null")
		case !isNum || !isInt:
			fault("amountMinor", "must be an integer")
		case !amount.IsInt64():
			fault("amountMinor", "is out of range")
		case amount.Cmp(oracleMinAmount) < 0 || amount.Cmp(oracleMaxAmount) > 0:
			fault("amountMinor", "must be between 1 and 1000000000000000")
		default:
			req.AmountMinor = amount.Int64()
		}
	}
	req.Currency = str("currency", func(s string) string {
		switch {
		case !oracleCurrency.MatchString(s):
			return "must be three upper-case letters (ISO 4217)"
		case !iso4217.Valid(s):
			return "is an unknown ISO 4217 code: not in ISO 4217's list of active codes (published " + iso4217.Published + ")"
		}
		return ""
	})
	req.Beneficiary = str("beneficiary", func(s string) string {
		switch n := utf8.RuneCountInString(s); {
		case !utf8.ValidString(s):
			return "must be valid UTF-8"
		case n < 1 || n > 128:
			return "must be 1–128 characters"
		case !oraclePrintable.MatchString(s):
			return "must contain only printable characters"
		}
		return ""
	})
	known := map[string]bool{"payoutId": true, "accountId": true, "amountMinor": true, "currency": true, "beneficiary": true}
	for _, k := range order {
		if !known[k] && members[k] != nil {
			fault(k, "is not a known member")
		}
	}
	return req, errs
}

func TestParseObjectAgreesWithOracle(t *testing.T) {
	t.Parallel()
	seeds := []string{
		`{"payoutId":"p-1001","accountId":"acct-7","amountMinor":125000,"currency":"EUR","beneficiary":"NL91ABNA0417164300"}`,
		` {"payoutId" : "p\u002d1", "accountId":"a\/b","amountMinor":-0,"currency":"EUR","beneficiary":"x","extra":[1,{"a":[true,false,null]},-1.5e+3]} `,
		`{"payoutId":"p","payoutId":"q","amountMinor":1.0,"currency":null,"beneficiary":7}`,
		`{"payoutId":"\ud83d\ude00","accountId":"\u00e9","amountMinor":1e2,"currency":"\"","beneficiary":"\\"}`,
		`{}`, `[]`, `[1] x`, `1 2`, `"s"`, `{"a":1}{`, `{"a":1,}`, `{"a"}`, `{"a":01}`, `{"a":1.}`, `{"a":-}`,
		`{"a":"\x"}`, "{\"a\":\"\x01\"}", "{\"a\":\"\xff\"}", "{\"\xff\":1}", `nul`, ``, `   `, `{"a":[1,]}`, `{"a":tru}`,
		// At and just past every field rule's edges, so the rules are exercised,
		// not only the grammar.
		`{"payoutId":"` + strings.Repeat("p", 64) + `","accountId":"` + strings.Repeat("a", 65) + `","amountMinor":1000000000000000,"currency":"EUR","beneficiary":"` + strings.Repeat("é", 128) + `"}`,
		`{"payoutId":"","accountId":"a b","amountMinor":1000000000000001,"currency":"EUr","beneficiary":"` + strings.Repeat("b", 129) + `"}`,
		`{"payoutId":"p","accountId":"a","amountMinor":0,"currency":"EURO","beneficiary":"x\u0007"}`,
		`{"payoutId":"p","accountId":"a","amountMinor":9223372036854775808,"currency":"E1R","beneficiary":""}`,
		`{"payoutId":"p","accountId":"a","amountMinor":-9223372036854775809,"currency":"eur","beneficiary":" \u00a0"}`,
		`{"payoutId":"p","accountId":"a","amountMinor":"1","currency":1,"beneficiary":null,"x":1,"y":2}`,
		`{"payoutId":"p:.-_Z9","accountId":"é","amountMinor":1,"currency":"EUR","beneficiary":"\ud800"}`,
		// Text that is not Unicode, and codes ISO 4217 does not list.
		`{"payoutId":"p","accountId":"a","amountMinor":1,"currency":"ABC","beneficiary":"B-\udc00","x":"\ud83d\ude00"}`,
		`{"payoutId":"p","accountId":"a","amountMinor":1,"currency":"JPY","beneficiary":"\ud83d\ude00\\ud800","x":["\ud83d"]}`,
		"{\"payoutId\":\"p\",\"accountId\":\"a\",\"amountMinor\":1,\"currency\":\"XYZ\",\"beneficiary\":\"B-\xff\",\"\\ud800\":1}",
		"{\"payoutId\":\"p\",\"amountMinor\":\"\xff\",\"amountMinor\":1,\"currency\":\"BHD\",\"beneficiary\":\"\xe2\x82\"}",
	}
	for _, s := range seeds {
		compareParse(t, []byte(s))
	}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte(`{}[]":,.-+eE0123456789 \/ubtnrfalsxdDABC` + "\x00\xff\t\xe2")
	for range 30000 {
		b := []byte(seeds[r.IntN(len(seeds))])
		for range 1 + r.IntN(3) {
			switch op := r.IntN(3); {
			case op == 0 && len(b) > 0:
				b[r.IntN(len(b))] = alphabet[r.IntN(len(alphabet))]
			case op == 1:
				p := r.IntN(len(b) + 1)
				b = append(b[:p], append([]byte{alphabet[r.IntN(len(alphabet))]}, b[p:]...)...)
			case len(b) > 0:
				p := r.IntN(len(b))
				b = append(b[:p], b[p+1:]...)
			}
		}
		compareParse(t, b)
	}
}

func FuzzParseObjectAgreesWithOracle(f *testing.F) {
	f.Add([]byte(`{"payoutId":"p-1001","accountId":"acct-7","amountMinor":125000,"currency":"EUR","beneficiary":"NL91ABNA0417164300"}`))
	f.Fuzz(func(t *testing.T, b []byte) { compareParse(t, b) })
}

func compareParse(t *testing.T, b []byte) {
	t.Helper()
	wantReq, wantErrs := oracleParse(b)
	gotReq, gotErrs := jsonbody.ParseSubmissionRequest(b)
	if len(wantErrs) == 0 {
		wantErrs = nil
	}
	if len(gotErrs) == 0 {
		gotErrs = nil
	}
	if !reflect.DeepEqual(gotErrs, wantErrs) || (wantErrs == nil && gotReq != wantReq) {
		t.Fatalf("%q:\n got %+v %+v\nwant %+v %+v", b, gotReq, gotErrs, wantReq, wantErrs)
	}
}
