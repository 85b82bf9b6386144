// Package iso4217 is ISO 4217's list one — the active currency and fund codes —
// as its maintenance agency (SIX) publishes it, with each code's minor-unit
// exponent. It is the one table the project checks currencies against and
// converts minor units with.
//
// The table is generated (go generate) from list-one.xml, SIX's own file kept
// verbatim beside this source, not typed by hand; the package's tests check that
// the generated table and the file agree, entry for entry. To follow a new
// publication, replace list-one.xml with SIX's current file, set Source, run
// go generate, and run the tests.
//
// The exponents are ISO's, not CLDR's: the two differ for some currencies (IQD
// is 3 in ISO 4217, 0 in CLDR), and a payment message must carry ISO's.
package iso4217

//go:generate go run gen.go

// Source is where list-one.xml was taken from: SIX's "list one" as a public
// repository keeps it verbatim.
const Source = "SIX Group, ISO 4217 list one (Table A.1), list-one.xml; copy from github.com/datasets/currency-codes archive/table_a1.xml at a082085400312372ae50d5e21f46b2fe05ecd644"

// Valid reports whether code is an active ISO 4217 alphabetic code (list one:
// currencies, funds and the X codes such as XAU, XDR, XTS and XXX). Upper case
// only, as ISO writes them.
func Valid(code string) bool {
	_, known := lookup(code)
	return known
}

// Exponent is the number of digits after the decimal separator of code's minor
// unit (EUR 2, JPY 0, BHD 3, CLF 4). ok is false for a code ISO gives no minor
// unit ("N.A.": gold, silver, SDR, XTS, XXX …) and for a code that is not in
// the list: such a code has no minor unit to count in.
func Exponent(code string) (exp int, ok bool) {
	e, known := lookup(code)
	if !known || e < 0 {
		return 0, false
	}
	return e, true
}
