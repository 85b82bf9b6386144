package jsonbody

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

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

// A body the server already knows is too large — its read fails as
// http.MaxBytesReader's does past the limit, as fastserve's refused bodies do — is a
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
