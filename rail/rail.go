// Package rail is the seam between rail-proxy's gate and the language of a
// payment rail.
//
// The gate keeps everything that makes a payment safe to present to a rail that
// cannot compare tokens: the per-account high-water mark, the intent row
// committed before any socket opens, one connection per attempt, the connect and
// read bounds, no retry, and the rule that only a well-formed accept or decline
// resolves an attempt — anything else after the request may have been written is
// TIMEOUT, never retried (docs/contracts/rail-proxy.md). None of that is an
// adapter's to change, and an adapter cannot change it: it never opens a
// connection, never retries, and never sees the database.
//
// An Adapter only speaks the rail's language. It builds the one payment request
// of a submission, reads the rail's reply into exactly one Verdict, names the
// health request, and builds and reads statement pages. Two adapters are built
// in: lock.dev/rail/stubjson (rail-stub's JSON, RAIL_PROTOCOL=stub) and
// lock.dev/rail/iso20022 (pain.001, pain.002 and camt.053,
// RAIL_PROTOCOL=iso20022). A team with another rail writes its own Adapter,
// checks it with lock.dev/rail/railtest, and runs it in a rail-proxy binary of
// its own with lock.dev/rail/gate (docs/integrating-your-rail.md).
package rail

import "lock.dev/lockapi"

// Payment is one submission as the gate admitted it: what the rail is asked to
// pay, exactly once.
type Payment struct {
	// SubmissionID is the admitted attempt's rail_submission id: unique, and
	// the natural message id of a rail that asks for one.
	SubmissionID int64
	// PayoutID is the payout's id: the reference the rail must carry back in its
	// answer and its statement, by which the books find the payout again.
	PayoutID    string
	AccountID   string // the account paid from
	AmountMinor int64  // the amount in the currency's minor units
	Currency    string // ISO 4217 alphabetic code
	Beneficiary string // the account paid to, as the payout holds it
}

// Request is one HTTP request to the rail, built by an adapter and sent by the
// gate. The gate adds nothing to it but the Host and Content-Length headers.
type Request struct {
	Method string
	// Path is the request's path and query, appended to RAIL_BASE_URL
	// ("/rail/v1/payments", "/iso20022/camt.053?after=7&limit=100").
	Path        string
	ContentType string // empty: no body
	Accept      string // empty: no Accept header
	Body        []byte
}

// Reply is the rail's whole reply to a Request as the gate read it: the gate
// hands an adapter only a reply it read completely, within its bounds.
type Reply struct {
	Status      int
	ContentType string
	Body        []byte
}

// Verdict is what a payment reply says happened. Only Accepted and Declined
// resolve an attempt; the gate records the other two as TIMEOUT, and the payout
// is settled later from the rail's statement.
type Verdict int

const (
	// NotUnderstood: the reply is not a well-formed accept or decline of this
	// payment — it does not parse, names another payment, or carries a reference
	// or reason that is not plain text. The rail may have moved money: TIMEOUT,
	// cause bad_response. An adapter that is unsure answers this, never a guess.
	NotUnderstood Verdict = iota
	// Accepted: the rail took the payment for execution; money moved or will.
	// Answer.RailReference is set.
	Accepted
	// Declined: the rail refused the payment; no money moved.
	Declined
	// Pending: the rail has the payment and has not decided (ISO 20022's ACCP,
	// ACTC, RCVD, PDNG). TIMEOUT, cause pending: the statement settles it.
	Pending
)

// String is the verdict's name, as logs show it.
func (v Verdict) String() string {
	switch v {
	case Accepted:
		return "accepted"
	case Declined:
		return "declined"
	case Pending:
		return "pending"
	default:
		return "not_understood"
	}
}

// Answer is an adapter's reading of a payment reply.
type Answer struct {
	Verdict Verdict
	// RailReference is the rail's own reference of an accepted payment, as the
	// rail gave it (its statement carries the same one).
	RailReference string
	// DeclineReason is the rail's reason for a decline, as it gave it; empty
	// when it gave none (the gate then records "unspecified").
	DeclineReason string
	// Why says, for the log, what was read when the verdict is NotUnderstood or
	// Pending ("pain.002 status PDNG", "no EndToEndId p-7 in the report"). It
	// never carries the reply's body.
	Why string
}

// Adapter speaks one rail's language. Its methods are called concurrently and
// must not block: they build and read bytes, nothing else.
type Adapter interface {
	// Protocol is the adapter's name, as RAIL_PROTOCOL selects it and the
	// logs show it.
	Protocol() string
	// Refuse lists what makes p impossible to present in this language (a field
	// too long for the message, a currency it cannot express); none: nil. The
	// gate answers such a submission 400 INVALID_REQUEST naming the fields,
	// before anything is written.
	Refuse(p Payment) []lockapi.FieldError
	// PaymentRequest builds the one request presenting p. An error means p
	// cannot be presented at all; the gate then sends nothing (UNSENT).
	PaymentRequest(p Payment) (Request, error)
	// ReadAnswer reads the rail's reply to p's request into one verdict.
	ReadAnswer(p Payment, r Reply) Answer
	// HealthRequest is the readiness probe: the rail is up when it answers 2xx.
	HealthRequest() Request
	// StatementRequest asks for the statement's lines after seq after, at most
	// limit of them.
	StatementRequest(after int64, limit int) Request
	// ReadStatement reads the reply to StatementRequest(after, limit): the page's
	// lines in the rail's order, or an error when any part of the page is not
	// understood — a page is read whole or not at all. The gate checks on top
	// that seqs increase from after, that no more than limit lines came, and that
	// each line has its reference, account, currency and beneficiary.
	ReadStatement(r Reply, after int64, limit int) ([]lockapi.StatementLine, error)
}
