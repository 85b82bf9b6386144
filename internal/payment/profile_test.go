package payment_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"lock.dev/internal/payment"
	"lock.dev/lockapi"
)

// profileCases are payouts the API's own rules allow and the ISO 20022 rail could
// never present (docs/contracts/payments.md, PAYMENT_RAIL_PROFILE), with the
// fields the refusal must name.
var profileCases = []struct {
	name   string
	req    lockapi.SubmissionRequest
	fields []string
}{
	{"payoutId over 35", profileReq(func(r *lockapi.SubmissionRequest) { r.PayoutID = "p-" + strings.Repeat("7", 34) }), []string{"payoutId"}},
	{"accountId over 34", profileReq(func(r *lockapi.SubmissionRequest) { r.AccountID = "acct-" + strings.Repeat("1", 30) }), []string{"accountId"}},
	{"beneficiary over 34", profileReq(func(r *lockapi.SubmissionRequest) { r.Beneficiary = "NL91 ABNA 0417 1643 0000 0000 0000 0" }), []string{"beneficiary"}},
	// Characters, not bytes: 34 characters of two bytes each fit.
	{"beneficiary of 35 characters", profileReq(func(r *lockapi.SubmissionRequest) { r.Beneficiary = strings.Repeat("é", 35) }), []string{"beneficiary"}},
	{"gold", profileReq(func(r *lockapi.SubmissionRequest) { r.Currency = "XAU" }), []string{"currency"}},
	{"special drawing rights", profileReq(func(r *lockapi.SubmissionRequest) { r.Currency = "XDR" }), []string{"currency"}},
	{"all four", profileReq(func(r *lockapi.SubmissionRequest) {
		r.PayoutID, r.AccountID, r.Beneficiary, r.Currency = strings.Repeat("p", 36), strings.Repeat("a", 35), strings.Repeat("B", 35), "XXX"
	}), []string{"payoutId", "accountId", "currency", "beneficiary"}},
}

func profileReq(change func(*lockapi.SubmissionRequest)) lockapi.SubmissionRequest {
	r := lockapi.SubmissionRequest{PayoutID: "p-iso-1", AccountID: "acct-1", AmountMinor: 1395, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}
	change(&r)
	return r
}

// With PAYMENT_RAIL_PROFILE=iso20022 a payout the ISO 20022 rail could never
// present is refused at creation, 400 INVALID_REQUEST naming each field it
// breaks, and nothing is written; what fits exactly (35, 34, 34 characters, a
// currency with no decimals) is created.
func TestISO20022ProfileRefusesWhatTheRailCannotTake(t *testing.T) {
	t.Parallel()
	e := start(t, func(c *payment.Config) { c.RailProfile = payment.ProfileISO20022 })
	e.create(t, "p-before", "acct-1", 100) // a row the refusals must leave as it is
	before := e.snapshot(t)
	for _, tc := range profileCases {
		body, err := json.Marshal(tc.req)
		if err != nil {
			t.Fatal(err)
		}
		code, b := e.raw(t, http.MethodPost, "/v1/payouts", map[string][]string{"Content-Type": {"application/json"}}, string(body))
		if code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", tc.name, code, b)
			continue
		}
		var p struct {
			Code   string               `json:"code"`
			Errors []lockapi.FieldError `json:"errors"`
		}
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatalf("%s: %v in %s", tc.name, err, b)
		}
		var named []string
		for _, fe := range p.Errors {
			named = append(named, fe.Field)
			if !strings.Contains(fe.Problem, "ISO 20022") {
				t.Errorf("%s: %s's problem %q does not say the ISO 20022 rail refuses it", tc.name, fe.Field, fe.Problem)
			}
		}
		slices.Sort(named)
		want := slices.Sorted(slices.Values(tc.fields))
		if p.Code != lockapi.CodeInvalidRequest || !slices.Equal(named, want) {
			t.Errorf("%s: %s naming %v, want INVALID_REQUEST naming %v", tc.name, p.Code, named, want)
		}
	}
	if after := e.snapshot(t); after != before {
		t.Fatalf("a refused create wrote:\nbefore %s\nafter  %s", before, after)
	}

	fits := lockapi.SubmissionRequest{PayoutID: strings.Repeat("p", 35), AccountID: strings.Repeat("a", 34), AmountMinor: 1395,
		Currency: "JPY", Beneficiary: strings.Repeat("é", 34)}
	if p, err := e.creator.Create(t.Context(), fits); err != nil || p.Status != lockapi.StatusPending {
		t.Fatalf("a payout that fits exactly: %+v, %v", p, err)
	}
}

// The stub profile (the default) takes every one of those payouts: rail-stub's
// JSON presents them all.
func TestStubProfileTakesThem(t *testing.T) {
	t.Parallel()
	e := start(t)
	for i, tc := range profileCases {
		req := tc.req
		if len(req.PayoutID) < 30 {
			req.PayoutID += "-" + string(rune('a'+i)) // each its own payout
		}
		if p, err := e.creator.Create(t.Context(), req); err != nil || p.PayoutID != req.PayoutID {
			t.Errorf("%s with the stub profile: %+v, %v", tc.name, p, err)
		}
	}
	if n := e.queryInt(t, "SELECT count(*) FROM payout"); n != int64(len(profileCases)) {
		t.Fatalf("%d payouts stored, want %d", n, len(profileCases))
	}
}
