package isomsg

import (
	"fmt"
	"math"
	"strings"

	"lock.dev/internal/iso4217"
)

// maxAmountDigits is the schemas' totalDigits for an amount
// (ActiveOrHistoricCurrencyAndAmount_SimpleType): at most 18 digits in all.
const maxAmountDigits = 18

// exponent is currency's ISO 4217 minor-unit exponent, or an error when the
// currency has none (a fund or metal, or not a code at all): such an amount
// cannot be written in minor units.
func exponent(currency string) (int, error) {
	e, ok := iso4217.Exponent(currency)
	if !ok {
		return 0, fmt.Errorf("currency %q has no ISO 4217 minor unit", currency)
	}
	return e, nil
}

// FormatAmount writes minor units of currency as an ISO 20022 decimal amount by
// the currency's ISO 4217 exponent: 1395 EUR is "13.95", 1395 JPY "1395", 1395
// BHD "1.395". The exponent is ISO's (SIX's list), not CLDR's: 1395 IQD is
// "1.395". A currency without an exponent, or a negative amount (ISO 20022
// amounts are unsigned; the direction is CdtDbtInd's), is an error.
func FormatAmount(minor int64, currency string) (string, error) {
	e, err := exponent(currency)
	if err != nil {
		return "", err
	}
	if minor < 0 {
		return "", fmt.Errorf("amount %d %s is negative", minor, currency)
	}
	digits := fmt.Sprintf("%0*d", e+1, minor)
	if e == 0 {
		return digits, nil
	}
	return digits[:len(digits)-e] + "." + digits[len(digits)-e:], nil
}

// ParseAmount reads an ISO 20022 decimal amount of currency into minor units,
// the inverse of FormatAmount: "13.95" EUR is 1395, "13.9" 1390, "13" 1300.
// It refuses a currency without an ISO 4217 exponent, more fraction digits than
// the exponent (even zeros: "13.950" EUR is not an amount the rail meant in
// cents), a sign, an exponent, spaces, an empty integer or fraction part, more
// than 18 digits, and an amount that does not fit in int64 minor units.
func ParseAmount(s, currency string) (int64, error) {
	e, err := exponent(currency)
	if err != nil {
		return 0, err
	}
	intPart, frac, hasPoint := strings.Cut(s, ".")
	if intPart == "" || (hasPoint && frac == "") || !allDigits(intPart) || !allDigits(frac) {
		return 0, fmt.Errorf("amount %q is not a decimal of digits", s)
	}
	if len(frac) > e {
		return 0, fmt.Errorf("amount %q has %d fraction digits, %s has %d", s, len(frac), currency, e)
	}
	if len(intPart)+len(frac) > maxAmountDigits {
		return 0, fmt.Errorf("amount %q has more than %d digits", s, maxAmountDigits)
	}
	var v int64
	for _, d := range intPart + frac + strings.Repeat("0", e-len(frac)) {
		n := int64(d - '0')
		if v > (math.MaxInt64-n)/10 {
			return 0, fmt.Errorf("amount %q %s does not fit in minor units", s, currency)
		}
		v = v*10 + n
	}
	return v, nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
