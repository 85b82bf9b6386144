package railproxy

import (
	"net/http"
	"strings"
	"testing"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// A submission whose body holds text that is not Unicode (a raw 0xff byte, a
// lone surrogate escape) or a currency ISO 4217 does not list is 400
// INVALID_REQUEST naming the field: no row, no mark, no rail call. A surrogate
// pair is one character and is forwarded as that character.
func TestSubmissionBodyTextAndCurrencyAreRefusedNotRepaired(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	stub := startStub(t, 0)
	p := startProxy(t, testConfig(dbURL, stub.URL))
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set(lockapi.HeaderFencingToken, "7")
	h.Set(lockapi.HeaderOwnerID, "worker-1")
	h.Set(lockapi.HeaderIdempotencyKey, "k-1")
	body := func(id, currency, beneficiary string) []byte {
		return []byte(`{"payoutId":"` + id + `","accountId":"acct-1","amountMinor":100,"currency":"` + currency + `","beneficiary":"` + beneficiary + `"}`)
	}
	const notText, unknownCode = "must be valid UTF-8 text", "unknown ISO 4217 code"
	for _, c := range []struct {
		name       string
		body       []byte
		field, has string
	}{
		{"raw 0xff in beneficiary", body("p-1", "EUR", "B-\xff"), "beneficiary", notText},
		{"lone high surrogate", body("p-1", "EUR", `B-\ud800`), "beneficiary", notText},
		{"lone low surrogate", body("p-1", "EUR", `\udc00-B`), "beneficiary", notText},
		{"currency ABC", body("p-1", "ABC", "B-1"), "currency", unknownCode},
		{"currency XYZ", body("p-1", "XYZ", "B-1"), "currency", unknownCode},
	} {
		a := post(t, p.URL, h, c.body)
		errs, _ := a.Body["errors"].([]any)
		var field, problem string
		if len(errs) == 1 {
			e, _ := errs[0].(map[string]any)
			field, _ = e["field"].(string)
			problem, _ = e["problem"].(string)
		}
		if a.Status != 400 || a.code() != lockapi.CodeInvalidRequest || field != c.field || !strings.Contains(problem, c.has) {
			t.Errorf("%s: %d %v, want 400 INVALID_REQUEST with one fault on %s: %s…", c.name, a.Status, a.Body, c.field, c.has)
		}
	}
	if n := countRows(t, db); n != 0 {
		t.Errorf("%d rail_submission rows after refused submissions, want none", n)
	}
	if m := mark(t, db, "acct-1"); m != 0 {
		t.Errorf("acct-1's mark is %d after refused submissions, want none", m)
	}
	if calls := stub.calls(t); len(calls) != 0 {
		t.Errorf("the rail saw %d calls for refused submissions", len(calls))
	}

	if a := post(t, p.URL, h, body("p-pair", "JPY", `B-\ud83d\ude00`)); a.Status != 200 {
		t.Fatalf("a surrogate pair in JPY: %d %v, want 200", a.Status, a.Body)
	}
	if calls := stub.calls(t); len(calls) != 1 || calls[0].Beneficiary != "B-\U0001F600" || calls[0].Currency != "JPY" {
		t.Errorf("the rail saw %+v, want one call for B-\U0001F600 in JPY", calls)
	}
}
