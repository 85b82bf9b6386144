package railstub

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// The stub refuses a payment whose text is not Unicode — 400 naming the field,
// no call recorded — rather than recording a beneficiary the caller never sent.
func TestPaymentBodyTextIsRefusedNotRepaired(t *testing.T) {
	ts := startStub(t, nil)
	hc := &http.Client{Timeout: 10 * time.Second}
	body := func(beneficiary string) []byte {
		return []byte(`{"reference":"p-1","accountId":"acct-7","amountMinor":100,"currency":"EUR","beneficiary":"` + beneficiary + `"}`)
	}
	for name, b := range map[string][]byte{
		"raw 0xff":            body("B-\xff"),
		"lone high surrogate": body(`B-\ud800`),
		"lone low surrogate":  body(`\udc00-B`),
	} {
		r, err := send(t.Context(), hc, ts.URL, http.MethodPost, "/rail/v1/payments", "application/json", b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		p := problem(t, r, 400, "INVALID_REQUEST")
		if f := fields(t, p); len(f) != 1 || f[0] != "beneficiary" || !strings.Contains(string(r.body), "must be valid UTF-8 text") {
			t.Errorf("%s: %s, want one fault on beneficiary", name, r.body)
		}
	}
	if cs := calls(t, ts); len(cs) != 0 {
		t.Errorf("%d calls recorded for refused payments", len(cs))
	}
	r, err := send(t.Context(), hc, ts.URL, http.MethodPost, "/rail/v1/payments", "application/json", body(`B-\ud83d\ude00`))
	if err != nil || r.status != 200 {
		t.Fatalf("a surrogate pair: %v %d %s", err, r.status, r.body)
	}
	if cs := calls(t, ts); len(cs) != 1 || cs[0].Beneficiary != "B-\U0001F600" {
		t.Errorf("recorded %+v, want B-\U0001F600", cs)
	}
}
