package lockapi

import (
	"net/http"
	"testing"
)

func TestValidateBearerToken(t *testing.T) {
	for _, ok := range []string{"0123456789abcdef", "abcDEF-._~+/0123456789==", "Zm9vYmFyYmF6cXV4cXV1eA=="} {
		if err := ValidateBearerToken(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "short", "0123456789abcde", "0123456789 abcdef", "0123456789abcdef\n", "================", "01234567=89abcdef", "0123456789abcdéf"} {
		if err := ValidateBearerToken(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestBearerMatches(t *testing.T) {
	const want = "0123456789abcdef"
	for _, c := range []struct {
		vals []string
		ok   bool
	}{
		{[]string{"Bearer " + want}, true},
		{[]string{"bearer " + want}, true},
		{[]string{"BEARER " + want}, true},
		{nil, false},
		{[]string{""}, false},
		{[]string{"Bearer"}, false},
		{[]string{"Bearer  " + want}, false},
		{[]string{"Bearer " + want + " "}, false},
		{[]string{"Bearer " + want[:15]}, false},
		{[]string{"Basic " + want}, false},
		{[]string{want}, false},
		{[]string{"Bearer " + want, "Bearer " + want}, false},
	} {
		h := http.Header{"Authorization": c.vals}
		if got := BearerMatches(h, want); got != c.ok {
			t.Errorf("%q: %t, want %t", c.vals, got, c.ok)
		}
	}
	if BearerMatches(http.Header{"Authorization": {"Bearer "}}, "") {
		t.Error("an empty configured token matched")
	}
}
