package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"lock.dev/lockapi"
)

// settleBatch is how many AMBIGUOUS payouts a pass reads at a time.
const settleBatch = 500

// reconciler runs passes. Its state is paydb's: a pass can stop anywhere (a crash,
// a failed step) and the next one, on this process or another, takes up from the
// durable cursor; every write it makes is idempotent.
type reconciler struct {
	store       *store
	statement   *statementClient // proxy mode
	files       *statementDir    // dir mode
	settles     *settleClient
	metrics     *metrics
	logger      *slog.Logger
	settleAfter time.Duration
}

// PassReport is what one pass did.
type PassReport struct {
	Skipped    bool              // another reconciler held the pass lock
	Imported   int64             // statement lines newly copied
	LastSeq    int64             // the cursor after the pass
	Settled    map[string]string // payoutId → the status it was settled to
	Exceptions map[string]int    // newly recorded, by kind
	Files      map[string]int    // dir mode: statement files looked at, by result (imported, unchanged, changed, invalid)
	Ambiguous  int64             // AMBIGUOUS payouts left
	Overdue    int64             // intents unresolved past the janitor's bound (see countOverdue)
	Refused    int               // settles payment-resource refused (409/404/400)
	Elapsed    time.Duration     // time the pass held the lock
}

// SettledTo counts the payouts the pass settled to status.
func (r PassReport) SettledTo(status string) int {
	n := 0
	for _, s := range r.Settled {
		if s == status {
			n++
		}
	}
	return n
}

// pass runs one pass (docs/contracts/reconciliation.md), top to bottom.
func (r *reconciler) pass(ctx context.Context) (rep PassReport, err error) {
	rep = PassReport{Settled: map[string]string{}, Exceptions: map[string]int{}, Files: map[string]int{}}

	// Step 4 first, since it guards the rest: several reconcilers may run, and a
	// pass holds a session advisory lock on paydb for its whole length. Another
	// reconciler's pass in progress means this one is skipped, not queued: the
	// next interval comes soon enough, and two passes never race over the same
	// settles and counts.
	ss, ok, err := r.store.lockPass(ctx)
	if err != nil {
		return rep, err
	}
	if !ok {
		rep.Skipped = true
		return rep, nil
	}
	began := time.Now()
	defer func() {
		ss.release()
		rep.Elapsed = time.Since(began)
	}()

	// Step 1: note paydb's now() as the pass start, then import every new line
	// from the cursor on, page by page; each page and the cursor move in one
	// transaction, idempotent by seq, so a pass that dies part-way leaves a cursor
	// that is exactly as far as the copy. When a page comes back with next null
	// the whole statement has been read, and read_at becomes the pass start:
	// everything the rail had recorded before that moment is now in the copy.
	cur, err := ss.start(ctx)
	if err != nil {
		return rep, err
	}
	rep.LastSeq = cur.lastSeq
	if r.files != nil {
		// Dir mode: the statement files that appeared, each imported in one
		// transaction with the coverage of its accounts; read_at is not
		// this mode's (docs/contracts/reconciliation.md).
		if err := r.importFiles(ctx, ss, &rep); err != nil {
			return rep, err
		}
	} else if err := r.importPages(ctx, ss, cur, &rep); err != nil {
		return rep, err
	}
	return r.settleAndCheck(ctx, ss, rep)
}

// importPages is step 1 in proxy mode: every new page of the statement read
// through rail-proxy, from the cursor on.
func (r *reconciler) importPages(ctx context.Context, ss *session, cur cursor, rep *PassReport) error {
	after := cur.lastSeq
	for {
		page, err := r.statement.page(ctx, after, pageLimit)
		if err != nil {
			return err
		}
		last, readAt := after, (*time.Time)(nil)
		if n := len(page.Lines); n > 0 {
			last = page.Lines[n-1].Seq
		}
		if page.Next == nil {
			readAt = &cur.passStart
		}
		imported, recorded, repeated, err := ss.importPage(ctx, page.Lines, last, readAt)
		if err != nil {
			return err
		}
		r.noteRepeated(repeated, "")
		rep.Imported += imported
		rep.LastSeq = last
		r.metrics.linesImported.Add(float64(imported))
		r.metrics.statementSeq.Set(float64(last))
		r.noteExceptions(rep, recorded)
		if page.Next == nil {
			return nil
		}
		after = *page.Next
	}
}

// settleAndCheck is steps 2 and 3 of a pass, and its counts.
func (r *reconciler) settleAndCheck(ctx context.Context, ss *session, rep PassReport) (PassReport, error) {
	// Step 2: settle each AMBIGUOUS payout from its lines, the rules in their
	// order. Settles go through payment-resource's endpoint, never into payout
	// directly: the ledger entry of a PAID settle is payment-resource's to write,
	// in the same transaction as the status.
	if err := r.settleAmbiguous(ctx, ss, &rep); err != nil {
		return rep, err
	}

	// Step 3: cross-check the lines and the books. The checks a line proves on its
	// own ran with its import (step 1); these depend on the payouts' current
	// status, so they look at every line and payout each pass — and at the
	// CLAIMED payouts whose own holder presented them otherwise than booked
	// (ATTEMPT_MISMATCH), which no statement line shows: the gate never called
	// the rail. The unique index
	// records each exception once; only new rows are logged and counted. An
	// exception never settles or unsettles anything.
	recorded, err := ss.crossCheck(ctx, r.settleAfter)
	r.noteExceptions(&rep, recorded)
	if err != nil {
		return rep, err
	}

	left, err := ss.countAmbiguous(ctx)
	if err != nil {
		return rep, err
	}
	rep.Ambiguous = left
	r.metrics.ambiguous.Set(float64(left))

	// Not a step of the pass of docs/contracts/reconciliation.md, but paydb ground
	// truth only this process looks at while every rail-proxy may be down: intents
	// no janitor has resolved long after they were due.
	overdue, err := ss.countOverdue(ctx)
	if err != nil {
		return rep, err
	}
	rep.Overdue = overdue
	r.metrics.overdue.Set(float64(overdue))
	return rep, nil
}

// settleAmbiguous is step 2 over every AMBIGUOUS payout, a batch at a time.
func (r *reconciler) settleAmbiguous(ctx context.Context, ss *session, rep *PassReport) error {
	afterID := ""
	for {
		cands, err := ss.ambiguous(ctx, r.settleAfter, afterID, settleBatch)
		if err != nil {
			return err
		}
		for _, c := range cands {
			if err := r.settleOne(ctx, ss, c, rep); err != nil {
				return err
			}
		}
		if len(cands) < settleBatch {
			return nil
		}
		afterID = cands[len(cands)-1].PayoutID
	}
}

// settleOne applies the rules of docs/contracts/reconciliation.md to one AMBIGUOUS
// payout, in their order.
func (r *reconciler) settleOne(ctx context.Context, ss *session, c candidate, rep *PassReport) error {
	// A line of this payout could not be copied (UNSTORABLE_LINE, recorded at
	// its import): what it says — money moved, or declined — is unreadable, so
	// nothing is settled, least of all NOT_PRESENTED for want of a line. The
	// payout stays AMBIGUOUS until a person decides.
	if c.Unstorable {
		return nil
	}
	// A line whose account, amount or currency is not the payout's, or whose
	// beneficiary is not (compared as IBANs; a line copied before lines carried a
	// beneficiary is not compared): the statement and the books describe
	// different payments under one reference — the rail may have paid someone
	// else. Nothing is settled from it, PAID least of all; the payout stays
	// AMBIGUOUS until a person decides. A line that differs in both is
	// AMOUNT_MISMATCH only.
	mismatch := false
	for _, l := range c.Lines {
		seq, id := l.Seq, c.PayoutID
		var e exception
		switch {
		case l.AccountID != c.AccountID || l.AmountMinor != c.AmountMinor || l.Currency != c.Currency:
			e = exception{Kind: KindAmountMismatch, PayoutID: &id, Seq: &seq, Detail: fmt.Sprintf(
				"%s line at seq %d is %d %s on %s; the payout is %d %s on %s",
				l.Result, l.Seq, l.AmountMinor, l.Currency, l.AccountID, c.AmountMinor, c.Currency, c.AccountID)}
		case l.Beneficiary != nil && !lockapi.SameBeneficiary(*l.Beneficiary, c.Beneficiary):
			e = exception{Kind: KindBeneficiaryMismatch, PayoutID: &id, Seq: &seq, Detail: fmt.Sprintf(
				"%s line at seq %d is %d %s on %s to beneficiary %s; the payout's beneficiary is %s",
				l.Result, l.Seq, l.AmountMinor, l.Currency, l.AccountID,
				lockapi.MaskBeneficiary(*l.Beneficiary), lockapi.MaskBeneficiary(c.Beneficiary))}
		default:
			continue
		}
		mismatch = true
		recorded, err := ss.record(ctx, e)
		if err != nil {
			return err
		}
		if recorded {
			r.noteExceptions(rep, []exception{e})
		}
	}
	if mismatch {
		return nil
	}

	var req lockapi.SettleRequest
	first := func(result string) *line {
		for i := range c.Lines {
			if c.Lines[i].Result == result {
				return &c.Lines[i]
			}
		}
		return nil
	}
	switch accepted, declined := first(lockapi.ResultAccepted), first(lockapi.ResultDeclined); {
	case accepted != nil:
		// The rail took the money: PAID, from the first ACCEPTED line. A second
		// ACCEPTED line is a double payment, recorded as PRESENTED_TWICE; the
		// payout is still paid once in the books.
		req = lockapi.SettleRequest{Outcome: lockapi.StatusPaid, RailReference: accepted.RailReference, StatementSeq: &accepted.Seq}
		if req.RailReference == nil || *req.RailReference == "" {
			// PAID needs the rail's reference; a statement without one is not
			// something to book from.
			r.logger.Error("ACCEPTED line without a rail reference; the payout stays AMBIGUOUS", "event", "settle_skipped",
				"payoutId", c.PayoutID, "seq", accepted.Seq)
			return nil
		}
	case declined != nil:
		// The rail declined it: no money moved.
		req = lockapi.SettleRequest{Outcome: lockapi.StatusDeclined, DeclineReason: declined.DeclineReason, StatementSeq: &declined.Seq}
	case c.WindowPassed:
		// No line at all, and the statement was read in full later than the
		// attempt's submitted_at plus the settle window, all on paydb's clock. The
		// rail records a call within that window of it being sent (the assumption
		// this rests on; rail-stub records a call before anything else), so the
		// rail never received it: no money moved, final. Should a line turn up
		// after all, step 3 records LINE_CONTRADICTS_PAYOUT; nothing books it.
		req = lockapi.SettleRequest{Outcome: lockapi.StatusNotPresented}
	default:
		// The call may still be on its way into the rail's books: a later pass.
		return nil
	}

	v, p, err := r.settles.settle(ctx, c.PayoutID, req)
	if err != nil {
		return err
	}
	switch v {
	case settleDone:
		to := strings.ToLower(req.Outcome)
		rep.Settled[c.PayoutID] = req.Outcome
		r.metrics.settled.WithLabelValues(to).Inc()
		r.logger.Info("AMBIGUOUS payout settled from the rail's statement", "event", "payout_settled",
			"payoutId", c.PayoutID, "outcome", req.Outcome, "statementSeq", req.StatementSeq,
			"railReference", req.RailReference, "accountId", c.AccountID)
	default:
		rep.Refused++
		level, why := slog.LevelWarn, "payment-resource refused the settle"
		if v == settleMalformed {
			level, why = slog.LevelError, "payment-resource refused the settle as malformed (a bug)"
		}
		attrs := []any{"event", "settle_refused", "payoutId", c.PayoutID, "outcome", req.Outcome, "statementSeq", req.StatementSeq}
		if p != nil {
			attrs = append(attrs, "status", p.Status, "code", p.Code, "detail", p.Detail)
		}
		r.logger.Log(ctx, level, why+"; the payout is left as it is", attrs...)
	}
	return nil
}

// noteRepeated logs the ACCEPTED lines left out of an import as already in the
// copy (file: the statement file, "" for the statement read through rail-proxy).
func (r *reconciler) noteRepeated(lines []lockapi.StatementLine, file string) {
	for _, l := range lines {
		attrs := []any{"event", "statement_line_repeated", "reference", l.Reference, "accountId", l.AccountID,
			"railReference", l.RailReference, "amountMinor", l.AmountMinor, "currency", l.Currency}
		if file != "" {
			attrs = append(attrs, "file", file)
		} else {
			attrs = append(attrs, "seq", l.Seq)
		}
		r.logger.Info("statement line already copied under its account and rail reference: not copied again", attrs...)
	}
}

// noteExceptions logs and counts exceptions newly recorded.
func (r *reconciler) noteExceptions(rep *PassReport, es []exception) {
	for _, e := range es {
		rep.Exceptions[e.Kind]++
		r.metrics.exceptions.WithLabelValues(strings.ToLower(e.Kind)).Inc()
		r.logger.Error("reconciliation exception: the statement and the books disagree; a person decides",
			"event", "reconciliation_exception", "kind", e.Kind, "payoutId", e.PayoutID, "seq", e.Seq, "fileId", e.FileID, "detail", e.Detail)
	}
}

// runPass runs one pass and records its outcome in the metrics and the log.
func (r *reconciler) runPass(ctx context.Context) (PassReport, error) {
	rep, err := r.pass(ctx)
	switch {
	case rep.Skipped:
		r.metrics.passes.WithLabelValues(passSkipped).Inc()
		r.logger.Debug("pass skipped: another reconciler holds the pass lock", "event", "reconcile_pass_skipped")
		return rep, nil
	case err != nil:
		r.metrics.passes.WithLabelValues(passFailed).Inc()
		if rep.Elapsed > 0 {
			r.metrics.passSeconds.Observe(rep.Elapsed.Seconds())
		}
		if ctx.Err() == nil {
			level := slog.LevelWarn
			if errors.Is(err, errSettleBroken) {
				level = slog.LevelError
			}
			r.logger.Log(ctx, level, "pass failed; the next pass takes up from the cursor", "event", "reconcile_pass_failed",
				"error", err.Error(), "imported", rep.Imported, "settled", len(rep.Settled))
		}
		return rep, err
	}
	r.metrics.passes.WithLabelValues(passCompleted).Inc()
	r.metrics.passSeconds.Observe(rep.Elapsed.Seconds())
	level := slog.LevelDebug
	if rep.Imported > 0 || rep.Files[fileImported] > 0 || rep.Files[fileChanged] > 0 || len(rep.Settled) > 0 || len(rep.Exceptions) > 0 || rep.Refused > 0 {
		level = slog.LevelInfo
	}
	r.logger.Log(ctx, level, "pass completed", "event", "reconcile_pass", "imported", rep.Imported, "lastSeq", rep.LastSeq,
		"settledPaid", rep.SettledTo(lockapi.StatusPaid), "settledDeclined", rep.SettledTo(lockapi.StatusDeclined),
		"settledNotPresented", rep.SettledTo(lockapi.StatusNotPresented), "exceptions", rep.Exceptions, "files", rep.Files, "refused", rep.Refused, "ambiguousLeft", rep.Ambiguous,
		"elapsedMs", rep.Elapsed.Milliseconds())
	return rep, nil
}
