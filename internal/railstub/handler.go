package railstub

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"lock.dev/internal/jsonbody"
	"lock.dev/lockapi"
)

// MaxPageLimit is the default and largest page of GET /rail/v1/calls.
const MaxPageLimit = 10_000

// DeclineReason is the reason of every chaos decline.
const DeclineReason = "declined by rail-stub chaos"

// PaymentRequest is the body of POST /rail/v1/payments; reference is the payoutId.
type PaymentRequest struct {
	Reference   string `json:"reference"`
	AccountID   string `json:"accountId"`
	AmountMinor int64  `json:"amountMinor"`
	Currency    string `json:"currency"`
	Beneficiary string `json:"beneficiary"`
}

// PaymentReply is the rail's answer: 200 {"status":"ACCEPTED","railReference"} or
// 422 {"status":"DECLINED","reason"}.
type PaymentReply struct {
	Status        string `json:"status"`
	RailReference string `json:"railReference,omitempty"`
	Reason        string `json:"reason,omitempty"`
}

// CallList is the answer of GET /rail/v1/calls.
type CallList struct {
	Calls []Call `json:"calls"`
}

// parsePayment binds the payment body with the project's strict binder: all five
// members required, no others, each within the bounds of docs/contracts/README.md.
func parsePayment(b []byte) (PaymentRequest, []lockapi.FieldError) {
	var p PaymentRequest
	o, errs := jsonbody.ParseObject(b)
	if errs != nil {
		return p, errs
	}
	p.Reference, _ = o.String("reference", true, false, lockapi.ValidateIdentifier)
	p.AccountID, _ = o.String("accountId", true, false, lockapi.ValidateIdentifier)
	p.AmountMinor, _ = o.Int64("amountMinor", true, lockapi.MinAmountMinor, lockapi.MaxAmountMinor)
	p.Currency, _ = o.String("currency", true, false, lockapi.ValidateCurrency)
	p.Beneficiary, _ = o.String("beneficiary", true, false, lockapi.ValidateBeneficiary)
	return p, o.Finish()
}

// handlePayment is the rail's JSON front-end: the body bound strictly, then the
// one booking path both languages share, then the JSON answer. A malformed
// request is refused before booking: it never reached the point where money
// could move.
func (s *Stub) handlePayment(w http.ResponseWriter, r *http.Request) {
	body, fault := jsonbody.ReadJSONBody(r)
	if fault != nil {
		lockapi.WriteInvalid(w, fault.Status, fault.Errors)
		return
	}
	p, errs := parsePayment(body)
	if len(errs) > 0 {
		lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
		return
	}
	c, answer := s.book(w, r, p, DeclineReason)
	if !answer {
		return
	}
	if c.Result == ResultDeclined {
		lockapi.WriteJSON(w, http.StatusUnprocessableEntity, PaymentReply{Status: ResultDeclined, Reason: DeclineReason})
		return
	}
	lockapi.WriteJSON(w, http.StatusOK, PaymentReply{Status: ResultAccepted, RailReference: c.RailReference})
}

// book is the rail, whatever language the payment came in. The order is the
// point: the call is booked (and on disk, with a file) before chaos does anything
// to the reply, so a dropped or late reply is still a payment in the books —
// exactly the ambiguity a real rail hands its callers. declineReason is what the
// call log records for a decline: the reason the caller is told, in the
// caller's language, so the rail's books and the gate's agree.
//
// It answers true when the caller is to be told now what became of the call
// (c.Result); false when the reply is already dealt with: a problem written
// (the call could not be booked, or not synced), the connection dropped, or the
// caller gone.
func (s *Stub) book(w http.ResponseWriter, r *http.Request, p PaymentRequest, declineReason string) (c Call, answer bool) {
	// Made outside the lock; 128 random bits keep references unique across
	// resets and restarts, which a seq-derived one would not.
	ref := "RS-" + rand.Text()
	var d decision
	c, err := s.calls.record(func(c *Call) {
		d = s.chaos.decide()
		c.Reference, c.AccountID, c.AmountMinor, c.Currency, c.Beneficiary =
			p.Reference, p.AccountID, p.AmountMinor, p.Currency, p.Beneficiary
		c.Result, c.LatencyMs, c.Dropped = ResultAccepted, d.latencyMs, d.dropped
		if d.declined {
			c.Result, c.Reason = ResultDeclined, declineReason
		} else {
			c.RailReference = ref
		}
	})
	var notBooked *errNotRecorded
	if errors.As(err, &notBooked) {
		s.logger.Error("payment refused: the call could not be booked", "event", "rail_call_refused",
			"reference", p.Reference, "accountId", p.AccountID, "error", err.Error())
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeUnavailable,
			"the rail could not book the call; no payment was made", nil))
		return c, false
	}
	s.metrics.observe(d)
	s.logCall(c, err)
	if err != nil {
		// Booked in memory, but the file may not hold it: the caller must treat
		// the payment as possibly made.
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeInternal,
			"the call was booked but the call log could not be synced; the payment may have been made", nil))
		return c, false
	}
	if d.dropped {
		dropConnection(w)
		return c, false
	}
	switch s.delay(r.Context(), d.latencyMs) {
	case delayCallerGone:
		return c, false // the caller gave up; the payment stands, nobody is left to tell
	case delayShutdown:
		dropConnection(w)
		return c, false
	}
	return c, true
}

// logCall writes the line of every booked call, with typed attributes: it is
// the stub's most frequent work after the call itself.
func (s *Stub) logCall(c Call, syncErr error) {
	attrs := [...]slog.Attr{slog.String("event", "rail_call"), slog.Int64("seq", c.Seq),
		slog.String("reference", c.Reference), slog.String("accountId", c.AccountID),
		slog.Int64("amountMinor", c.AmountMinor), slog.String("currency", c.Currency),
		slog.String("beneficiary", lockapi.MaskBeneficiary(c.Beneficiary)), slog.String("result", c.Result),
		slog.String("railReference", c.RailReference), slog.Int("latencyMs", c.LatencyMs),
		slog.Bool("dropped", c.Dropped), {}}
	if syncErr != nil {
		attrs[len(attrs)-1] = slog.String("error", syncErr.Error())
		s.logger.LogAttrs(context.Background(), slog.LevelError, "rail call booked, call log not synced", attrs[:]...)
		return
	}
	s.logger.LogAttrs(context.Background(), slog.LevelInfo, "rail call", attrs[:len(attrs)-1]...)
}

// dropConnection closes the connection without a byte of reply, the way a rail
// that crashed or a middlebox that cut the line would: the caller sees EOF or a
// reset, never a status code.
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not hijackable (HTTP/2): net/http's own way to abort a reply, which
		// resets the stream instead of answering.
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

type delayResult int

const (
	delayDone       delayResult = iota // reply now
	delayCallerGone                    // the caller's context ended
	delayShutdown                      // the stub is stopping and the reply would come too late
)

// delay waits ms milliseconds before a reply. Once shutdown begins a pending
// reply still gets drainReplies to come due; one that would be later is dropped
// instead, as by a rail going down mid-flight, so the drain ends within its grace.
// The payment is booked either way. A caller that leaves ends the wait only under
// net/http (Handler in a test's server): the binary's server (fastserve.ServeFast)
// does not cancel a request's context, and the reply then goes to a closed
// connection.
func (s *Stub) delay(ctx context.Context, ms int) delayResult {
	if ms <= 0 {
		return delayDone
	}
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return delayDone
	case <-ctx.Done():
		return delayCallerGone
	case <-s.stopping:
	}
	cut := time.NewTimer(s.drainReplies)
	defer cut.Stop()
	select {
	case <-t.C:
		return delayDone
	case <-ctx.Done():
		return delayCallerGone
	case <-cut.C:
		return delayShutdown
	}
}

func (s *Stub) handleListCalls(w http.ResponseWriter, r *http.Request) {
	after, limit, errs := pageParams(r)
	if len(errs) > 0 {
		lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
		return
	}
	lockapi.WriteJSON(w, http.StatusOK, CallList{Calls: s.calls.list(after, limit)})
}

// pageParams reads a page's after (default 0) and limit (default and at most
// MaxPageLimit), the rules of GET /rail/v1/calls and GET /iso20022/camt.053.
func pageParams(r *http.Request) (after int64, limit int, errs []lockapi.FieldError) {
	q := r.URL.Query()
	after, lim := int64(0), int64(MaxPageLimit)
	if vs, ok := q["after"]; ok {
		v, problem := queryInt(vs, 0, 1<<63-1)
		if problem != "" {
			errs = append(errs, lockapi.FieldError{Field: "after", Problem: problem})
		}
		after = v
	}
	if vs, ok := q["limit"]; ok {
		v, problem := queryInt(vs, 1, MaxPageLimit)
		if problem != "" {
			errs = append(errs, lockapi.FieldError{Field: "limit", Problem: problem})
		}
		lim = v
	}
	return after, int(lim), errs
}

// queryInt reads a single decimal query value within [min, max]; the second
// result is the fault, empty when none.
func queryInt(vs []string, min, max int64) (int64, string) {
	if len(vs) != 1 {
		return 0, "must appear exactly once"
	}
	v := vs[0]
	if v == "" || v[0] == '+' || v[0] == '-' || (len(v) > 1 && v[0] == '0') {
		return 0, "must be a decimal integer without sign or leading zero"
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < min || n > max {
		return 0, "must be an integer between " + strconv.FormatInt(min, 10) + " and " + strconv.FormatInt(max, 10)
	}
	return n, ""
}

func (s *Stub) handleResetCalls(w http.ResponseWriter, _ *http.Request) {
	if err := s.calls.reset(); err != nil {
		s.logger.Error("call log reset failed", "event", "calls_reset", "error", err.Error())
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeInternal,
			"the call log could not be truncated", nil))
		return
	}
	s.logger.Info("call log cleared; the next call is seq 1", "event", "calls_reset")
	w.WriteHeader(http.StatusNoContent)
}

func (s *Stub) handleGetChaos(w http.ResponseWriter, _ *http.Request) {
	lockapi.WriteJSON(w, http.StatusOK, s.chaos.settings())
}

func (s *Stub) handlePutChaos(w http.ResponseWriter, r *http.Request) {
	body, fault := jsonbody.ReadJSONBody(r)
	if fault != nil {
		lockapi.WriteInvalid(w, fault.Status, fault.Errors)
		return
	}
	req, errs := parseChaosRequest(body)
	if len(errs) > 0 {
		lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
		return
	}
	c := s.chaos.replace(req.LatencyMs, req.DeclineRate, req.DropRate, req.Seed)
	s.logger.Info("chaos settings replaced", "event", "chaos_changed", "latencyMs", c.LatencyMs,
		"declineRate", c.DeclineRate, "dropRate", c.DropRate, "seed", c.Seed, "reseeded", req.Seed != nil)
	lockapi.WriteJSON(w, http.StatusOK, c)
}

// handleHealth is the rail's own health, what rail-proxy's readiness asks: DOWN
// while the stub cannot book calls or is shutting down.
func (s *Stub) handleHealth(w http.ResponseWriter, r *http.Request) {
	up, comps := s.health.Ready(r.Context())
	status, code := "UP", http.StatusOK
	if !up {
		status, code = "DOWN", http.StatusServiceUnavailable
	}
	lockapi.WriteJSON(w, code, map[string]any{"status": status, "components": comps})
}
