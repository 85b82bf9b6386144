package payment_test

import (
	"encoding/json"
	"strings"
	"testing"

	"lock.dev/lockapi"
)

// Text that is not Unicode (a raw 0xff byte, a lone surrogate escape) and a
// currency ISO 4217 does not list are refused at payment-resource: 400
// INVALID_REQUEST naming the field, nothing written. A surrogate pair and real
// codes (EUR, JPY) are taken, the pair stored as the one character it spells.
func TestBodyTextAndCurrencyAreRefusedNotRepaired(t *testing.T) {
	t.Parallel()
	e := start(t)
	e.create(t, "p-claimed", "acct-1", 100)
	e.claim(t, "p-claimed", 5, "exec-a")
	jsonCT := map[string][]string{"Content-Type": {"application/json"}}
	postH := map[string][]string{"Content-Type": {"application/json"}, lockapi.HeaderFencingToken: {"5"}, lockapi.HeaderOwnerID: {"exec-a"}}
	create := func(currency, beneficiary string) string {
		return `{"payoutId":"p-new","accountId":"acct-1","amountMinor":100,"currency":"` + currency + `","beneficiary":"` + beneficiary + `"}`
	}
	const notText, unknownCode = "must be valid UTF-8 text", "unknown ISO 4217 code"
	cases := []struct {
		name, path string
		header     map[string][]string
		body       string
		field, has string
	}{
		{"raw 0xff in beneficiary", "/v1/payouts", jsonCT, create("EUR", "B-\xff"), "beneficiary", notText},
		{"lone high surrogate in beneficiary", "/v1/payouts", jsonCT, create("EUR", `B-\ud800`), "beneficiary", notText},
		{"lone low surrogate in beneficiary", "/v1/payouts", jsonCT, create("EUR", `\udc00-B`), "beneficiary", notText},
		{"lone high surrogate in declineReason", "/v1/payouts/p-claimed/post", postH, `{"outcome":"DECLINED","declineReason":"no \ud800"}`, "declineReason", notText},
		{"raw 0xff in railReference", "/v1/payouts/p-claimed/post", postH, "{\"outcome\":\"PAID\",\"railReference\":\"RS-\xff\"}", "railReference", notText},
		{"currency ABC", "/v1/payouts", jsonCT, create("ABC", "B-1"), "currency", unknownCode},
		{"currency XYZ", "/v1/payouts", jsonCT, create("XYZ", "B-1"), "currency", unknownCode},
		{"currency EUX", "/v1/payouts", jsonCT, create("EUX", "B-1"), "currency", unknownCode},
	}
	before := e.snapshot(t)
	for _, c := range cases {
		status, b := e.raw(t, "POST", c.path, c.header, c.body)
		var p struct {
			Code   string               `json:"code"`
			Errors []lockapi.FieldError `json:"errors"`
		}
		_ = json.Unmarshal(b, &p)
		if status != 400 || p.Code != lockapi.CodeInvalidRequest || len(p.Errors) != 1 ||
			p.Errors[0].Field != c.field || !strings.Contains(p.Errors[0].Problem, c.has) {
			t.Errorf("%s: %d %s, want 400 INVALID_REQUEST with one fault on %s: %s…", c.name, status, b, c.field, c.has)
		}
	}
	if after := e.snapshot(t); after != before {
		t.Errorf("refused requests wrote:\nbefore %s\nafter  %s", before, after)
	}

	for _, c := range []struct{ id, currency, beneficiary, stored string }{
		{"p-pair", "EUR", `B-\ud83d\ude00`, "B-\U0001F600"},
		{"p-jpy", "JPY", "B-1", "B-1"},
	} {
		body := strings.Replace(create(c.currency, c.beneficiary), "p-new", c.id, 1)
		status, b := e.raw(t, "POST", "/v1/payouts", jsonCT, body)
		var p lockapi.Payout
		if err := json.Unmarshal(b, &p); status != 201 || err != nil || p.Beneficiary != c.stored || p.Currency != c.currency {
			t.Errorf("%s: %d %s, want 201 with beneficiary %q in %s", c.id, status, b, c.stored, c.currency)
		}
	}
}
