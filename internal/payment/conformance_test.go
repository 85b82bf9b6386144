package payment_test

import (
	"net/http"
	"strings"
	"testing"

	"lock.dev/api"
	"lock.dev/internal/apitest"
	"lock.dev/internal/payment"
	"lock.dev/lockapi"
)

// conformance checks every exchange of the tests with a payment-resource
// against api/payment-resource.json (start tracks each server, and TestMain
// wraps the tests' clients; a finding fails the test that made the exchange)
// and collects which documented answers were seen. TestMain then fails the run
// on any documented answer no test provoked, less these exemptions.
var conformance = apitest.MustNew(api.PaymentResource)

var exempt = apitest.ServeEndpoints500()

const conformanceSettleToken = "conformance-settle-token-0123456789"

// The answers the behavioural tests have no reason to give: the aliases
// (docs/contracts/observability.md), the document itself, 503 UNAVAILABLE of the
// list and of settle while paydb refuses connections, and the 500 INTERNAL of every
// payout call, provoked by taking paydb's payout table away from a running server
// (an error PostgreSQL reports that is not unavailability).
func TestConformanceRareAnswers(t *testing.T) {
	t.Parallel()
	e := start(t, func(c *payment.Config) { c.SettleToken = conformanceSettleToken })
	e.create(t, "p-1", "acct-1", 10)
	settle := map[string][]string{"Content-Type": {"application/json"}, "Authorization": {"Bearer " + conformanceSettleToken}}
	const settleBody = `{"outcome":"NOT_PRESENTED"}`
	want := func(what string, got, status int, body []byte, code string) {
		t.Helper()
		if got != status || (code != "" && !strings.Contains(string(body), `"code":"`+code+`"`)) {
			t.Errorf("%s: %d %s, want %d %s", what, got, body, status, code)
		}
	}
	for _, p := range []string{"/actuator/health/liveness", "/actuator/health/readiness", "/actuator/health", "/openapi.json"} {
		status, b := e.raw(t, http.MethodGet, p, nil, "")
		want("GET "+p, status, http.StatusOK, b, "")
	}

	// paydb refuses connections.
	restore := refusePaydb(t, e)
	for _, p := range []string{"/actuator/health/readiness", "/actuator/health"} {
		status, b := e.raw(t, http.MethodGet, p, nil, "")
		want("GET "+p+" with paydb away", status, http.StatusServiceUnavailable, b, "")
	}
	status, b := e.raw(t, http.MethodGet, "/v1/payouts", nil, "")
	want("list with paydb away", status, http.StatusServiceUnavailable, b, lockapi.CodeUnavailable)
	status, b = e.raw(t, http.MethodPost, "/v1/payouts/p-1/settle", settle, settleBody)
	want("settle with paydb away", status, http.StatusServiceUnavailable, b, lockapi.CodeUnavailable)
	restore()

	// paydb answers, but the payout table is gone.
	e.exec(t, "ALTER TABLE payout RENAME TO payout_gone")
	for _, c := range []struct{ what, method, path, body string }{
		{"create", http.MethodPost, "/v1/payouts", `{"payoutId":"p-2","accountId":"acct-1","amountMinor":10,"currency":"EUR","beneficiary":"B-1"}`},
		{"list", http.MethodGet, "/v1/payouts", ""},
		{"get", http.MethodGet, "/v1/payouts/p-1", ""},
		{"claim", http.MethodPost, "/v1/payouts/p-1/claim", ""},
		{"settle", http.MethodPost, "/v1/payouts/p-1/settle", settleBody},
	} {
		h := map[string][]string{lockapi.HeaderFencingToken: {"1"}, lockapi.HeaderOwnerID: {"exec-a"}}
		if c.what == "settle" {
			h = settle
		} else if c.body != "" {
			h["Content-Type"] = []string{"application/json"}
		}
		status, b := e.raw(t, c.method, c.path, h, c.body)
		want(c.what+" without the payout table", status, http.StatusInternalServerError, b, lockapi.CodeInternal)
	}
}
