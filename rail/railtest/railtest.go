// Package railtest is the conformance suite every rail adapter runs: the
// properties the gate relies on whatever language the rail speaks. An adapter
// that fails it is not safe to put behind the gate.
//
// The suite feeds the adapter a well-behaved rail's replies, written by the
// adapter's Harness, and corrupted copies of them: a decline is never taken for
// an accept, an unparsable or truncated 200 resolves nothing, an accept under
// any status but 200 is not accepted, an answer naming another payment is not
// understood, a reference or reason holding a control character is not
// understood, a statement page is read whole — field for field, or an error —
// and the health and statement requests are GETs.
package railtest

import (
	"testing"

	"lock.dev/lockapi"
	"lock.dev/rail"
)

// Harness writes the replies of a well-behaved rail in the adapter's language,
// so that the suite can feed them — and corrupted copies of them — to the
// adapter. It writes what it is given byte for byte: a reference with a NUL or a
// control character goes into the reply as it is, not escaped or replaced.
type Harness interface {
	// Accept is the rail's reply accepting p under railReference.
	Accept(p rail.Payment, railReference string) rail.Reply
	// Decline is the rail's reply declining p for reason ("" : no reason given).
	Decline(p rail.Payment, reason string) rail.Reply
	// Pending is the rail's reply saying it has p and has not decided; ok false
	// when the language has no such answer.
	Pending(p rail.Payment) (r rail.Reply, ok bool)
	// Statement is the rail's reply to StatementRequest(after, limit) listing
	// lines, in order. A language whose statement lists only what moved
	// (ISO 20022's camt.053) is given ACCEPTED lines only.
	Statement(lines []lockapi.StatementLine, after int64, limit int) rail.Reply
	// DeclinesInStatement: whether the language's statement lists declined
	// calls (rail-stub's does; a bank statement does not).
	DeclinesInStatement() bool
}

// Failure is one property the adapter broke.
type Failure struct {
	Check string // the property, as the suite names it
	What  string // what the adapter did instead
}

// Run runs every check of the suite against a, one subtest per check (named as
// Failure.Check), failing the subtest for each breach of its property.
func Run(t *testing.T, a rail.Adapter, h Harness) {
	t.Helper()
	for _, c := range suite() {
		t.Run(c.name, func(t *testing.T) {
			for _, what := range runCheck(c, a, h) {
				t.Errorf("%s", what)
			}
		})
	}
}

// Check runs the suite and returns every failure; none: the adapter conforms.
func Check(a rail.Adapter, h Harness) []Failure {
	return check(a, h)
}
