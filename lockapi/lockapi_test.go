package lockapi

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestParseToken(t *testing.T) {
	ok := map[string]int64{
		"1":                   1,
		"42":                  42,
		"9223372036854775807": 9223372036854775807,
		"1000000000000000000": 1000000000000000000,
	}
	for in, want := range ok {
		got, err := ParseToken(in)
		if err != nil || got != want {
			t.Errorf("ParseToken(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	bad := []string{"", "0", "00", "01", "+1", "-1", " 1", "1 ", "1 2", "1,2", "1.0", "1e3", "0x10",
		"9223372036854775808", "9999999999999999999", "10000000000000000000", "１", "1\x00", "٣"}
	for _, in := range bad {
		if v, err := ParseToken(in); err == nil {
			t.Errorf("ParseToken(%q) = %d, want an error", in, v)
		}
	}
}

var tokenRE = regexp.MustCompile(`^[1-9][0-9]{0,18}$`)

// FuzzParseToken checks the parser against the contract's own definition: the
// regular expression plus the int64 bound.
func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"1", "0", "01", "9223372036854775807", "9223372036854775808", "-1", " 1", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseToken(s)
		want, perr := strconv.ParseInt(s, 10, 64)
		valid := tokenRE.MatchString(s) && perr == nil
		if valid != (err == nil) {
			t.Fatalf("ParseToken(%q) err=%v, contract says valid=%v", s, err, valid)
		}
		if valid && v != want {
			t.Fatalf("ParseToken(%q) = %d, want %d", s, v, want)
		}
	})
}

func TestFencingHeaders(t *testing.T) {
	h := http.Header{}
	h.Add(HeaderFencingToken, "7")
	h.Add(HeaderOwnerID, "worker-1@host:1/a.b_c")
	h.Add(HeaderIdempotencyKey, "p-1:7")
	f, errs := ParseFencingHeaders(h, true, true, true)
	if errs != nil || f.Token != 7 || f.OwnerID != "worker-1@host:1/a.b_c" || f.IdempotencyKey != "p-1:7" {
		t.Fatalf("good headers: %+v %v", f, errs)
	}

	rep := http.Header{}
	rep.Add(HeaderFencingToken, "7")
	rep.Add(HeaderFencingToken, "8")
	rep.Add(HeaderOwnerID, "has space")
	rep.Add(HeaderIdempotencyKey, strings.Repeat("k", 256))
	_, errs = ParseFencingHeaders(rep, true, true, true)
	if len(errs) != 3 {
		t.Fatalf("want a fault per header, got %v", errs)
	}
	for i, name := range []string{HeaderFencingToken, HeaderOwnerID, HeaderIdempotencyKey} {
		if errs[i].Field != name {
			t.Errorf("fault %d names %q, want %q", i, errs[i].Field, name)
		}
	}
	_, errs = ParseFencingHeaders(http.Header{}, true, true, false)
	if len(errs) != 2 {
		t.Fatalf("missing headers: want 2 faults, got %v", errs)
	}
}

func TestParseSubmissionRequest(t *testing.T) {
	good := `{"payoutId":"p-1001","accountId":"acct-7","amountMinor":125000,"currency":"EUR","beneficiary":"NL91ABNA0417164300"}`
	req, errs := ParseSubmissionRequest([]byte(good))
	if errs != nil || req.AmountMinor != 125000 || req.PayoutID != "p-1001" {
		t.Fatalf("good body: %+v %v", req, errs)
	}
	cases := map[string]string{
		"not json":          `{"payoutId":`,
		"array":             `[]`,
		"trailing data":     good + `{}`,
		"unknown member":    strings.Replace(good, `}`, `,"x":1}`, 1),
		"duplicate member":  strings.Replace(good, `{`, `{"payoutId":"p-2",`, 1),
		"missing member":    `{"payoutId":"p","accountId":"a","amountMinor":1,"currency":"EUR"}`,
		"fraction":          strings.Replace(good, `125000`, `125000.0`, 1),
		"exponent":          strings.Replace(good, `125000`, `1.25e5`, 1),
		"amount as string":  strings.Replace(good, `125000`, `"125000"`, 1),
		"amount zero":       strings.Replace(good, `125000`, `0`, 1),
		"amount too large":  strings.Replace(good, `125000`, `1000000000000001`, 1),
		"amount overflow":   strings.Replace(good, `125000`, `99999999999999999999`, 1),
		"currency lower":    strings.Replace(good, `EUR`, `eur`, 1),
		"payout id slash":   strings.Replace(good, `p-1001`, `p/1001`, 1),
		"payout id long":    strings.Replace(good, `p-1001`, strings.Repeat("p", 65), 1),
		"null beneficiary":  strings.Replace(good, `"NL91ABNA0417164300"`, `null`, 1),
		"control character": strings.Replace(good, `NL91ABNA0417164300`, `NL\u0007`, 1),
	}
	for name, body := range cases {
		if _, errs := ParseSubmissionRequest([]byte(body)); len(errs) == 0 {
			t.Errorf("%s: accepted %s", name, body)
		}
	}
	// Several faults are all listed.
	_, errs = ParseSubmissionRequest([]byte(`{"payoutId":"","accountId":"","amountMinor":0,"currency":"x","beneficiary":"","extra":true}`))
	if len(errs) != 6 {
		t.Fatalf("want 6 faults, got %d: %v", len(errs), errs)
	}
}

func TestContentType(t *testing.T) {
	for _, ct := range []string{"application/json", "Application/JSON", "application/json; charset=utf-8"} {
		if err := CheckJSONContentType(http.Header{"Content-Type": {ct}}); err != nil {
			t.Errorf("%q refused: %v", ct, err)
		}
	}
	for _, ct := range []string{"", "text/plain", "application/jsonx", "application/problem+json", ";;"} {
		h := http.Header{}
		if ct != "" {
			h.Set("Content-Type", ct)
		}
		if err := CheckJSONContentType(h); err == nil {
			t.Errorf("%q accepted", ct)
		}
	}
}

func TestMaskBeneficiary(t *testing.T) {
	if got := MaskBeneficiary("NL91ABNA0417164300"); got != "****4300" {
		t.Fatalf("got %q", got)
	}
	if got := MaskBeneficiary("abc"); got != "****" {
		t.Fatalf("short value leaked: %q", got)
	}
}

// A body the server already knows is too large — its read fails as
// http.MaxBytesReader's does past the limit, as serve's refused bodies do — is a
// 413, after the content type's 415, and never a 400 "could not be read".
func TestReadJSONBodyKnownTooLarge(t *testing.T) {
	body := `{"payoutId":"` + strings.Repeat("x", 100) + `"}`
	for _, c := range []struct {
		contentType string
		status      int
	}{{"application/json", http.StatusRequestEntityTooLarge}, {"text/plain", http.StatusUnsupportedMediaType}} {
		r, _ := http.NewRequest(http.MethodPost, "http://x/", nil)
		r.ContentLength = -1
		r.Body = http.MaxBytesReader(nil, io.NopCloser(strings.NewReader(body)), 10)
		r.Header.Set("Content-Type", c.contentType)
		b, fault := ReadJSONBody(r)
		if fault == nil || fault.Status != c.status || len(fault.Errors) != 1 {
			t.Fatalf("%s: body %q, fault %+v; want %d", c.contentType, b, fault, c.status)
		}
	}
}
