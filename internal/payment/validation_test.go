package payment_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"lock.dev/lockapi"
)

type hdr = map[string][]string

// The malformed-input catalogue: every request here is INVALID_REQUEST with the
// right status and the faulty field named, and none of them writes anything —
// the tables are byte-for-byte the same afterwards. Targets exist and are in
// states where a valid request would have written (PENDING, CLAIMED), or are
// final or missing, to show validation comes before any lookup.
func TestBadInputsWriteNothing(t *testing.T) {
	t.Parallel()
	e := start(t, booksUnchecked) // about validation; its PAID payout never went to the rail
	e.create(t, "p-pending", "acct-1", 100)
	e.create(t, "p-claimed", "acct-1", 100)
	e.claim(t, "p-claimed", 5, "exec-a")
	e.create(t, "p-paid", "acct-1", 100)
	e.claim(t, "p-paid", 5, "exec-a")
	if _, err := e.client.Post(t.Context(), "p-paid", 5, "exec-a", lockapi.PostRequest{Outcome: "PAID", RailReference: ptr("RS-1")}); err != nil {
		t.Fatal(err)
	}

	jsonCT := []string{"application/json"}
	good := `{"payoutId":"p-new","accountId":"acct-1","amountMinor":100,"currency":"EUR","beneficiary":"B-1"}`
	claimH := func(token, owner string) hdr {
		return hdr{lockapi.HeaderFencingToken: {token}, lockapi.HeaderOwnerID: {owner}}
	}
	postH := func(token, owner string) hdr {
		h := claimH(token, owner)
		h["Content-Type"] = jsonCT
		return h
	}
	paid := `{"outcome":"PAID","railReference":"RS-2"}`
	cases := []struct {
		name   string
		method string
		path   string
		header hdr
		body   string
		status int
		fields []string // the fields the answer must name, in order
	}{
		// create
		{"create without content type", "POST", "/v1/payouts", nil, good, 415, []string{"Content-Type"}},
		{"create as text/plain", "POST", "/v1/payouts", hdr{"Content-Type": {"text/plain"}}, good, 415, []string{"Content-Type"}},
		{"create over 64 KiB", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, `{"payoutId":"` + strings.Repeat("x", 70000) + `"}`, 413, []string{"body"}},
		{"create malformed JSON", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, `{"payoutId":`, 400, []string{"body"}},
		{"create trailing data", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, good + `{}`, 400, []string{"body"}},
		{"create not an object", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, `[1]`, 400, []string{"body"}},
		{"create unknown member", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, strings.TrimSuffix(good, "}") + `,"memo":"x"}`, 400, []string{"memo"}},
		{"create duplicate member", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, strings.TrimSuffix(good, "}") + `,"amountMinor":5}`, 400, []string{"amountMinor"}},
		{"create missing payoutId", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, `{"accountId":"acct-1","amountMinor":100,"currency":"EUR","beneficiary":"B-1"}`, 400, []string{"payoutId"}},
		{"create zero amount", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, strings.Replace(good, `100`, `0`, 1), 400, []string{"amountMinor"}},
		{"create amount above 10^15", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, strings.Replace(good, `100`, `1000000000000001`, 1), 400, []string{"amountMinor"}},
		{"create fractional amount", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, strings.Replace(good, `100`, `100.0`, 1), 400, []string{"amountMinor"}},
		{"create exponent amount", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, strings.Replace(good, `100`, `1e2`, 1), 400, []string{"amountMinor"}},
		{"create amount as string", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, strings.Replace(good, `100`, `"100"`, 1), 400, []string{"amountMinor"}},
		{"create lower-case currency", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, strings.Replace(good, `EUR`, `eur`, 1), 400, []string{"currency"}},
		{"create payoutId with a space", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, strings.Replace(good, `p-new`, `p new`, 1), 400, []string{"payoutId"}},
		{"create beneficiary too long", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, strings.Replace(good, `B-1`, strings.Repeat("b", 129), 1), 400, []string{"beneficiary"}},
		{"create null beneficiary", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, strings.Replace(good, `"B-1"`, `null`, 1), 400, []string{"beneficiary"}},
		{"create every field wrong", "POST", "/v1/payouts", hdr{"Content-Type": jsonCT}, `{"payoutId":"","accountId":7,"amountMinor":-1,"currency":"EURO","beneficiary":""}`, 400,
			[]string{"payoutId", "accountId", "amountMinor", "currency", "beneficiary"}},
		// claim
		{"claim without token", "POST", "/v1/payouts/p-pending/claim", hdr{lockapi.HeaderOwnerID: {"exec-a"}}, "", 400, []string{lockapi.HeaderFencingToken}},
		{"claim without owner", "POST", "/v1/payouts/p-pending/claim", hdr{lockapi.HeaderFencingToken: {"9"}}, "", 400, []string{lockapi.HeaderOwnerID}},
		{"claim token zero", "POST", "/v1/payouts/p-pending/claim", claimH("0", "exec-a"), "", 400, []string{lockapi.HeaderFencingToken}},
		{"claim token leading zero", "POST", "/v1/payouts/p-pending/claim", claimH("09", "exec-a"), "", 400, []string{lockapi.HeaderFencingToken}},
		{"claim token with sign", "POST", "/v1/payouts/p-pending/claim", claimH("+9", "exec-a"), "", 400, []string{lockapi.HeaderFencingToken}},
		{"claim negative token", "POST", "/v1/payouts/p-pending/claim", claimH("-9", "exec-a"), "", 400, []string{lockapi.HeaderFencingToken}},
		{"claim token above int64", "POST", "/v1/payouts/p-pending/claim", claimH("9223372036854775808", "exec-a"), "", 400, []string{lockapi.HeaderFencingToken}},
		{"claim token with inner space", "POST", "/v1/payouts/p-pending/claim", claimH("9 9", "exec-a"), "", 400, []string{lockapi.HeaderFencingToken}},
		{"claim repeated token", "POST", "/v1/payouts/p-pending/claim", hdr{lockapi.HeaderFencingToken: {"9", "10"}, lockapi.HeaderOwnerID: {"exec-a"}}, "", 400, []string{lockapi.HeaderFencingToken}},
		{"claim owner with a bad character", "POST", "/v1/payouts/p-pending/claim", claimH("9", "exec a"), "", 400, []string{lockapi.HeaderOwnerID}},
		{"claim owner too long", "POST", "/v1/payouts/p-pending/claim", claimH("9", strings.Repeat("o", 129)), "", 400, []string{lockapi.HeaderOwnerID}},
		{"claim bad id on a missing payout", "POST", "/v1/payouts/p%20x/claim", claimH("9", "exec-a"), "", 400, []string{"payoutId"}},
		{"claim bad token on a missing payout", "POST", "/v1/payouts/p-none/claim", claimH("x", "exec-a"), "", 400, []string{lockapi.HeaderFencingToken}},
		{"claim bad token on a final payout", "POST", "/v1/payouts/p-paid/claim", claimH("0", "exec-a"), "", 400, []string{lockapi.HeaderFencingToken}},
		// post
		{"post without content type", "POST", "/v1/payouts/p-claimed/post", claimH("5", "exec-a"), paid, 415, []string{"Content-Type"}},
		{"post 415 before bad headers", "POST", "/v1/payouts/p-claimed/post", hdr{"Content-Type": {"application/xml"}}, paid, 415, []string{"Content-Type"}},
		{"post 413 before bad headers", "POST", "/v1/payouts/p-claimed/post", hdr{"Content-Type": jsonCT}, `{"outcome":"` + strings.Repeat("P", 66000) + `"}`, 413, []string{"body"}},
		{"post without outcome", "POST", "/v1/payouts/p-claimed/post", postH("5", "exec-a"), `{"railReference":"RS-2"}`, 400, []string{"outcome"}},
		{"post unknown outcome", "POST", "/v1/payouts/p-claimed/post", postH("5", "exec-a"), `{"outcome":"SETTLED"}`, 400, []string{"outcome"}},
		{"post lower-case outcome", "POST", "/v1/payouts/p-claimed/post", postH("5", "exec-a"), `{"outcome":"paid","railReference":"RS-2"}`, 400, []string{"outcome"}},
		{"post PAID without railReference", "POST", "/v1/payouts/p-claimed/post", postH("5", "exec-a"), `{"outcome":"PAID"}`, 400, []string{"railReference"}},
		{"post PAID with null railReference", "POST", "/v1/payouts/p-claimed/post", postH("5", "exec-a"), `{"outcome":"PAID","railReference":null}`, 400, []string{"railReference"}},
		{"post PAID with declineReason", "POST", "/v1/payouts/p-claimed/post", postH("5", "exec-a"), `{"outcome":"PAID","railReference":"RS-2","declineReason":"x"}`, 400, []string{"declineReason"}},
		{"post empty railReference", "POST", "/v1/payouts/p-claimed/post", postH("5", "exec-a"), `{"outcome":"DECLINED","railReference":""}`, 400, []string{"railReference"}},
		{"post railReference with NUL", "POST", "/v1/payouts/p-claimed/post", postH("5", "exec-a"), `{"outcome":"PAID","railReference":"RS\u0000"}`, 400, []string{"railReference"}},
		{"post declineReason not a string", "POST", "/v1/payouts/p-claimed/post", postH("5", "exec-a"), `{"outcome":"DECLINED","declineReason":7}`, 400, []string{"declineReason"}},
		{"post unknown member", "POST", "/v1/payouts/p-claimed/post", postH("5", "exec-a"), `{"outcome":"DECLINED","amountMinor":1}`, 400, []string{"amountMinor"}},
		{"post headers and body both bad", "POST", "/v1/payouts/p-claimed/post", postH("05", "exec a"), `{"outcome":1}`, 400,
			[]string{lockapi.HeaderFencingToken, lockapi.HeaderOwnerID, "outcome"}},
		{"post bad body on a final payout", "POST", "/v1/payouts/p-paid/post", postH("5", "exec-a"), `{"outcome":"PAID"}`, 400, []string{"railReference"}},
		{"post bad body on a missing payout", "POST", "/v1/payouts/p-none/post", postH("5", "exec-a"), `{}`, 400, []string{"outcome"}},
		// list and get
		{"list limit zero", "GET", "/v1/payouts?limit=0", nil, "", 400, []string{"limit"}},
		{"list limit above 1000", "GET", "/v1/payouts?limit=1001", nil, "", 400, []string{"limit"}},
		{"list limit not a number", "GET", "/v1/payouts?limit=ten", nil, "", 400, []string{"limit"}},
		{"list limit with leading zero", "GET", "/v1/payouts?limit=010", nil, "", 400, []string{"limit"}},
		{"list unknown status", "GET", "/v1/payouts?status=DONE", nil, "", 400, []string{"status"}},
		{"list bad accountId", "GET", "/v1/payouts?accountId=a%20b", nil, "", 400, []string{"accountId"}},
		{"list bad updatedBefore", "GET", "/v1/payouts?updatedBefore=yesterday", nil, "", 400, []string{"updatedBefore"}},
		{"list repeated status", "GET", "/v1/payouts?status=PENDING&status=PAID", nil, "", 400, []string{"status"}},
		{"list empty status", "GET", "/v1/payouts?status=", nil, "", 400, []string{"status"}},
		{"list unknown parameter", "GET", "/v1/payouts?offset=5", nil, "", 400, []string{"offset"}},
		{"get bad id", "GET", "/v1/payouts/" + strings.Repeat("p", 65), nil, "", 400, []string{"payoutId"}},
	}
	before := e.snapshot(t)
	for _, tc := range cases {
		code, b := e.raw(t, tc.method, tc.path, tc.header, tc.body)
		if code != tc.status {
			t.Errorf("%s: status %d, want %d (%s)", tc.name, code, tc.status, b)
			continue
		}
		var prob struct {
			Status int    `json:"status"`
			Code   string `json:"code"`
			Errors []struct {
				Field   string `json:"field"`
				Problem string `json:"problem"`
			} `json:"errors"`
		}
		if err := json.Unmarshal(b, &prob); err != nil || prob.Code != lockapi.CodeInvalidRequest || prob.Status != code {
			t.Errorf("%s: body %s, want an INVALID_REQUEST problem with status %d", tc.name, b, code)
			continue
		}
		var fields []string
		for _, fe := range prob.Errors {
			if fe.Problem == "" {
				t.Errorf("%s: fault on %s has no problem sentence", tc.name, fe.Field)
			}
			fields = append(fields, fe.Field)
		}
		if strings.Join(fields, ",") != strings.Join(tc.fields, ",") {
			t.Errorf("%s: fields %v, want %v (%s)", tc.name, fields, tc.fields, b)
		}
	}
	if after := e.snapshot(t); after != before {
		t.Fatalf("bad inputs wrote:\nbefore %s\nafter  %s", before, after)
	}
	if got := e.metric(t, `lock_fenced_out_total{resource="payout"}`); got != 0 {
		t.Errorf("a bad input was counted as fenced")
	}
	if n := len(cases); n < 15 {
		t.Fatalf("only %d cases", n)
	}
}

// A claim takes no body: whatever body and Content-Type come with it are not looked at.
func TestClaimIgnoresBodyAndContentType(t *testing.T) {
	t.Parallel()
	e := start(t)
	e.create(t, "p-1", "acct-1", 100)
	code, b := e.raw(t, http.MethodPost, "/v1/payouts/p-1/claim",
		hdr{lockapi.HeaderFencingToken: {"3"}, lockapi.HeaderOwnerID: {"exec-a"}, "Content-Type": {"text/plain"}}, "not json")
	if code != http.StatusOK {
		t.Fatalf("claim with a stray body: %d %s", code, b)
	}
	if p := decodePayout(t, b); p.Status != lockapi.StatusClaimed || p.FenceToken != 3 {
		t.Fatalf("claim answer %+v", p)
	}
}
