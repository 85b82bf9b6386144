package railstub

import (
	"cmp"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"lock.dev/internal/isomsg"
	"lock.dev/internal/jsonbody"
	"lock.dev/lockapi"
)

// ISO 20022 answers of the stub (docs/contracts/rail-stub.md, ISO 20022 mode).
const (
	// StatusAccepted is the pain.002 TxSts of an accepted payment: settlement
	// completed, the rail reference in AcctSvcrRef.
	StatusAccepted = "ACSC"
	// StatusRejected is the TxSts of a declined payment.
	StatusRejected = "RJCT"
	// ISODeclineCode is the StsRsnInf/Rsn/Cd of every chaos decline: MS03,
	// "reason not specified" in ISO's external status reason code list. It is
	// also the call log's reason for that decline, since it is the reason the
	// gate records from the answer: the rail's books and the gate's agree.
	ISODeclineCode = "MS03"
	// StatementAccount is the Acct of the statement the stub answers when it has
	// no entry to list: camt.053 requires a Stmt, and a Stmt an account.
	StatementAccount = "RAIL-STUB"
	// statementCurrency is the balances' currency of that empty statement.
	statementCurrency = "EUR"
	// entryBooked is Ntry/Sts/Cd: every entry the stub lists is booked.
	entryBooked = "BOOK"
	// xmlContentType is the content type of every ISO 20022 message the stub
	// reads or answers.
	xmlContentType = "application/xml"
)

// Max lengths of the camt.053 fields a call fills (Max35Text, Max34Text of the
// official schema). A call booked by the JSON route may exceed them; such a call
// cannot be listed in a statement and is logged instead (statement_call_skipped).
const (
	maxEndToEndID = 35
	maxAccountID  = 34
)

// handlePain001 is the rail's ISO 20022 front-end: one pain.001 with one
// transaction, mapped onto the same booking, chaos and call log as the JSON
// route (book), answered with a pain.002. A document that does not parse, holds
// more or less than one transaction, or carries a field the JSON route would
// refuse is 400 and never reaches booking.
func (s *Stub) handlePain001(w http.ResponseWriter, r *http.Request) {
	body, fault := readXMLBody(r)
	if fault != nil {
		lockapi.WriteInvalid(w, fault.status, fault.errors)
		return
	}
	in, err := isomsg.ReadInitiation(body)
	if err != nil {
		lockapi.WriteInvalid(w, http.StatusBadRequest, []lockapi.FieldError{{Field: "body",
			Problem: "must be a pain.001.001.09 document with one payment of one transaction: " + err.Error()}})
		return
	}
	p := PaymentRequest{Reference: in.EndToEndID, AccountID: in.DebtorAccount, AmountMinor: in.AmountMinor,
		Currency: in.Currency, Beneficiary: in.CreditorAccount}
	if errs := checkInitiation(p); len(errs) > 0 {
		lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
		return
	}
	c, answer := s.book(w, r, p, ISODeclineCode)
	if !answer {
		return
	}
	rep := isomsg.StatusReport{MsgID: "RS-" + rand.Text(), OrgnlMsgID: in.MsgID, EndToEndID: in.EndToEndID,
		Status: StatusAccepted, AcctSvcrRef: c.RailReference, CreatedAt: time.Now().UTC()}
	if c.Result == ResultDeclined {
		rep.Status, rep.AcctSvcrRef, rep.ReasonCode, rep.AdditionalInfo = StatusRejected, "", ISODeclineCode, DeclineReason
	}
	doc, err := isomsg.WriteStatusReport(rep)
	if err != nil {
		// The call is booked: the caller must take the payment as possibly made.
		s.logger.Error("the pain.002 could not be written; the call is booked", "event", "rail_answer_failed",
			"seq", c.Seq, "reference", c.Reference, "error", err.Error())
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeInternal,
			"the call was booked but its status report could not be written; the payment may have been made", nil))
		return
	}
	writeXML(w, doc)
}

// checkInitiation holds a pain.001's payment to the bounds the JSON route binds
// (docs/contracts/rail-stub.md), field names those of the pain.001.
func checkInitiation(p PaymentRequest) []lockapi.FieldError {
	var errs []lockapi.FieldError
	check := func(field string, err error) {
		if err != nil {
			errs = append(errs, lockapi.FieldError{Field: field, Problem: lockapi.ProblemText(err)})
		}
	}
	check("EndToEndId", lockapi.ValidateIdentifier(p.Reference))
	check("DbtrAcct", lockapi.ValidateIdentifier(p.AccountID))
	check("InstdAmt", lockapi.ValidateAmountMinor(p.AmountMinor))
	check("InstdAmt/@Ccy", lockapi.ValidateCurrency(p.Currency))
	check("CdtrAcct", lockapi.ValidateBeneficiary(p.Beneficiary))
	return errs
}

// handleCamt053 is the rail's statement: the accepted calls with seq > after,
// at most limit of them, as booked debit entries of one camt.053 (NtryRef the
// call's seq). Declines are not listed: a bank statement lists what moved; they
// stay in the call log.
func (s *Stub) handleCamt053(w http.ResponseWriter, r *http.Request) {
	after, limit, errs := pageParams(r)
	if len(errs) > 0 {
		lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
		return
	}
	cs := s.calls.listAccepted(after, limit)
	stmts := s.pageStatements(cs, after)
	doc, err := isomsg.WriteStatements("RS-"+rand.Text(), time.Now().UTC(), stmts)
	if err != nil {
		s.logger.Error("the camt.053 could not be written", "event", "statement_failed", "after", after, "error", err.Error())
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeInternal, "the statement could not be written", nil))
		return
	}
	writeXML(w, doc)
}

// pageStatements groups a page of accepted calls into one statement per
// account and currency (sorted), balances opening at 0, FrToDt from the first
// entry's booking to the last's. No call to list: the stub's own empty statement.
func (s *Stub) pageStatements(cs []Call, after int64) []isomsg.Statement {
	groups := map[stmtKey][]Call{}
	for _, c := range cs {
		if !s.listable(c) {
			continue
		}
		k := stmtKey{c.AccountID, c.Currency}
		groups[k] = append(groups[k], c)
	}
	if len(groups) == 0 {
		return []isomsg.Statement{{ID: "RS-" + strconv.FormatInt(after, 10), Account: StatementAccount, Currency: statementCurrency}}
	}
	keys := sortedKeys(groups)
	stmts := make([]isomsg.Statement, 0, len(keys))
	for i, k := range keys {
		g := groups[k]
		from, to := g[0].ReceivedAt, g[len(g)-1].ReceivedAt
		st := isomsg.Statement{ID: fmt.Sprintf("RS-%d-%d", after, i+1), Account: k.account, Currency: k.currency,
			From: &from, To: &to}
		for _, c := range g {
			st.Entries = append(st.Entries, entryOf(c))
			st.ClosingMinor -= c.AmountMinor
		}
		stmts = append(stmts, st)
	}
	return stmts
}

// stmtKey is one statement's account: a Stmt has one balance currency, so an
// account paid from in two currencies has a statement for each.
type stmtKey struct{ account, currency string }

func (k stmtKey) compare(o stmtKey) int {
	return cmp.Or(strings.Compare(k.account, o.account), strings.Compare(k.currency, o.currency))
}

func sortedKeys[V any](m map[stmtKey]V) []stmtKey {
	keys := make([]stmtKey, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, stmtKey.compare)
	return keys
}

// entryOf is an accepted call as a booked debit entry: NtryRef its seq,
// AcctSvcrRef the rail reference, EndToEndId the reference (the payoutId),
// CdtrAcct the beneficiary, booked when the call was, the instructed amount the
// call's.
func entryOf(c Call) isomsg.Entry {
	amount := c.AmountMinor
	return isomsg.Entry{Ref: strconv.FormatInt(c.Seq, 10), AcctSvcrRef: c.RailReference, EndToEndID: c.Reference,
		CreditorAccount: c.Beneficiary, Currency: c.Currency, AmountMinor: c.AmountMinor, Debit: true,
		Status: entryBooked, BookedAt: c.ReceivedAt, InstructedMinor: &amount, InstructedCurrency: c.Currency}
}

// listable reports whether c fits a camt.053 entry; one that does not (a call
// the JSON route took with a reference, account or beneficiary longer than the
// message allows, or a currency without an ISO 4217 exponent) is logged and left
// out, so that the rest of the statement is still delivered.
func (s *Stub) listable(c Call) bool {
	err := representable(c)
	if err != nil {
		s.logger.Error("a call cannot be listed in a camt.053 statement", "event", "statement_call_skipped",
			"seq", c.Seq, "reference", c.Reference, "accountId", c.AccountID, "error", err.Error())
	}
	return err == nil
}

// representable is nil when every field of c fits the camt.053 entry it
// becomes.
func representable(c Call) error {
	if err := accountRepresentable(c); err != nil {
		return err
	}
	switch {
	case utf8.RuneCountInString(c.Reference) > maxEndToEndID:
		return fmt.Errorf("reference is over %d characters (EndToEndId)", maxEndToEndID)
	case utf8.RuneCountInString(c.Beneficiary) > maxAccountID:
		return fmt.Errorf("beneficiary is over %d characters (CdtrAcct)", maxAccountID)
	}
	if _, err := isomsg.FormatAmount(c.AmountMinor, c.Currency); err != nil {
		return fmt.Errorf("amount: %w", err)
	}
	return nil
}

// accountRepresentable is nil when c's account and currency can head a Stmt:
// an Acct of at most 34 characters, balances in a currency with an ISO 4217
// exponent.
func accountRepresentable(c Call) error {
	if utf8.RuneCountInString(c.AccountID) > maxAccountID {
		return fmt.Errorf("accountId is over %d characters (Acct)", maxAccountID)
	}
	if _, err := isomsg.FormatAmount(0, c.Currency); err != nil {
		return fmt.Errorf("currency: %w", err)
	}
	return nil
}

func writeXML(w http.ResponseWriter, doc []byte) {
	w.Header().Set("Content-Type", xmlContentType)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(doc)
}

// bodyFault is why a request body could not be looked at: 415 or 413.
type bodyFault struct {
	status int
	errors []lockapi.FieldError
}

// readXMLBody applies the project's first two body rules to an XML body in
// their order (docs/contracts/README.md): the content type application/xml
// (415), then at most 64 KiB (413; an honest oversized body is drained so the
// answer reaches its sender).
func readXMLBody(r *http.Request) ([]byte, *bodyFault) {
	vs := r.Header.Values("Content-Type")
	if len(vs) != 1 || !isXMLType(vs[0]) {
		return nil, &bodyFault{http.StatusUnsupportedMediaType,
			[]lockapi.FieldError{{Field: "Content-Type", Problem: "is required once and must be " + xmlContentType}}}
	}
	tooLarge := &bodyFault{http.StatusRequestEntityTooLarge,
		[]lockapi.FieldError{{Field: "body", Problem: "must be at most " + strconv.Itoa(lockapi.MaxBodyBytes) + " bytes"}}}
	if r.ContentLength > lockapi.MaxBodyBytes {
		drainOversized(r)
		return nil, tooLarge
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, lockapi.MaxBodyBytes+1))
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		return nil, tooLarge
	}
	if err != nil {
		return nil, &bodyFault{http.StatusBadRequest,
			[]lockapi.FieldError{{Field: "body", Problem: "could not be read: " + err.Error()}}}
	}
	if len(b) > lockapi.MaxBodyBytes {
		drainOversized(r)
		return nil, tooLarge
	}
	return b, nil
}

func isXMLType(v string) bool {
	mt, _, err := mime.ParseMediaType(v)
	return err == nil && strings.EqualFold(mt, xmlContentType)
}

// drainOversized reads and throws away an oversized body up to what the JSON
// routes drain (jsonbody.MaxDrainBytes), so its 413 reaches the sender.
func drainOversized(r *http.Request) {
	if r.ContentLength > jsonbody.MaxDrainBytes || strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, jsonbody.MaxDrainBytes))
}
