package lockapi

import (
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

func TestMaskBeneficiary(t *testing.T) {
	if got := MaskBeneficiary("NL91ABNA0417164300"); got != "****4300" {
		t.Fatalf("got %q", got)
	}
	if got := MaskBeneficiary("abc"); got != "****" {
		t.Fatalf("short value leaked: %q", got)
	}
}

func TestValidateCurrencyIsISO4217(t *testing.T) {
	for _, c := range []string{"EUR", "JPY", "USD", "BHD", "CLF", "IQD"} {
		if err := ValidateCurrency(c); err != nil {
			t.Errorf("ValidateCurrency(%s) = %v", c, err)
		}
	}
	for _, c := range []string{"ABC", "XYZ", "EUX", "QQQ", "DEM"} {
		err := ValidateCurrency(c)
		if err == nil || !strings.Contains(ProblemText(err), "unknown ISO 4217 code") {
			t.Errorf("ValidateCurrency(%s) = %v, want an unknown ISO 4217 code", c, err)
		}
	}
	for _, c := range []string{"eur", "EU", "EURO", "E1R", ""} {
		if err := ValidateCurrency(c); err == nil {
			t.Errorf("ValidateCurrency(%q) accepted", c)
		}
	}
}
