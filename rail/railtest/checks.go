package railtest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"lock.dev/lockapi"
	"lock.dev/rail"
)

// The suite's checks, each a property the gate relies on, named as Failure.Check
// and the subtests of Run name them. A check returns what the adapter did
// instead, one line per breach; none: the property holds.
type namedCheck struct {
	name string
	run  func(a rail.Adapter, h Harness) []string
}

func suite() []namedCheck {
	return []namedCheck{
		{"accept", checkAccept},
		{"accept-without-reference", checkAcceptWithoutReference},
		{"decline", checkDecline},
		{"pending", checkPending},
		{"garbage-200", checkGarbage},
		{"truncated-accept", checkTruncatedAccept},
		{"truncated-decline", checkTruncatedDecline},
		{"accept-under-other-status", checkAcceptUnderOtherStatus},
		{"decline-under-5xx", checkDeclineUnder5xx},
		{"answer-for-another-payment", checkAnotherPayment},
		{"reference-control-characters", checkReferenceControls},
		{"reason-control-characters", checkReasonControls},
		{"payment-request", checkPaymentRequest},
		{"health-request", checkHealthRequest},
		{"statement-request", checkStatementRequest},
		{"statement-page", checkStatementPage},
		{"statement-empty-page", checkStatementEmpty},
		{"statement-truncated", checkStatementTruncated},
		{"statement-line-without-reference", checkStatementWithoutReference},
		{"statement-under-other-status", checkStatementStatus},
	}
}

// check runs every check of the suite.
func check(a rail.Adapter, h Harness) []Failure {
	var fs []Failure
	for _, c := range suite() {
		for _, what := range runCheck(c, a, h) {
			fs = append(fs, Failure{Check: c.name, What: what})
		}
	}
	return fs
}

// runCheck runs one check; an adapter that panics breaks it (the gate calls
// adapters on its submission path).
func runCheck(c namedCheck, a rail.Adapter, h Harness) (whats []string) {
	defer func() {
		if r := recover(); r != nil {
			whats = append(whats, fmt.Sprintf("panicked: %v", r))
		}
	}()
	return c.run(a, h)
}

// The payments the checks present: ordinary ones, which every rail can take.
var (
	payment = rail.Payment{SubmissionID: 470011, PayoutID: "p-1001", AccountID: "acct-7", AmountMinor: 125000,
		Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}
	another = rail.Payment{SubmissionID: 470012, PayoutID: "p-2002", AccountID: "acct-7", AmountMinor: 125000,
		Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}
)

// declineCode is the reason the checks decline with: four characters, which
// every language can carry (ISO 20022's reason codes are at most four).
const declineCode = "AM04"

// read hands the adapter a copy of r, which it scribbles over once the call
// returned: an adapter keeps nothing of a reply's body without copying it.
func read(a rail.Adapter, p rail.Payment, r rail.Reply) rail.Answer {
	r.Body = bytes.Clone(r.Body)
	ans := a.ReadAnswer(p, r)
	for i := range r.Body {
		r.Body[i] = 'X'
	}
	return ans
}

func show(ans rail.Answer) string {
	return fmt.Sprintf("%s (railReference %q, declineReason %q, why %q)", ans.Verdict, ans.RailReference, ans.DeclineReason, ans.Why)
}

func resolves(v rail.Verdict) bool { return v == rail.Accepted || v == rail.Declined }

// checkAccept: the rail's accept is Accepted, with the reference the rail gave,
// kept when the reply's bytes are gone.
func checkAccept(a rail.Adapter, h Harness) []string {
	var out []string
	for _, ref := range []string{"RS-7Q2K", "RS-" + strings.Repeat("Z9", 16), "RS 1 é"} {
		ans := read(a, payment, h.Accept(payment, ref))
		if ans.Verdict != rail.Accepted || ans.RailReference != ref {
			out = append(out, fmt.Sprintf("the rail's accept under reference %q was read as %s; want accepted with that reference", ref, show(ans)))
		}
	}
	return out
}

// checkAcceptWithoutReference: an accept without the rail's reference is not
// Accepted — the books find a payment on the statement by it.
func checkAcceptWithoutReference(a rail.Adapter, h Harness) []string {
	if ans := read(a, payment, h.Accept(payment, "")); ans.Verdict == rail.Accepted {
		return []string{"an accept without a reference was read as " + show(ans)}
	}
	return nil
}

// checkDecline: a decline is Declined, never Accepted, with its reason when it
// gave one.
func checkDecline(a rail.Adapter, h Harness) []string {
	var out []string
	if ans := read(a, payment, h.Decline(payment, declineCode)); ans.Verdict != rail.Declined || ans.DeclineReason != declineCode {
		out = append(out, fmt.Sprintf("a decline for reason %q was read as %s; want declined with that reason", declineCode, show(ans)))
	}
	if ans := read(a, payment, h.Decline(payment, "")); ans.Verdict != rail.Declined {
		out = append(out, "a decline without a reason was read as "+show(ans)+"; want declined")
	}
	return out
}

// checkPending: a "received, not decided" answer resolves nothing.
func checkPending(a rail.Adapter, h Harness) []string {
	r, ok := h.Pending(payment)
	if !ok {
		return nil
	}
	if ans := read(a, payment, r); resolves(ans.Verdict) {
		return []string{"a pending answer was read as " + show(ans) + "; it must resolve nothing"}
	}
	return nil
}

// checkGarbage: a 200 whose body is no answer at all resolves nothing.
func checkGarbage(a rail.Adapter, h Harness) []string {
	ct := h.Accept(payment, "RS-1").ContentType
	bodies := [][]byte{nil, []byte(" "), []byte("null"), []byte("{}"), []byte("[]"), []byte("0"), []byte(`""`),
		[]byte("not a reply"), []byte("<"), []byte(`<?xml version="1.0" encoding="UTF-8"?>`), []byte("<Document/>"),
		[]byte("\x00\x00\x00\x00"), []byte(`{"status":"ACCEPTED"}`), []byte(`{"status":"ACCEPTED","railReference":""}`),
		[]byte(`{"status":"ACCEPTED","railReference":null}`), []byte("ACCEPTED RS-1"), []byte("\xef\xbb\xbf")}
	rng := rand.New(rand.NewPCG(10, 20))
	for range 64 {
		b := make([]byte, rng.IntN(200))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		bodies = append(bodies, b)
	}
	var out []string
	for _, b := range bodies {
		if ans := read(a, payment, rail.Reply{Status: http.StatusOK, ContentType: ct, Body: b}); resolves(ans.Verdict) {
			out = append(out, fmt.Sprintf("200 %q was read as %s", b, show(ans)))
		}
	}
	return out
}

// checkTruncatedAccept: an accept cut short at any length is no answer.
func checkTruncatedAccept(a rail.Adapter, h Harness) []string {
	return truncations(a, h.Accept(payment, "RS-7Q2K"), "accept")
}

// checkTruncatedDecline: a decline cut short at any length is no answer.
func checkTruncatedDecline(a rail.Adapter, h Harness) []string {
	return truncations(a, h.Decline(payment, declineCode), "decline")
}

func truncations(a rail.Adapter, r rail.Reply, what string) []string {
	var out []string
	whole := trimmed(r.Body)
	for _, n := range cuts(len(whole)) {
		cut := r
		cut.Body = whole[:n]
		if ans := read(a, payment, cut); resolves(ans.Verdict) {
			out = append(out, fmt.Sprintf("the %s cut to its first %d of %d bytes (%d %q) was read as %s", what, n, len(whole), r.Status, cut.Body, show(ans)))
		}
	}
	return out
}

// trimmed is b without its trailing white space: a reply cut there is still
// the whole reply.
func trimmed(b []byte) []byte { return bytes.TrimRight(b, " \t\r\n") }

// cuts are the lengths a body of n bytes is cut to: every one for a short
// body, for a long one its first and last 256 and a sample between.
func cuts(n int) []int {
	if n <= 1024 {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	var out []int
	for i := range 256 {
		out = append(out, i)
	}
	for i := 1; i < 128; i++ {
		out = append(out, 256+(n-512)*i/128)
	}
	for i := n - 256; i < n; i++ {
		out = append(out, i)
	}
	return out
}

// otherStatuses are statuses other than 200 a reply could come with.
var otherStatuses = []int{201, 202, 203, 204, 206, 301, 302, 304, 307, 308, 400, 401, 403, 404, 409, 410, 422, 429, 500, 502, 503, 504}

// checkAcceptUnderOtherStatus: an accept body under any status but 200 is not
// Accepted — a proxy's error page, a redirect, a failed server may carry
// anything.
func checkAcceptUnderOtherStatus(a rail.Adapter, h Harness) []string {
	var out []string
	r := h.Accept(payment, "RS-7Q2K")
	for _, st := range otherStatuses {
		r.Status = st
		if ans := read(a, payment, r); ans.Verdict == rail.Accepted {
			out = append(out, fmt.Sprintf("the accept body under status %d was read as %s", st, show(ans)))
		}
	}
	return out
}

// checkDeclineUnder5xx: a decline body under a server error resolves nothing:
// the server failed, and whether the payment moved is unknown.
func checkDeclineUnder5xx(a rail.Adapter, h Harness) []string {
	var out []string
	r := h.Decline(payment, declineCode)
	for _, st := range []int{500, 502, 503, 504} {
		r.Status = st
		if ans := read(a, payment, r); resolves(ans.Verdict) {
			out = append(out, fmt.Sprintf("the decline body under status %d was read as %s", st, show(ans)))
		}
	}
	return out
}

// checkAnotherPayment: an answer naming another payment answers nothing about
// this one. A language whose answers do not name the payment (rail-stub's: the
// connection does) writes the same bytes for both, and has nothing to check.
func checkAnotherPayment(a rail.Adapter, h Harness) []string {
	var out []string
	mine, theirs := h.Accept(payment, "RS-7Q2K"), h.Accept(another, "RS-7Q2K")
	if !sameReply(mine, theirs) {
		if ans := read(a, payment, theirs); ans.Verdict != rail.NotUnderstood {
			out = append(out, fmt.Sprintf("an accept of payout %s was read, for payout %s, as %s; want not understood", another.PayoutID, payment.PayoutID, show(ans)))
		}
		if ans := read(a, another, mine); ans.Verdict != rail.NotUnderstood {
			out = append(out, fmt.Sprintf("an accept of payout %s was read, for payout %s, as %s; want not understood", payment.PayoutID, another.PayoutID, show(ans)))
		}
	}
	mine, theirs = h.Decline(payment, declineCode), h.Decline(another, declineCode)
	if !sameReply(mine, theirs) {
		if ans := read(a, payment, theirs); resolves(ans.Verdict) {
			out = append(out, fmt.Sprintf("a decline of payout %s was read, for payout %s, as %s", another.PayoutID, payment.PayoutID, show(ans)))
		}
	}
	return out
}

func sameReply(a, b rail.Reply) bool {
	return a.Status == b.Status && a.ContentType == b.ContentType && bytes.Equal(a.Body, b.Body)
}

// controls are characters paydb will not store as a rail's word and a person
// could not read back: NUL, a C0 control, DEL and a line break.
var controls = []struct{ name, s string }{{"NUL", "\x00"}, {"SOH", "\x01"}, {"DEL", "\x7f"}, {"newline", "\n"}}

// checkReferenceControls: an accept whose reference carries a control
// character is not understood — never recorded as something it did not say.
func checkReferenceControls(a rail.Adapter, h Harness) []string {
	var out []string
	for _, c := range controls {
		ref := "RS-" + c.s + "1"
		if ans := read(a, payment, h.Accept(payment, ref)); ans.Verdict != rail.NotUnderstood {
			out = append(out, fmt.Sprintf("an accept whose reference holds %s (%q) was read as %s; want not understood", c.name, ref, show(ans)))
		}
	}
	return out
}

// checkReasonControls: the same for a decline's reason.
func checkReasonControls(a rail.Adapter, h Harness) []string {
	var out []string
	for _, c := range controls {
		reason := "A" + c.s + "M4"
		if ans := read(a, payment, h.Decline(payment, reason)); ans.Verdict != rail.NotUnderstood {
			out = append(out, fmt.Sprintf("a decline whose reason holds %s (%q) was read as %s; want not understood", c.name, reason, show(ans)))
		}
	}
	return out
}

// checkPaymentRequest: an ordinary payment is presentable, as one POST (or
// PUT) whose body carries the payout id, the same request however often it is
// built, and whatever it carries of the submission id is that submission's.
func checkPaymentRequest(a rail.Adapter, _ Harness) []string {
	var out []string
	if errs := a.Refuse(payment); len(errs) > 0 {
		out = append(out, fmt.Sprintf("the ordinary payment %+v is refused: %v", payment, errs))
	}
	req, err := a.PaymentRequest(payment)
	if err != nil {
		return append(out, fmt.Sprintf("PaymentRequest(%+v): %v", payment, err))
	}
	switch {
	case req.Method != http.MethodPost && req.Method != http.MethodPut:
		out = append(out, fmt.Sprintf("the payment request's method is %q; want POST (or PUT)", req.Method))
	case !strings.HasPrefix(req.Path, "/"):
		out = append(out, fmt.Sprintf("the payment request's path %q does not start with /", req.Path))
	case !bytes.Contains(req.Body, []byte(payment.PayoutID)):
		out = append(out, fmt.Sprintf("the payment request's body does not carry the payout id %s: %q", payment.PayoutID, req.Body))
	case req.ContentType == "":
		out = append(out, "the payment request has a body and no content type")
	}
	again, err := a.PaymentRequest(payment)
	if err != nil || again.Method != req.Method || again.Path != req.Path || again.ContentType != req.ContentType ||
		again.Accept != req.Accept || !bytes.Contains(again.Body, []byte(payment.PayoutID)) {
		out = append(out, fmt.Sprintf("the payment request built twice differs: %s %s then %s %s (%v)", req.Method, req.Path, again.Method, again.Path, err))
	}
	other, err := a.PaymentRequest(another)
	switch {
	case err != nil:
		out = append(out, fmt.Sprintf("PaymentRequest(%+v): %v", another, err))
	case !bytes.Contains(other.Body, []byte(another.PayoutID)) || bytes.Contains(other.Body, []byte(payment.PayoutID)):
		out = append(out, fmt.Sprintf("the request for payout %s does not carry its payout id alone: %q", another.PayoutID, other.Body))
	case bytes.Contains(req.Body, []byte(strconv.FormatInt(payment.SubmissionID, 10))) &&
		(!bytes.Contains(other.Body, []byte(strconv.FormatInt(another.SubmissionID, 10))) ||
			bytes.Contains(other.Body, []byte(strconv.FormatInt(payment.SubmissionID, 10)))):
		out = append(out, fmt.Sprintf("the request of submission %d carries another's id: %q", another.SubmissionID, other.Body))
	}
	return out
}

// checkHealthRequest: the readiness probe is a GET, which moves no money.
func checkHealthRequest(a rail.Adapter, _ Harness) []string {
	r := a.HealthRequest()
	if r.Method != http.MethodGet || !strings.HasPrefix(r.Path, "/") || len(r.Body) > 0 {
		return []string{fmt.Sprintf("the health request is %s %q with a %d-byte body; want a GET of a path, no body", r.Method, r.Path, len(r.Body))}
	}
	return nil
}

// checkStatementRequest: a statement page is a GET carrying after and limit.
func checkStatementRequest(a rail.Adapter, _ Harness) []string {
	r := a.StatementRequest(90817, 523)
	var out []string
	if r.Method != http.MethodGet || !strings.HasPrefix(r.Path, "/") || len(r.Body) > 0 {
		out = append(out, fmt.Sprintf("the statement request is %s %q with a %d-byte body; want a GET of a path, no body", r.Method, r.Path, len(r.Body)))
	}
	if !strings.Contains(r.Path, "90817") || !strings.Contains(r.Path, "523") {
		out = append(out, fmt.Sprintf("the statement request for lines after 90817, at most 523, is %q: it does not carry both", r.Path))
	}
	if r.Path == a.StatementRequest(90818, 523).Path || r.Path == a.StatementRequest(90817, 524).Path {
		out = append(out, "the statement request does not change with after or limit")
	}
	return out
}

// statementAfter and statementLimit are the page the statement checks read.
const (
	statementAfter = 40
	statementLimit = 10
)

// statementLines are a page's lines, declines included when the language's
// statement lists them.
func statementLines(h Harness) []lockapi.StatementLine {
	at := time.Date(2026, 3, 4, 10, 11, 12, 0, time.UTC)
	ref := func(s string) *string { return &s }
	lines := []lockapi.StatementLine{
		{Seq: 41, ReceivedAt: at, Reference: "p-1001", AccountID: "acct-7", AmountMinor: 125000, Currency: "EUR",
			Beneficiary: "NL91ABNA0417164300", Result: lockapi.ResultAccepted, RailReference: ref("RS-A1")},
		{Seq: 42, ReceivedAt: at.Add(time.Minute), Reference: "p-1002", AccountID: "acct-7", AmountMinor: 700, Currency: "EUR",
			Beneficiary: "DE89370400440532013000", Result: lockapi.ResultDeclined, DeclineReason: ref(declineCode)},
		{Seq: 45, ReceivedAt: at.Add(2 * time.Minute), Reference: "p-1003", AccountID: "acct-7", AmountMinor: 1, Currency: "EUR",
			Beneficiary: "DE89370400440532013000", Result: lockapi.ResultAccepted, RailReference: ref("RS-B7")},
		{Seq: 46, ReceivedAt: at.Add(3 * time.Minute), Reference: "p-1004", AccountID: "acct-7", AmountMinor: 99999999, Currency: "EUR",
			Beneficiary: "acct-other-9", Result: lockapi.ResultAccepted, RailReference: ref("RS-C3")},
	}
	if !h.DeclinesInStatement() {
		lines = append(lines[:1], lines[2:]...)
	}
	return lines
}

// readStatement hands the adapter a copy of r, which it scribbles over once
// the call returned.
func readStatement(a rail.Adapter, r rail.Reply, after int64, limit int) ([]lockapi.StatementLine, error) {
	r.Body = bytes.Clone(r.Body)
	lines, err := a.ReadStatement(r, after, limit)
	for i := range r.Body {
		r.Body[i] = 'X'
	}
	return lines, err
}

// checkStatementPage: a page is read whole, field for field, in order.
func checkStatementPage(a rail.Adapter, h Harness) []string {
	want := statementLines(h)
	got, err := readStatement(a, h.Statement(want, statementAfter, statementLimit), statementAfter, statementLimit)
	if err != nil {
		return []string{fmt.Sprintf("a page of %d lines: %v", len(want), err)}
	}
	if len(got) != len(want) {
		return []string{fmt.Sprintf("a page of %d lines was read as %d: %+v", len(want), len(got), got)}
	}
	var out []string
	for i := range want {
		if d := lineDiff(got[i], want[i]); d != "" {
			out = append(out, fmt.Sprintf("line %d: %s", i, d))
		}
	}
	return out
}

// lineDiff says how got differs from want; "": not at all.
func lineDiff(got, want lockapi.StatementLine) string {
	var d []string
	field := func(name string, g, w any) {
		if g != w {
			d = append(d, fmt.Sprintf("%s %v, want %v", name, g, w))
		}
	}
	field("seq", got.Seq, want.Seq)
	if !got.ReceivedAt.Equal(want.ReceivedAt) {
		d = append(d, fmt.Sprintf("receivedAt %s, want %s", got.ReceivedAt, want.ReceivedAt))
	}
	field("reference", got.Reference, want.Reference)
	field("accountId", got.AccountID, want.AccountID)
	field("amountMinor", got.AmountMinor, want.AmountMinor)
	field("currency", got.Currency, want.Currency)
	field("beneficiary", got.Beneficiary, want.Beneficiary)
	field("result", got.Result, want.Result)
	field("railReference", deref(got.RailReference), deref(want.RailReference))
	field("declineReason", deref(got.DeclineReason), deref(want.DeclineReason))
	return strings.Join(d, "; ")
}

func deref(s *string) string {
	if s == nil {
		return "<null>"
	}
	return strconv.Quote(*s)
}

// checkStatementEmpty: a page with no lines is read as none, without error.
func checkStatementEmpty(a rail.Adapter, h Harness) []string {
	got, err := readStatement(a, h.Statement(nil, statementAfter, statementLimit), statementAfter, statementLimit)
	if err != nil || len(got) != 0 {
		return []string{fmt.Sprintf("an empty page was read as %d lines, error %v", len(got), err)}
	}
	return nil
}

// checkStatementTruncated: a page cut short at any length is an error, never
// fewer lines: a reconciler must not take a statement it had to guess at.
func checkStatementTruncated(a rail.Adapter, h Harness) []string {
	var out []string
	for _, lines := range [][]lockapi.StatementLine{statementLines(h), nil} {
		r := h.Statement(lines, statementAfter, statementLimit)
		whole := trimmed(r.Body)
		for _, n := range cuts(len(whole)) {
			cut := r
			cut.Body = whole[:n]
			if got, err := readStatement(a, cut, statementAfter, statementLimit); err == nil {
				out = append(out, fmt.Sprintf("a page of %d lines cut to its first %d of %d bytes was read as %d lines", len(lines), n, len(whole), len(got)))
			}
		}
	}
	return out
}

// checkStatementWithoutReference: a page one of whose lines lacks its
// reference is an error: the line could not be matched to a payout.
func checkStatementWithoutReference(a rail.Adapter, h Harness) []string {
	lines := statementLines(h)
	lines[1].Reference = ""
	if got, err := readStatement(a, h.Statement(lines, statementAfter, statementLimit), statementAfter, statementLimit); err == nil {
		return []string{fmt.Sprintf("a page whose line %d lacks its reference was read as %d lines", 1, len(got))}
	}
	return nil
}

// checkStatementStatus: a page under a status other than 200 is an error.
func checkStatementStatus(a rail.Adapter, h Harness) []string {
	var out []string
	r := h.Statement(statementLines(h), statementAfter, statementLimit)
	for _, st := range []int{204, 301, 404, 500, 503} {
		r.Status = st
		if got, err := readStatement(a, r, statementAfter, statementLimit); err == nil {
			out = append(out, fmt.Sprintf("a page under status %d was read as %d lines", st, len(got)))
		}
	}
	return out
}
