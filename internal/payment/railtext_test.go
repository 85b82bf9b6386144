package payment_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"lock.dev/lockapi"
)

// A post or a settle whose rail reference or decline reason is not storable text
// (docs/contracts/payments.md) is 400 INVALID_REQUEST naming the field, and
// writes nothing: the payout stays as it was.
func TestRailWordsMustBeStorableText(t *testing.T) {
	t.Parallel()
	e := start(t, withSettleToken, booksUnchecked) // about text rules; its AMBIGUOUS payout never went to the rail
	e.create(t, "p-claimed", "acct-1", 10)
	e.claim(t, "p-claimed", 5, "exec-a")
	e.ambiguous(t, "p-ambiguous", 20, 6)
	before := e.snapshot(t)

	postH := map[string][]string{"Content-Type": {"application/json"}, lockapi.HeaderFencingToken: {"5"}, lockapi.HeaderOwnerID: {"exec-a"}}
	settleH := map[string][]string{"Content-Type": {"application/json"}, "Authorization": {bearer}}
	const post, settle = "/v1/payouts/p-claimed/post", "/v1/payouts/p-ambiguous/settle"
	cases := []struct {
		name, path string
		header     map[string][]string
		body       string
		field      string
	}{
		{"post PAID, NUL in railReference", post, postH, `{"outcome":"PAID","railReference":"RS-\u0000-1"}`, "railReference"},
		{"post PAID, SOH in railReference", post, postH, `{"outcome":"PAID","railReference":"RS-\u0001"}`, "railReference"},
		{"post PAID, tab in railReference", post, postH, `{"outcome":"PAID","railReference":"RS\t1"}`, "railReference"},
		{"post PAID, DEL in railReference", post, postH, "{\"outcome\":\"PAID\",\"railReference\":\"RS-\x7f\"}", "railReference"},
		{"post PAID, C1 U+0085 in railReference", post, postH, `{"outcome":"PAID","railReference":"RS-\u0085"}`, "railReference"},
		{"post PAID, U+FFFD in railReference", post, postH, `{"outcome":"PAID","railReference":"RS-\ufffd"}`, "railReference"},
		{"post PAID, railReference of 36 characters", post, postH, `{"outcome":"PAID","railReference":"` + strings.Repeat("R", 36) + `"}`, "railReference"},
		{"post DECLINED, newline in declineReason", post, postH, `{"outcome":"DECLINED","declineReason":"limit\nexceeded"}`, "declineReason"},
		{"post DECLINED, declineReason of 141 characters", post, postH, `{"outcome":"DECLINED","declineReason":"` + strings.Repeat("é", 141) + `"}`, "declineReason"},
		{"post AMBIGUOUS, NUL in declineReason", post, postH, `{"outcome":"AMBIGUOUS","declineReason":"late\u0000"}`, "declineReason"},
		{"settle PAID, C1 in railReference", settle, settleH, `{"outcome":"PAID","railReference":"RS-\u009f","statementSeq":1}`, "railReference"},
		{"settle DECLINED, NUL in declineReason", settle, settleH, `{"outcome":"DECLINED","declineReason":"x\u0000","statementSeq":1}`, "declineReason"},
	}
	for _, tc := range cases {
		status, b := e.raw(t, http.MethodPost, tc.path, tc.header, tc.body)
		var prob struct {
			Code   string `json:"code"`
			Errors []struct {
				Field string `json:"field"`
			} `json:"errors"`
		}
		if err := json.Unmarshal(b, &prob); status != http.StatusBadRequest || err != nil || prob.Code != lockapi.CodeInvalidRequest ||
			len(prob.Errors) != 1 || prob.Errors[0].Field != tc.field {
			t.Errorf("%s: %d %s, want 400 INVALID_REQUEST naming only %s", tc.name, status, b, tc.field)
		}
	}
	if after := e.snapshot(t); after != before {
		t.Fatalf("refused posts and settles wrote:\nbefore %s\nafter  %s", before, after)
	}
}
