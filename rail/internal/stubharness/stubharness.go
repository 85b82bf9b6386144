// Package stubharness writes rail-stub's replies (docs/contracts/rail-stub.md)
// for the conformance suite (lock.dev/rail/railtest): the harness of the
// stubjson adapter's own test and of the suite's test that broken adapters
// fail it.
package stubharness

import (
	"encoding/json"
	"net/http"
	"strings"

	"lock.dev/lockapi"
	"lock.dev/rail"
)

// Harness is rail-stub as a railtest.Harness.
type Harness struct{}

// text is s as a JSON string, written byte for byte as the harness promises:
// only the quote and the backslash are escaped, so that the string still ends
// where it should; a control character goes in as it is.
func text(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

func reply(status int, body string) rail.Reply {
	// rail-stub writes its answers with a JSON encoder: a line each.
	return rail.Reply{Status: status, ContentType: "application/json", Body: []byte(body + "\n")}
}

// Accept is 200 {"status":"ACCEPTED","railReference":…}: rail-stub's accept does
// not name the payment.
func (Harness) Accept(_ rail.Payment, railReference string) rail.Reply {
	return reply(http.StatusOK, `{"status":"ACCEPTED","railReference":`+text(railReference)+`}`)
}

// Decline is 422 {"status":"DECLINED","reason":…}, without reason when none.
func (Harness) Decline(_ rail.Payment, reason string) rail.Reply {
	if reason == "" {
		return reply(http.StatusUnprocessableEntity, `{"status":"DECLINED"}`)
	}
	return reply(http.StatusUnprocessableEntity, `{"status":"DECLINED","reason":`+text(reason)+`}`)
}

// Pending: rail-stub decides at once.
func (Harness) Pending(rail.Payment) (rail.Reply, bool) { return rail.Reply{}, false }

// Statement is GET /rail/v1/calls's page: {"calls":[…]}, each line as the call
// rail-stub books (a decline's reason as reason).
func (Harness) Statement(lines []lockapi.StatementLine, _ int64, _ int) rail.Reply {
	calls := make([]lockapi.RailCall, 0, len(lines))
	for _, l := range lines {
		calls = append(calls, lockapi.RailCall{Seq: l.Seq, ReceivedAt: l.ReceivedAt, Reference: l.Reference, AccountID: l.AccountID,
			AmountMinor: l.AmountMinor, Currency: l.Currency, Beneficiary: l.Beneficiary, Result: l.Result,
			RailReference: l.RailReference, Reason: l.DeclineReason})
	}
	b, err := json.Marshal(struct {
		Calls []lockapi.RailCall `json:"calls"`
	}{calls})
	if err != nil {
		panic(err) // a RailCall always encodes
	}
	return reply(http.StatusOK, string(b))
}

// DeclinesInStatement: rail-stub's call log lists every call.
func (Harness) DeclinesInStatement() bool { return true }
