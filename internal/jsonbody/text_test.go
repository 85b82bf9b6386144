package jsonbody

import (
	"strings"
	"testing"
)

// A JSON body's text is taken as sent or refused, never repaired: invalid UTF-8
// and an unpaired surrogate escape are faults on the member that holds them
// (encoding/json would turn each into U+FFFD and the caller's words would be
// stored as something else). A surrogate pair is one character and passes.
func TestParseObjectRefusesTextThatIsNotUnicode(t *testing.T) {
	const want = "must be valid UTF-8 text"
	bad := []struct{ name, body, field string }{
		{"raw 0xff in a string", "{\"beneficiary\":\"B-\xff\",\"n\":1}", "beneficiary"},
		{"a truncated UTF-8 sequence", "{\"beneficiary\":\"B-\xe2\x82\",\"n\":1}", "beneficiary"},
		{"an encoded surrogate (CESU)", "{\"beneficiary\":\"\xed\xa0\x80\",\"n\":1}", "beneficiary"},
		{"a lone high surrogate", `{"beneficiary":"B-\ud800","n":1}`, "beneficiary"},
		{"a lone high surrogate at the end", `{"beneficiary":"\uD83D","n":1}`, "beneficiary"},
		{"a lone low surrogate", `{"beneficiary":"\udc00-B","n":1}`, "beneficiary"},
		{"a high surrogate before a non-surrogate escape", `{"beneficiary":"\ud83d\u0041","n":1}`, "beneficiary"},
		{"a high surrogate before an escaped backslash", `{"beneficiary":"\ud83d\\ude00","n":1}`, "beneficiary"},
		{"two high surrogates", `{"beneficiary":"\ud83d\ud83d","n":1}`, "beneficiary"},
		{"low then high", `{"beneficiary":"\ude00\ud83d","n":1}`, "beneficiary"},
		{"inside a nested value", `{"beneficiary":"B","n":1,"x":["ok",{"y":"\ud800"}]}`, "x"},
	}
	for _, c := range bad {
		o, errs := ParseObject([]byte(c.body))
		if errs != nil {
			t.Errorf("%s: the body as a whole was refused: %v", c.name, errs)
			continue
		}
		_, _ = o.String("beneficiary", true, false, nil)
		_, _ = o.Int64("n", true, 0, 9)
		_, _ = o.String("x", false, false, nil)
		errs = o.Finish()
		if len(errs) != 1 || errs[0].Field != c.field || !strings.HasPrefix(errs[0].Problem, want) {
			t.Errorf("%s: faults %v, want one on %s: %s…", c.name, errs, c.field, want)
		}
	}

	good := []struct{ name, body, value string }{
		{"a surrogate pair", `{"beneficiary":"B-\ud83d\ude00","n":1}`, "B-\U0001F600"},
		{"a surrogate pair in upper case", `{"beneficiary":"\uD83D\uDE00","n":1}`, "\U0001F600"},
		{"UTF-8 as sent", "{\"beneficiary\":\"Zoë \xf0\x9f\x98\x80\",\"n\":1}", "Zoë 😀"},
		{"an escaped backslash then u", `{"beneficiary":"\\ud800","n":1}`, `\ud800`},
		{"BMP escapes", `{"beneficiary":"\u00e9\uFFFD\ue000","n":1}`, "é\uFFFD\ue000"},
	}
	for _, c := range good {
		o, errs := ParseObject([]byte(c.body))
		if errs != nil {
			t.Errorf("%s: %v", c.name, errs)
			continue
		}
		v, _ := o.String("beneficiary", true, false, nil)
		_, _ = o.Int64("n", true, 0, 9)
		if errs := o.Finish(); len(errs) != 0 || v != c.value {
			t.Errorf("%s: %q, %v; want %q", c.name, v, errs, c.value)
		}
	}

	// A body that is not well-formed JSON is that first, whatever its names hold.
	if _, errs := ParseObject([]byte("{\"\xff\":}")); len(errs) != 1 || errs[0].Problem != "must be well-formed JSON" {
		t.Errorf("malformed with a bad name: %v, want the grammar's verdict", errs)
	}
	// A member name that is not text cannot be named back: the body is the fault.
	for _, body := range []string{"{\"bene\xffficiary\":\"B\"}", `{"\ud800":"B"}`} {
		if _, errs := ParseObject([]byte(body)); len(errs) != 1 || errs[0].Field != "body" || !strings.Contains(errs[0].Problem, "UTF-8") {
			t.Errorf("%q: %v, want one fault on body", body, errs)
		}
	}
}
