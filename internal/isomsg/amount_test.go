package isomsg_test

import (
	"testing"

	"lock.dev/internal/isomsg"
)

func TestFormatAmountByISO4217Exponent(t *testing.T) {
	for _, c := range []struct {
		minor    int64
		currency string
		want     string
	}{
		{1395, "EUR", "13.95"},
		{5, "EUR", "0.05"},
		{0, "EUR", "0.00"},
		{1395, "JPY", "1395"},
		{0, "JPY", "0"},
		{1395, "BHD", "1.395"},
		{1395, "IQD", "1.395"}, // ISO 4217 (SIX) says 3; CLDR says 0
		{12345, "CLF", "1.2345"},
		{1, "KWD", "0.001"},
	} {
		got, err := isomsg.FormatAmount(c.minor, c.currency)
		if err != nil || got != c.want {
			t.Errorf("FormatAmount(%d, %s) = %q, %v; want %q", c.minor, c.currency, got, err, c.want)
		}
		back, err := isomsg.ParseAmount(got, c.currency)
		if err != nil || back != c.minor {
			t.Errorf("ParseAmount(%q, %s) = %d, %v; want %d", got, c.currency, back, err, c.minor)
		}
	}
	for _, c := range []struct {
		minor    int64
		currency string
	}{{100, "ZZZ"}, {100, "XAU"}, {100, "XXX"}, {100, "eur"}, {100, ""}, {-1, "EUR"}} {
		if got, err := isomsg.FormatAmount(c.minor, c.currency); err == nil {
			t.Errorf("FormatAmount(%d, %q) = %q, want an error", c.minor, c.currency, got)
		}
	}
}

func TestParseAmount(t *testing.T) {
	for _, c := range []struct {
		s, currency string
		want        int64
	}{
		{"13.9", "EUR", 1390},
		{"13", "EUR", 1300},
		{"013.95", "EUR", 1395},
		{"1.5", "BHD", 1500},
		{"1395", "JPY", 1395},
		{"9999999999999999.99", "EUR", 999999999999999999}, // 18 digits, the most there are
	} {
		got, err := isomsg.ParseAmount(c.s, c.currency)
		if err != nil || got != c.want {
			t.Errorf("ParseAmount(%q, %s) = %d, %v; want %d", c.s, c.currency, got, err, c.want)
		}
	}
	for _, c := range []struct{ s, currency string }{
		{"13.950", "EUR"}, // more fraction digits than the exponent, zeros too
		{"1395.0", "JPY"},
		{"1.3950", "BHD"},
		{"+13.95", "EUR"}, {"-13.95", "EUR"}, {"1e3", "EUR"}, {"1E3", "JPY"},
		{" 13.95", "EUR"}, {"13.95 ", "EUR"}, {"13 .95", "EUR"}, {"1,395.00", "EUR"},
		{"", "EUR"}, {".", "EUR"}, {".95", "EUR"}, {"13.", "EUR"}, {"0x10", "JPY"},
		{"999999999999999999", "CLF"},   // fits the schema, not int64 minor units
		{"1234567890123456789", "JPY"},  // 19 digits: over the schemas' totalDigits
		{"13.95", "ZZZ"}, {"13", "XAU"}, // no exponent
		{"١٣", "JPY"}, // digits, but not ASCII ones
	} {
		if got, err := isomsg.ParseAmount(c.s, c.currency); err == nil {
			t.Errorf("ParseAmount(%q, %q) = %d, want an error", c.s, c.currency, got)
		}
	}
}

func TestIsIBAN(t *testing.T) {
	for s, want := range map[string]bool{
		"DE89370400440532013000": true,
		"NL91ABNA0417164300":     true,
		"GB82WEST12345698765432": true,
		"DE89370400440532013001": false, // check digits do not hold
		"NL91 ABNA 0417 1643 00": false, // the print form: written as Othr/Id
		"acct-1":                 false,
		"ben-42":                 false,
		"":                       false,
	} {
		if got := isomsg.IsIBAN(s); got != want {
			t.Errorf("IsIBAN(%q) = %v, want %v", s, got, want)
		}
	}
}
