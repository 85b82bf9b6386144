package iso4217_test

import (
	_ "embed"
	"encoding/xml"
	"strconv"
	"strings"
	"testing"

	"lock.dev/internal/iso4217"
)

//go:embed list-one.xml
var listOne []byte

type entry struct {
	Code       string `xml:"Ccy"`
	MinorUnits string `xml:"CcyMnrUnts"`
	Fund       struct {
		IsFund string `xml:"IsFund,attr"`
	} `xml:"CcyNm"`
}

// parse reads SIX's file the way a reader of it would, independently of the
// generator: code → exponent (-1 for "N.A.").
func parse(t *testing.T) (string, map[string]int) {
	t.Helper()
	var l struct {
		Published string  `xml:"Pblshd,attr"`
		Entries   []entry `xml:"CcyTbl>CcyNtry"`
	}
	if err := xml.Unmarshal(listOne, &l); err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, e := range l.Entries {
		if e.Code == "" {
			continue
		}
		exp := -1
		if e.MinorUnits != "N.A." {
			var err error
			if exp, err = strconv.Atoi(e.MinorUnits); err != nil {
				t.Fatalf("%s: minor units %q", e.Code, e.MinorUnits)
			}
		}
		m[e.Code] = exp
	}
	if len(m) < 150 {
		t.Fatalf("only %d codes in list-one.xml", len(m))
	}
	return l.Published, m
}

// The generated table is SIX's file, every code of it and nothing else: every
// three-letter string is valid exactly when the file lists it, with the file's
// exponent. A list-one.xml replaced without go generate fails here.
func TestTableIsTheList(t *testing.T) {
	published, want := parse(t)
	if iso4217.Published != published {
		t.Errorf("Published = %s, the file says %s: run go generate", iso4217.Published, published)
	}
	var b [3]byte
	for b[0] = 'A'; b[0] <= 'Z'; b[0]++ {
		for b[1] = 'A'; b[1] <= 'Z'; b[1]++ {
			for b[2] = 'A'; b[2] <= 'Z'; b[2]++ {
				c := string(b[:])
				w, listed := want[c]
				if got := iso4217.Valid(c); got != listed {
					t.Errorf("Valid(%s) = %v, the file lists it: %v", c, got, listed)
				}
				e, ok := iso4217.Exponent(c)
				if ok != (listed && w >= 0) || (ok && e != w) {
					t.Errorf("Exponent(%s) = %d, %v; the file says %d (listed %v)", c, e, ok, w, listed)
				}
			}
		}
	}
}

// Known entries, as ISO (not CLDR) gives them.
func TestKnownEntries(t *testing.T) {
	for _, c := range []struct {
		code string
		exp  int
		ok   bool
	}{
		{"EUR", 2, true}, {"USD", 2, true}, {"JPY", 0, true}, {"BHD", 3, true},
		{"IQD", 3, true}, // CLDR says 0
		{"CLF", 4, true}, // a fund, four digits
		{"UYW", 4, true},
		{"XXX", 0, false}, {"XTS", 0, false}, {"XAU", 0, false}, {"XDR", 0, false}, // N.A.: no minor unit
	} {
		if !iso4217.Valid(c.code) {
			t.Errorf("Valid(%s) = false", c.code)
		}
		if e, ok := iso4217.Exponent(c.code); e != c.exp || ok != c.ok {
			t.Errorf("Exponent(%s) = %d, %v; want %d, %v", c.code, e, ok, c.exp, c.ok)
		}
	}
	for _, code := range []string{"ABC", "XYZ", "AAA", "EUX", "eur", "Eur", "EU", "EURO", "", "DEM", "CNH", " EUR"} {
		if iso4217.Valid(code) {
			t.Errorf("Valid(%q) = true", code)
		}
		if _, ok := iso4217.Exponent(code); ok {
			t.Errorf("Exponent(%q) has an exponent", code)
		}
	}
}

// Funds (IsFund) are in list one and valid: a fund code is what ISO says it is.
func TestFundsAreListed(t *testing.T) {
	var l struct {
		Entries []entry `xml:"CcyTbl>CcyNtry"`
	}
	if err := xml.Unmarshal(listOne, &l); err != nil {
		t.Fatal(err)
	}
	var funds []string
	for _, e := range l.Entries {
		if strings.EqualFold(e.Fund.IsFund, "true") {
			funds = append(funds, e.Code)
			if !iso4217.Valid(e.Code) {
				t.Errorf("fund %s is not valid", e.Code)
			}
		}
	}
	if len(funds) == 0 {
		t.Fatal("no fund in list-one.xml")
	}
}
