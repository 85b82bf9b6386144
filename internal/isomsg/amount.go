package isomsg

// FormatAmount writes minor units of currency as an ISO 20022 decimal amount by
// the currency's ISO 4217 exponent: 1395 EUR is "13.95", 1395 JPY "1395", 1395
// BHD "1.395".
func FormatAmount(minor int64, currency string) (string, error) { return "", errNotYet }

// ParseAmount reads an ISO 20022 decimal amount of currency into minor units.
func ParseAmount(s, currency string) (int64, error) { return 0, errNotYet }
