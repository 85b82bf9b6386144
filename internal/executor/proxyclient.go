package executor

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"

	"lock.dev/lockapi"
)

// maxAnswerBytes bounds what is read of any rail-proxy answer.
const maxAnswerBytes = 1 << 20

// proxyClient speaks to rail-proxy: one submission, and the audit trail.
//
// A submission carries X-Idempotency-Key. Go's transport deems such a request
// replayable when its body can be re-read (GetBody set, as http.NewRequest does for
// in-memory bodies) and then silently sends it again when a reused keep-alive
// connection turns out to have been closed by the server after it read the request.
// A second copy of our own submission would come back FENCED_OUT (its token is now
// equal to the mark) or DUPLICATE_SUBMISSION, and the executor would act on that
// instead of on what happened to the first. So the body is handed over without
// GetBody and redirects are not followed: the transport never sends a submission
// a second time on its own. The one resend there is — after a reused connection
// failed before any answer — is the executor's own decision, made where the
// answer is read (submitAndSettle), on a connection of its own (fresh).
type proxyClient struct {
	base  string
	hc    *http.Client
	fresh *http.Client // one new connection per request, never reused
}

// maxTrailPages bounds how many pages of one payout's audit trail are read (100
// rows each): a trail longer than that is not guessed at, it is an error.
const maxTrailPages = 100

// newProxyClient is a client of rail-proxy at base over mutual TLS with tlsCfg
// (nil: plaintext). Its pool keeps maxIdle connections — one per worker and
// the reconcile pass — so a submission goes out on a connection whose
// handshake is done and pays none before its bound starts to run out.
func newProxyClient(base string, maxIdle int, tlsCfg *tls.Config) *proxyClient {
	fresh := newTransport(0, tlsCfg)
	fresh.DisableKeepAlives = true
	return &proxyClient{
		base:  strings.TrimRight(base, "/"),
		hc:    &http.Client{Transport: newTransport(maxIdle, tlsCfg), CheckRedirect: noRedirect},
		fresh: &http.Client{Transport: fresh, CheckRedirect: noRedirect},
	}
}

func (c *proxyClient) close() {
	c.hc.CloseIdleConnections()
	c.fresh.CloseIdleConnections()
}

// idempotencyKey is the key of one attempt: one payout under one token
// (docs/contracts/executor.md).
func idempotencyKey(payoutID string, token int64) string {
	return payoutID + ":" + strconv.FormatInt(token, 10)
}

// answerKind is what rail-proxy said about a submission.
type answerKind int

const (
	// answerNone: no answer we can act on — the call failed or timed out, or the
	// reply was none of the six the contract pins (a 500, a proxy in front
	// answering 502, a body that does not parse). Whether anything was admitted is
	// unknown; only the audit trail can tell.
	answerNone answerKind = iota
	answerAccepted
	answerFenced
	answerDuplicate
	answerRejected
	answerAmbiguous
	answerUnavailable
	answerInvalid
	// answerUnbooked: 409 NOT_IN_BOOKS — the books do not hold the payout
	// claimed by this token and owner as presented; nothing was forwarded.
	answerUnbooked
)

func (k answerKind) String() string {
	switch k {
	case answerAccepted:
		return "accepted"
	case answerFenced:
		return "fenced_out"
	case answerDuplicate:
		return "duplicate_submission"
	case answerRejected:
		return "rail_rejected"
	case answerAmbiguous:
		return "rail_ambiguous"
	case answerUnavailable:
		return "rail_unavailable"
	case answerInvalid:
		return "invalid_request"
	case answerUnbooked:
		return "not_in_books"
	default:
		return "no_answer"
	}
}

// submitAnswer is one submission's answer, reduced to what the executor acts on.
type submitAnswer struct {
	kind          answerKind
	status        int    // HTTP status, 0 when there was none
	submissionID  *int64 // the proxy's row for this attempt, when it said
	railReference string // accepted
	declineReason *string

	// DUPLICATE_SUBMISSION: the payout's forwardable attempt, and what it
	// presented (nil: the answer did not say — an older rail-proxy).
	firstOutcome       *string
	firstRailReference *string
	firstSubmissionID  *int64
	first              presented

	mismatch string // NOT_IN_BOOKS: the first check of the books that failed

	highestToken *int64 // FENCED_OUT
	stage        string // RAIL_UNAVAILABLE
	err          error  // answerNone and answerInvalid: why

	// staleConn: the call failed on a reused keep-alive connection before a
	// single byte of answer — the mark of a connection rail-proxy had closed as
	// idle (or while shutting down) just as the request went out.
	staleConn bool
	// resent: this is the answer to the submission sent a second time, with the
	// same token, on a fresh connection after a staleConn failure.
	resent bool
}

// presented is what an attempt presented to the rail, as an answer or the audit
// trail reports it; a nil field was not reported.
type presented struct {
	accountID   *string
	amountMinor *int64
	currency    *string
	beneficiary *string
}

// presentedBy is what the audit-trail row s presented. An older rail-proxy's
// rows lack amount, currency and beneficiary: those read as not reported.
func presentedBy(s *lockapi.Submission) presented {
	var f presented
	if s.AccountID != "" {
		f.accountID = &s.AccountID
	}
	if s.Currency != "" {
		f.currency = &s.Currency
		f.amountMinor = &s.AmountMinor
	}
	if s.Beneficiary != "" {
		f.beneficiary = &s.Beneficiary
	}
	return f
}

// differs names the fields in which f is not payout p's, in the books' order
// (lockapi.BooksMismatchOrder); a field not reported differs. Compared exactly,
// as rail-proxy's books compare a body with the payout row.
func (f presented) differs(p lockapi.Payout) []string {
	var d []string
	if f.accountID == nil || *f.accountID != p.AccountID {
		d = append(d, lockapi.MismatchAccount)
	}
	if f.amountMinor == nil || *f.amountMinor != p.AmountMinor {
		d = append(d, lockapi.MismatchAmount)
	}
	if f.currency == nil || *f.currency != p.Currency {
		d = append(d, lockapi.MismatchCurrency)
	}
	if f.beneficiary == nil || *f.beneficiary != p.Beneficiary {
		d = append(d, lockapi.MismatchBeneficiary)
	}
	return d
}

// submit presents one payout to rail-proxy, once, on a pooled connection,
// without a grant.
func (c *proxyClient) submit(ctx context.Context, p lockapi.SubmissionRequest, token int64, owner string) submitAnswer {
	return c.submitWithGrant(ctx, p, token, "", owner)
}

// submitWithGrant presents one payout to rail-proxy, once, on a pooled connection,
// with grant — the lease's signed grant of token (docs/contracts/signed-grants.md;
// "" sends none). ctx bounds the whole call.
func (c *proxyClient) submitWithGrant(ctx context.Context, p lockapi.SubmissionRequest, token int64, grant, owner string) submitAnswer {
	return c.send(ctx, c.hc, p, token, grant, owner)
}

// resubmit presents the payout again, with the same token, on a connection opened
// for this request alone, without a grant.
func (c *proxyClient) resubmit(ctx context.Context, p lockapi.SubmissionRequest, token int64, owner string) submitAnswer {
	return c.resubmitWithGrant(ctx, p, token, "", owner)
}

// resubmitWithGrant is resubmit with the lease's grant. Only after a staleConn
// failure (see submitAndSettle).
func (c *proxyClient) resubmitWithGrant(ctx context.Context, p lockapi.SubmissionRequest, token int64, grant, owner string) submitAnswer {
	a := c.send(ctx, c.fresh, p, token, grant, owner)
	a.resent = true
	return a
}

func (c *proxyClient) send(ctx context.Context, hc *http.Client, p lockapi.SubmissionRequest, token int64, grant, owner string) submitAnswer {
	body, err := json.Marshal(p)
	if err != nil {
		return submitAnswer{err: fmt.Errorf("encode submission: %w", err)}
	}
	// io.NopCloser hides the *bytes.Reader from NewRequest, which therefore sets no
	// GetBody: the transport cannot rewind the body, so it cannot resend it.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/rail/submissions",
		io.NopCloser(bytes.NewReader(body)))
	if err != nil {
		return submitAnswer{err: fmt.Errorf("build submission: %w", err)}
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(lockapi.HeaderFencingToken, strconv.FormatInt(token, 10))
	req.Header.Set(lockapi.HeaderOwnerID, owner)
	req.Header.Set(lockapi.HeaderIdempotencyKey, idempotencyKey(p.PayoutID, token))
	if grant != "" {
		req.Header.Set(lockapi.HeaderFencingGrant, grant)
	}
	var reused, answered atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn:              func(info httptrace.GotConnInfo) { reused.Store(info.Reused) },
		GotFirstResponseByte: func() { answered.Store(true) },
	}))
	resp, err := hc.Do(req)
	if err != nil {
		return submitAnswer{err: fmt.Errorf("submit to rail-proxy: %w", err),
			staleConn: reused.Load() && !answered.Load() && ctx.Err() == nil}
	}
	defer resp.Body.Close()
	b, err := lockapi.ReadAllLimited(resp.Body, maxAnswerBytes)
	if err != nil {
		return submitAnswer{status: resp.StatusCode, err: fmt.Errorf("read rail-proxy answer (status %d): %w", resp.StatusCode, err)}
	}
	return parseAnswer(resp, b, p.PayoutID)
}

// parseAnswer maps a reply to one of the six answers of docs/contracts/rail-proxy.md. The code
// must come with its pinned status; anything else is no answer, since acting on a
// reply we do not understand could post an outcome that did not happen.
func parseAnswer(resp *http.Response, b []byte, payoutID string) submitAnswer {
	a := submitAnswer{status: resp.StatusCode}
	if resp.StatusCode == http.StatusOK {
		var ok lockapi.SubmissionAccepted
		if err := json.Unmarshal(b, &ok); err != nil {
			a.err = fmt.Errorf("200 answer does not parse: %w", err)
			return a
		}
		if ok.Outcome != lockapi.OutcomeAcked || ok.RailReference == "" || ok.PayoutID != payoutID {
			a.err = fmt.Errorf("200 answer is not an acceptance of payout %s (outcome %q, payoutId %q)", payoutID, ok.Outcome, ok.PayoutID)
			return a
		}
		a.kind = answerAccepted
		a.railReference = ok.RailReference
		a.submissionID = &ok.SubmissionID
		return a
	}
	p := lockapi.ReadProblem(resp, b)
	if p == nil {
		a.err = fmt.Errorf("status %d without a problem document", resp.StatusCode)
		return a
	}
	member := func(name string, dst any) {
		if _, err := p.Member(name, dst); err != nil && a.err == nil {
			a.err = fmt.Errorf("%s answer: member %s: %w", p.Code, name, err)
		}
	}
	member("submissionId", &a.submissionID)
	switch p.Code {
	case lockapi.CodeFencedOut, lockapi.CodeDuplicateSubmission, lockapi.CodeRailRejected,
		lockapi.CodeRailAmbiguous, lockapi.CodeRailUnavailable, lockapi.CodeNotInBooks:
		// The gate's own codes come with the status the code table gives them; any
		// other status means the answer is not the gate's.
		if st := lockapi.Status(p.Code); st != resp.StatusCode {
			a.err = fmt.Errorf("%s answered with status %d, want %d", p.Code, resp.StatusCode, st)
			return a
		}
	}
	switch p.Code {
	case lockapi.CodeFencedOut:
		a.kind = answerFenced
		member("highestToken", &a.highestToken)
	case lockapi.CodeDuplicateSubmission:
		member("firstOutcome", &a.firstOutcome)
		member("firstRailReference", &a.firstRailReference)
		member("firstSubmissionId", &a.firstSubmissionID)
		member("firstAccountId", &a.first.accountID)
		member("firstAmountMinor", &a.first.amountMinor)
		member("firstCurrency", &a.first.currency)
		member("firstBeneficiary", &a.first.beneficiary)
		if a.err != nil {
			a.kind = answerNone
			return a
		}
		a.kind = answerDuplicate
	case lockapi.CodeNotInBooks:
		// Refused by the books before the duplicate check: recorded UNBOOKED,
		// never forwarded. Without a mismatch it is not the gate's answer.
		member("mismatch", &a.mismatch)
		if a.err == nil && a.mismatch == "" {
			a.err = errors.New("NOT_IN_BOOKS answer without a mismatch")
		}
		if a.err != nil {
			return a
		}
		a.kind = answerUnbooked
	case lockapi.CodeRailRejected:
		a.kind = answerRejected
		member("declineReason", &a.declineReason)
	case lockapi.CodeRailAmbiguous:
		a.kind = answerAmbiguous
	case lockapi.CodeRailUnavailable:
		a.kind = answerUnavailable
		member("stage", &a.stage)
	case lockapi.CodeGrantRejected:
		// Refused before admission (docs/contracts/signed-grants.md): nothing was
		// written or presented. Our lease's grant did not prove the token — a key
		// the proxy does not know, most likely: handled like a request refused as
		// invalid.
		if resp.StatusCode != http.StatusUnauthorized {
			a.err = fmt.Errorf("GRANT_REJECTED answered with status %d", resp.StatusCode)
			return a
		}
		a.kind = answerInvalid
		a.err = p
	case lockapi.CodeInvalidRequest:
		switch resp.StatusCode {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
			a.kind = answerInvalid
			a.err = p
		default:
			a.err = fmt.Errorf("INVALID_REQUEST answered with status %d", resp.StatusCode)
		}
	default:
		a.err = p
	}
	return a
}

// submissions reads the whole audit trail of a payout, oldest first, page by page
// (docs/contracts/executor.md: at most 100 rows per answer, next names where the
// following page starts).
func (c *proxyClient) submissions(ctx context.Context, payoutID string) ([]lockapi.Submission, error) {
	var (
		all   []lockapi.Submission
		after int64
	)
	for range maxTrailPages {
		list, err := c.trailPage(ctx, payoutID, after)
		if err != nil {
			return nil, err
		}
		for _, s := range list.Submissions {
			if s.PayoutID != payoutID {
				return nil, errors.New("read audit trail: a row of another payout came back")
			}
			if s.SubmissionID <= after {
				return nil, errors.New("read audit trail: rows out of order")
			}
			after = s.SubmissionID
		}
		all = append(all, list.Submissions...)
		if list.Next == nil {
			return all, nil
		}
		if len(list.Submissions) == 0 || *list.Next != after {
			return nil, errors.New("read audit trail: next does not follow the page")
		}
	}
	return nil, fmt.Errorf("read audit trail: more than %d pages", maxTrailPages)
}

// trailPage reads one page of the audit trail: the rows after submission after
// (0: from the first).
func (c *proxyClient) trailPage(ctx context.Context, payoutID string, after int64) (lockapi.SubmissionList, error) {
	var list lockapi.SubmissionList
	q := url.Values{"payoutId": {payoutID}}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/rail/submissions?"+q.Encode(), nil)
	if err != nil {
		return list, fmt.Errorf("build audit-trail request: %w", err)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return list, fmt.Errorf("read audit trail: %w", err)
	}
	defer resp.Body.Close()
	b, err := lockapi.ReadAllLimited(resp.Body, maxAnswerBytes)
	if err != nil {
		return list, fmt.Errorf("read audit trail: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		if p := lockapi.ReadProblem(resp, b); p != nil {
			return list, fmt.Errorf("read audit trail: %w", p)
		}
		return list, fmt.Errorf("read audit trail: status %d", resp.StatusCode)
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return list, fmt.Errorf("read audit trail: %w", err)
	}
	return list, nil
}

// forwardable is the payout's one forwardable attempt (outcome NULL, ACKED,
// REJECTED or TIMEOUT — the rows rail_submission_attempt_uidx covers), or nil.
func forwardable(subs []lockapi.Submission) *lockapi.Submission {
	for i := range subs {
		o := subs[i].Outcome
		if o == nil || *o == lockapi.OutcomeAcked || *o == lockapi.OutcomeRejected || *o == lockapi.OutcomeTimeout {
			return &subs[i]
		}
	}
	return nil
}
