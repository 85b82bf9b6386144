// Package iso20022 is the rail adapter for a bank that speaks ISO 20022
// (RAIL_PROTOCOL=iso20022; docs/contracts/iso20022.md):
//
//   - a payment is POST /iso20022/pain.001, Content-Type application/xml: one
//     pain.001.001.09 credit transfer whose MsgId and PmtInfId carry the
//     submission id, EndToEndId the payoutId, InstdAmt the amount as a decimal
//     by the currency's ISO 4217 exponent, DbtrAcct the accountId and CdtrAcct
//     the beneficiary (IBAN when it is one, Othr/Id otherwise);
//   - only a 200 carries an answer: a pain.002.001.10 on this payment's
//     EndToEndId (and its message's MsgId). TxSts ACSC, ACCC, ACSP or ACWC
//     accepts it under AcctSvcrRef; RJCT declines it for StsRsnInf/Rsn/Cd;
//     ACCP, ACTC, RCVD and PDNG — the bank has it and has not accepted it for
//     execution — are pending, which the gate records as TIMEOUT for the
//     statement to settle; anything else is not understood;
//   - the health probe is GET /iso20022/health;
//   - the statement is GET /iso20022/camt.053?after=&limit=, a camt.053.001.08
//     whose booked debit entries are the page's lines (lock.dev/internal/isomsg
//     maps them).
//
// What a pain.001 cannot carry — a payoutId over 35 characters, an accountId or
// beneficiary over 34, a currency without an ISO 4217 minor unit — Refuse
// names, so the gate answers 400 before anything is written.
package iso20022

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"lock.dev/internal/iso4217"
	"lock.dev/internal/isomsg"
	"lock.dev/lockapi"
	"lock.dev/rail"
)

// The adapter's name and the bank's routes.
const (
	Protocol       = "iso20022"
	PaymentPath    = "/iso20022/pain.001"
	HealthPath     = "/iso20022/health"
	StatementPath  = "/iso20022/camt.053"
	ContentTypeXML = "application/xml"
)

// The lengths of the fields a payment becomes (ISO 20022's Max35Text and
// Max34Text), in characters.
const (
	maxEndToEndID = 35 // PmtId/EndToEndId
	maxAccountID  = 34 // DbtrAcct and CdtrAcct: an IBAN or Othr/Id
)

// The pain.002 transaction statuses (ISO's ExternalPaymentTransactionStatus1Code)
// and what each means to the gate.
const (
	statusRejected = "RJCT"
)

// accepted are the statuses that accept a payment for execution or report it
// settled: money moved or will.
func accepted(s string) bool {
	switch s {
	case "ACSC", // AcceptedSettlementCompleted (debtor's account debited)
		"ACCC", // AcceptedSettlementCompletedCreditorAccount
		"ACSP", // AcceptedSettlementInProcess
		"ACWC": // AcceptedWithChange
		return true
	}
	return false
}

// pending are the statuses of a payment the bank has and has not accepted for
// execution — what most banks answer at once. The outcome is the statement's
// to tell.
func pending(s string) bool {
	switch s {
	case "ACCP", // AcceptedCustomerProfile: checks passed, not yet accepted for execution
		"ACTC", // AcceptedTechnicalValidation
		"RCVD", // Received
		"PDNG": // Pending
		return true
	}
	return false
}

// New is the ISO 20022 adapter; its pain.001 documents are dated by time.Now.
// It keeps no other state.
func New() rail.Adapter { return adapter{now: time.Now} }

// NewWithClock is New with the clock that dates each pain.001 (CreDtTm and
// ReqdExctnDt): a test's, for documents that do not change with the time.
func NewWithClock(now func() time.Time) rail.Adapter { return adapter{now: now} }

type adapter struct {
	now func() time.Time
}

func (adapter) Protocol() string { return Protocol }

// Refuse names each field of p a pain.001 cannot carry.
func (adapter) Refuse(p rail.Payment) []lockapi.FieldError {
	var errs []lockapi.FieldError
	tooLong := func(field, v string, max int, what string) {
		if n := utf8.RuneCountInString(v); n > max {
			errs = append(errs, lockapi.FieldError{Field: field, Problem: fmt.Sprintf(
				"must be at most %d characters for the ISO 20022 rail (it becomes the pain.001's %s), got %d", max, what, n)})
		}
	}
	tooLong("payoutId", p.PayoutID, maxEndToEndID, "EndToEndId, Max35Text")
	tooLong("accountId", p.AccountID, maxAccountID, "debtor account, Max34Text")
	tooLong("beneficiary", p.Beneficiary, maxAccountID, "creditor account, Max34Text")
	if _, ok := iso4217.Exponent(p.Currency); !ok {
		errs = append(errs, lockapi.FieldError{Field: "currency", Problem: "has no ISO 4217 minor unit: " +
			"the ISO 20022 rail cannot express an amount in it"})
	}
	return errs
}

// messageID is the MsgId and PmtInfId of submission id's pain.001: the
// decimal submission id, unique in paydb, so a bank's duplicate check on MsgId
// sees a second message only if the same submission were sent twice.
func messageID(submissionID int64) string {
	return "submission-" + strconv.FormatInt(submissionID, 10)
}

// PaymentRequest is the POST of p's pain.001.
func (a adapter) PaymentRequest(p rail.Payment) (rail.Request, error) {
	id := messageID(p.SubmissionID)
	body, err := isomsg.WriteInitiation(isomsg.Initiation{
		MsgID: id, PmtInfID: id, EndToEndID: p.PayoutID,
		DebtorAccount: p.AccountID, CreditorAccount: p.Beneficiary,
		AmountMinor: p.AmountMinor, Currency: p.Currency, CreatedAt: a.now(),
	})
	if err != nil {
		return rail.Request{}, fmt.Errorf("encoding pain.001: %w", err)
	}
	return rail.Request{Method: http.MethodPost, Path: PaymentPath, ContentType: ContentTypeXML, Accept: ContentTypeXML, Body: body}, nil
}

// ReadAnswer reads a 200's pain.002 on p into a verdict. The report must be on
// p's EndToEndId and p's message; a reference or reason that is not storable
// text (lockapi.StorableTextProblem) makes it no well-formed answer.
func (adapter) ReadAnswer(p rail.Payment, r rail.Reply) rail.Answer {
	if r.Status != http.StatusOK {
		return notUnderstood(fmt.Sprintf("status %d: only a 200 carries a pain.002", r.Status))
	}
	rep, err := isomsg.ReadStatusReport(r.Body)
	if err != nil {
		return notUnderstood("no pain.002 status report on one transaction: " + err.Error())
	}
	if rep.EndToEndID != p.PayoutID {
		return notUnderstood(fmt.Sprintf("the pain.002 reports on EndToEndId %q, not %q", clip(rep.EndToEndID), p.PayoutID))
	}
	if id := messageID(p.SubmissionID); rep.OrgnlMsgID != id {
		return notUnderstood(fmt.Sprintf("the pain.002 reports on message %q, not %q", clip(rep.OrgnlMsgID), id))
	}
	switch st := rep.Status; {
	case accepted(st):
		if rep.AcctSvcrRef == "" {
			return notUnderstood("pain.002 status " + st + " without AcctSvcrRef")
		}
		if prob := lockapi.StorableTextProblem(rep.AcctSvcrRef, lockapi.MaxRailReferenceLen); prob != "" {
			return notUnderstood("pain.002 AcctSvcrRef " + prob)
		}
		return rail.Answer{Verdict: rail.Accepted, RailReference: rep.AcctSvcrRef}
	case st == statusRejected:
		if prob := lockapi.StorableTextProblem(rep.ReasonCode, lockapi.MaxDeclineReasonLen); prob != "" {
			return notUnderstood("pain.002 StsRsnInf/Rsn/Cd " + prob)
		}
		return rail.Answer{Verdict: rail.Declined, DeclineReason: rep.ReasonCode}
	case pending(st):
		return rail.Answer{Verdict: rail.Pending, Why: "pain.002 status " + st + ": received, not accepted for execution"}
	default:
		return notUnderstood(fmt.Sprintf("pain.002 status %q is none the adapter knows", clip(st)))
	}
}

func notUnderstood(why string) rail.Answer { return rail.Answer{Verdict: rail.NotUnderstood, Why: why} }

// clip keeps a value quoted in Why short: the log shows what was read, never
// the reply's body.
func clip(s string) string {
	const max = 40
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}

// HealthRequest is GET /iso20022/health.
func (adapter) HealthRequest() rail.Request {
	return rail.Request{Method: http.MethodGet, Path: HealthPath}
}

// StatementRequest is GET /iso20022/camt.053?after=&limit=.
func (adapter) StatementRequest(after int64, limit int) rail.Request {
	return rail.Request{Method: http.MethodGet, Accept: ContentTypeXML,
		Path: StatementPath + "?after=" + strconv.FormatInt(after, 10) + "&limit=" + strconv.Itoa(limit)}
}

// ReadStatement reads a 200's camt.053: every statement's booked debit
// entries as ACCEPTED lines (isomsg's Statement.Lines), seq the entry's
// NtryRef. A camt.053 groups entries by account, so the page's lines are put
// back in the rail's numbering, by seq. Any part of the page not understood
// makes the whole page an error.
func (adapter) ReadStatement(r rail.Reply, _ int64, _ int) ([]lockapi.StatementLine, error) {
	if r.Status != http.StatusOK {
		return nil, fmt.Errorf("the rail answered %d", r.Status)
	}
	stmts, err := isomsg.ReadStatements(r.Body)
	if err != nil {
		return nil, err
	}
	lines := []lockapi.StatementLine{}
	for _, s := range stmts {
		ls, err := s.Lines()
		if err != nil {
			return nil, err
		}
		lines = append(lines, ls...)
	}
	slices.SortStableFunc(lines, func(a, b lockapi.StatementLine) int { return cmp.Compare(a.Seq, b.Seq) })
	return lines, nil
}
