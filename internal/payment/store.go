package payment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/dbconn"
	"lock.dev/lockapi"
)

// The store's verdicts. pgx stops here: callers see these, never a driver error.
var (
	// ErrNotFound: no payout has that id.
	ErrNotFound = errors.New("payout not found")
	// ErrUnavailable: paydb could not be reached, or did not answer within the
	// request's bound. For a post the outcome is then unknown to the caller (the
	// commit may have landed); reading the payout tells.
	ErrUnavailable = errors.New("paydb unavailable")
)

// FinalError refuses any call on a payout in a final state.
type FinalError struct{ Status string }

func (e *FinalError) Error() string { return "payout is final: " + e.Status }

// FencedError refuses a claim or a post whose token is not the one the payout
// accepts: for a claim, not above fence_token; for a post, not the claimant's.
type FencedError struct {
	Presented  int64
	FenceToken int64
	Status     string
	ClaimedBy  *string
	Reason     string // for the problem's detail and the log
}

func (e *FencedError) Error() string { return "fenced out: " + e.Reason }

// ConflictError refuses a create whose payoutId exists with other fields.
type ConflictError struct {
	Existing lockapi.Payout
	Fields   []string // the differing members, in request order
}

func (e *ConflictError) Error() string {
	return "payout exists with different " + strings.Join(e.Fields, ", ")
}

// store is payment-resource's view of paydb. It writes payout, ledger_entry,
// payout_settlement and payout_history; with the books check on it also reads
// the audit trail (rail_submission), the statement copy (rail_statement_line,
// reconciler_cursor) and the reconciler's UNSTORABLE_LINE exceptions, never
// writing them (docs/contracts/books.md).
type store struct {
	pool *pgxpool.Pool
	// books is PAYMENT_BOOKS_CHECK: posts and settles are checked against the
	// audit trail and the statement copy in their own transaction.
	books bool
	// settleAfter is PAYMENT_SETTLE_AFTER, the window a NOT_PRESENTED settle
	// waits for after the payout's attempt.
	settleAfter time.Duration
}

const payoutColumns = `payout_id, account_id, amount_minor, currency, beneficiary, status,
       fence_token, claimed_by, rail_reference, decline_reason, created_at, updated_at`

func scanPayout(row pgx.Row) (lockapi.Payout, error) {
	var p lockapi.Payout
	err := row.Scan(&p.PayoutID, &p.AccountID, &p.AmountMinor, &p.Currency, &p.Beneficiary, &p.Status,
		&p.FenceToken, &p.ClaimedBy, &p.RailReference, &p.DeclineReason, &p.CreatedAt, &p.UpdatedAt)
	p.CreatedAt, p.UpdatedAt = p.CreatedAt.UTC(), p.UpdatedAt.UTC()
	return p, err
}

// A move with its history: historyBegin + move + historyOwner + owner +
// historyActor + actor + historyEnd makes move, a write of one payout row
// RETURNING payoutColumns, record the payout as it left it in payout_history, in
// the same statement (so in the same transaction, at no extra round trip): one
// row per move, never one for a write that matched nothing. owner is the
// expression the row's owner_id takes; actor is the parameter holding the
// caller's verified SPIFFE ID (docs/contracts/workload-identity.md), "" when
// the service runs without identities, recorded as NULL: nobody was verified
// (docs/contracts/books.md, "The claim history").
const (
	historyBegin = `WITH moved AS (`
	historyOwner = `), history AS (
INSERT INTO payout_history (payout_id, status, fence_token, owner_id, actor, rail_reference, decline_reason)
SELECT payout_id, status, fence_token, `
	historyActor = `, NULLIF(`
	historyEnd   = `::text, ''), rail_reference, decline_reason FROM moved)
SELECT ` + payoutColumns + ` FROM moved`
)

// insertPayoutSQL creates the payout and its PENDING history row; a create that
// lost to an existing row inserts neither.
const insertPayoutSQL = historyBegin + `
INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (payout_id) DO NOTHING
RETURNING ` + payoutColumns + historyOwner + "NULL::text" + historyActor + "$6" + historyEnd

// Create inserts a PENDING payout. created is false when the payoutId already
// existed: with identical fields that is the same create again (no error), with
// other fields a *ConflictError. actor is the caller's verified workload, for
// the history.
func (s *store) Create(ctx context.Context, req lockapi.SubmissionRequest, actor string) (p lockapi.Payout, created bool, err error) {
	tx, err := s.begin(ctx)
	if err != nil {
		return lockapi.Payout{}, false, fmt.Errorf("create payout: %w", err)
	}
	defer rollback(ctx, tx)
	p, err = scanPayout(tx.QueryRow(ctx, insertPayoutSQL,
		req.PayoutID, req.AccountID, req.AmountMinor, req.Currency, req.Beneficiary, actor))
	created = err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return lockapi.Payout{}, false, classify("create payout", err)
	}
	if !created {
		// The insert lost to an existing row: ON CONFLICT waited for a concurrent
		// inserter to commit, and this second statement's snapshot (READ
		// COMMITTED) sees that row. Comparing after the insert, never before, is
		// what makes concurrent identical creates all succeed with one row.
		p, err = scanPayout(tx.QueryRow(ctx, selectPayoutSQL, req.PayoutID))
		if err != nil { // payouts are never deleted, so no row is a fault too
			return lockapi.Payout{}, false, classify("create payout: read the existing row", err)
		}
		if diff := differingFields(p, req); len(diff) > 0 {
			return p, false, &ConflictError{Existing: p, Fields: diff}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return lockapi.Payout{}, false, classify("create payout: commit", err)
	}
	return p, created, nil
}

func differingFields(p lockapi.Payout, req lockapi.SubmissionRequest) []string {
	var diff []string
	if p.AccountID != req.AccountID {
		diff = append(diff, "accountId")
	}
	if p.AmountMinor != req.AmountMinor {
		diff = append(diff, "amountMinor")
	}
	if p.Currency != req.Currency {
		diff = append(diff, "currency")
	}
	if p.Beneficiary != req.Beneficiary {
		diff = append(diff, "beneficiary")
	}
	return diff
}

const selectPayoutSQL = `SELECT ` + payoutColumns + ` FROM payout WHERE payout_id = $1`

// Get reads one payout.
func (s *store) Get(ctx context.Context, id string) (lockapi.Payout, error) {
	p, err := scanPayout(s.pool.QueryRow(ctx, selectPayoutSQL, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return lockapi.Payout{}, ErrNotFound
	}
	if err != nil {
		return lockapi.Payout{}, classify("read payout", err)
	}
	return p, nil
}

// listFilter selects payouts; empty or nil fields do not filter.
type listFilter struct {
	Status        string
	AccountID     string
	UpdatedBefore *time.Time
	Limit         int
}

// Two statements rather than "$1 IS NULL OR status = $1": a cached generic plan
// of the latter cannot use payout_status_idx, and executors poll by status.
const (
	listByStatusSQL = `SELECT ` + payoutColumns + ` FROM payout
 WHERE status = $1
   AND ($2::text IS NULL OR account_id = $2)
   AND ($3::timestamptz IS NULL OR updated_at < $3)
 ORDER BY updated_at, payout_id
 LIMIT $4`
	listAnySQL = `SELECT ` + payoutColumns + ` FROM payout
 WHERE ($1::text IS NULL OR account_id = $1)
   AND ($2::timestamptz IS NULL OR updated_at < $2)
 ORDER BY updated_at, payout_id
 LIMIT $3`
)

// List returns payouts oldest updatedAt first, payoutId breaking ties.
func (s *store) List(ctx context.Context, f listFilter) ([]lockapi.Payout, error) {
	var account, before any
	if f.AccountID != "" {
		account = f.AccountID
	}
	if f.UpdatedBefore != nil {
		before = *f.UpdatedBefore
	}
	var rows pgx.Rows
	var err error
	if f.Status != "" {
		rows, err = s.pool.Query(ctx, listByStatusSQL, f.Status, account, before, f.Limit)
	} else {
		rows, err = s.pool.Query(ctx, listAnySQL, account, before, f.Limit)
	}
	if err != nil {
		return nil, classify("list payouts", err)
	}
	defer rows.Close()
	out := []lockapi.Payout{}
	for rows.Next() {
		p, err := scanPayout(rows)
		if err != nil {
			return nil, classify("list payouts", err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, classify("list payouts", err)
	}
	return out, nil
}

// claimSQL is fence point (a), verbatim from docs/contracts/database.md: strict "<", so an
// equal token is a replay, not a new holder; a final payout never matches.
const claimSQL = `UPDATE payout SET status='CLAIMED', fence_token=$2, claimed_by=$3, updated_at=now()
 WHERE payout_id=$1 AND status IN ('PENDING','CLAIMED') AND fence_token < $2
RETURNING ` + payoutColumns

// explainSQL reads why a conditional UPDATE matched nothing. It only explains:
// the verdict was the UPDATE's.
const explainSQL = `SELECT status, fence_token, claimed_by FROM payout WHERE payout_id = $1`

// attempts bounds the re-runs of a conditional UPDATE whose explanation shows a
// row that would now match (see Claim); the state only moves forward, so a second
// run settles it.
const attempts = 3

// Claim takes the payout for token and owner at fence point (a). Refusals, in
// the contract's precedence: ErrNotFound, *FinalError, *FencedError.
func (s *store) Claim(ctx context.Context, id string, token int64, owner, actor string) (lockapi.Payout, error) {
	tx, err := s.begin(ctx)
	if err != nil {
		return lockapi.Payout{}, fmt.Errorf("claim payout: %w", err)
	}
	defer rollback(ctx, tx)
	p, err := claimInTx(ctx, tx, id, token, owner, actor)
	if err != nil {
		return lockapi.Payout{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return lockapi.Payout{}, classify("claim payout: commit", err)
	}
	return p, nil
}

// claimWithHistorySQL is claimSQL recording the claim, its token, owner and
// actor, in payout_history.
const claimWithHistorySQL = historyBegin + claimSQL + historyOwner + "claimed_by" + historyActor + "$4" + historyEnd

func claimInTx(ctx context.Context, tx pgx.Tx, id string, token int64, owner, actor string) (lockapi.Payout, error) {
	// fence_token only grows and final states never move, so a row the UPDATE
	// refused can look claimable only if it did not exist yet when the UPDATE's
	// snapshot was taken: updateOrExplain then runs the UPDATE again.
	return updateOrExplain(ctx, tx, "claim payout", id,
		func() (lockapi.Payout, error) {
			return scanPayout(tx.QueryRow(ctx, claimWithHistorySQL, id, token, owner, actor))
		},
		func(st payoutState) error {
			if st.fence >= token {
				return st.fenced(token, fmt.Sprintf("token %d is not greater than the payout's fence token %d", token, st.fence))
			}
			return nil
		})
}

// payoutState is what explainSQL reads of a payout a conditional update refused.
type payoutState struct {
	status    string
	fence     int64
	claimedBy *string
}

func (st payoutState) fenced(token int64, reason string) error {
	return &FencedError{Presented: token, FenceToken: st.fence, Status: st.status, ClaimedBy: st.claimedBy, Reason: reason}
}

// updateOrExplain runs a conditional UPDATE of payout id and, when it matched no
// row, reads the payout to say why, in the contract's precedence: ErrNotFound,
// then *FinalError, then judge's refusal. A row judge finds acceptable changed
// after the UPDATE's snapshot; READ COMMITTED gives each statement a fresh one, so
// the UPDATE runs again, a bounded number of times.
func updateOrExplain(ctx context.Context, tx pgx.Tx, op, id string,
	update func() (lockapi.Payout, error), judge func(payoutState) error) (lockapi.Payout, error) {
	for range attempts {
		p, err := update()
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return lockapi.Payout{}, classify(op, err)
		}
		var st payoutState
		err = tx.QueryRow(ctx, explainSQL, id).Scan(&st.status, &st.fence, &st.claimedBy)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return lockapi.Payout{}, ErrNotFound
		case err != nil:
			return lockapi.Payout{}, classify(op, err)
		case isFinal(st.status):
			return lockapi.Payout{}, &FinalError{Status: st.status}
		}
		if err := judge(st); err != nil {
			return lockapi.Payout{}, err
		}
	}
	return lockapi.Payout{}, fmt.Errorf("%s %s: state kept changing under %d attempts", op, id, attempts)
}

// postSQL: only the claimant posts: the row must be CLAIMED with exactly this
// token, presented by the owner that claimed with it.
const postSQL = `UPDATE payout SET status=$4, rail_reference=$5, decline_reason=$6, updated_at=now()
 WHERE payout_id=$1 AND status='CLAIMED' AND fence_token=$2 AND claimed_by=$3
RETURNING ` + payoutColumns

// postWithHistorySQL is postSQL recording the post, with the poster's token,
// owner and actor, in payout_history.
const postWithHistorySQL = historyBegin + postSQL + historyOwner + "claimed_by" + historyActor + "$7" + historyEnd

// ledgerSQL debits the account: amount_minor is the payout's amount negated.
const ledgerSQL = `INSERT INTO ledger_entry (payout_id, account_id, amount_minor, currency, posted_token)
VALUES ($1, $2, $3, $4, $5)`

// postUpdate is what a post writes.
type postUpdate struct {
	Outcome       string // PAID, DECLINED or AMBIGUOUS: the final status
	RailReference *string
	DeclineReason *string
}

// Post moves a CLAIMED payout to its final status. A PAID post writes its
// ledger_entry in the same transaction: both commit or neither does. Refusals,
// in the contract's precedence: ErrNotFound, *FinalError, *FencedError, then,
// with the books check on, *OutcomeNotRecordedError.
func (s *store) Post(ctx context.Context, id string, token int64, owner, actor string, u postUpdate) (lockapi.Payout, error) {
	tx, err := s.begin(ctx)
	if err != nil {
		return lockapi.Payout{}, fmt.Errorf("post payout: %w", err)
	}
	defer rollback(ctx, tx)
	if s.books {
		if u, err = bookedPostInTx(ctx, tx, id, token, owner, u); err != nil {
			return lockapi.Payout{}, err
		}
	}
	p, err := postInTx(ctx, tx, id, token, owner, actor, u)
	if err != nil {
		return lockapi.Payout{}, err
	}
	if p.Status == lockapi.StatusPaid {
		if _, err := tx.Exec(ctx, ledgerSQL, p.PayoutID, p.AccountID, -p.AmountMinor, p.Currency, token); err != nil {
			return lockapi.Payout{}, classify("post payout: ledger entry", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return lockapi.Payout{}, classify("post payout: commit", err)
	}
	return p, nil
}

func postInTx(ctx context.Context, tx pgx.Tx, id string, token int64, owner, actor string, u postUpdate) (lockapi.Payout, error) {
	// A row that matches on a second look had its claim with this token commit
	// after the UPDATE's snapshot (a post racing its own claim): run it again.
	return updateOrExplain(ctx, tx, "post payout", id,
		func() (lockapi.Payout, error) {
			return scanPayout(tx.QueryRow(ctx, postWithHistorySQL, id, token, owner, u.Outcome, u.RailReference, u.DeclineReason, actor))
		},
		judgePost(token, owner))
}

// judgePost explains why a payout is not the poster's to post: FENCED_OUT.
func judgePost(token int64, owner string) func(payoutState) error {
	return func(st payoutState) error {
		switch {
		case st.status != lockapi.StatusClaimed:
			return st.fenced(token, "the payout is not claimed")
		case st.fence != token:
			return st.fenced(token, fmt.Sprintf("token %d is not the claimant's token %d", token, st.fence))
		case st.claimedBy == nil || *st.claimedBy != owner:
			return st.fenced(token, "the payout was claimed with this token by another owner")
		}
		return nil
	}
}

// forwardable is the predicate of rail_submission_attempt_uidx: the payout's one
// attempt at the rail, resolved or not (docs/contracts/database.md).
const forwardable = `(s.outcome IS NULL OR s.outcome IN ('ACKED','REJECTED','TIMEOUT'))`

// bookedPostSQL reads the payout as postSQL would find it — CLAIMED with this
// token by this owner — locking it as the UPDATE would (so a concurrent claim or
// post is waited for and the row judged again, in READ COMMITTED), together
// with its forwardable attempt, if it has one. The attempt is read without a
// lock: a resolved row never changes, and an unresolved one is refused.
const bookedPostSQL = `SELECT ` + payoutColumns + `,
       a.submission_id, a.a_outcome, a.a_rail_reference, a.a_decline_reason,
       a.a_account_id, a.a_amount_minor, a.a_currency, a.a_beneficiary
  FROM payout
  LEFT JOIN LATERAL (
       SELECT s.submission_id, s.outcome AS a_outcome, s.rail_reference AS a_rail_reference,
              s.decline_reason AS a_decline_reason, s.account_id AS a_account_id,
              s.amount_minor AS a_amount_minor, s.currency AS a_currency, s.beneficiary AS a_beneficiary
         FROM rail_submission s
        WHERE s.payout_id = payout.payout_id AND ` + forwardable + `) a ON true
 WHERE payout_id = $1 AND status = 'CLAIMED' AND fence_token = $2 AND claimed_by = $3
   FOR UPDATE OF payout`

// bookedPostInTx checks a post against the audit trail (docs/contracts/books.md)
// and returns the update to make: u, with an omitted decline reason of a
// DECLINED post taken from the attempt. The payout is judged first, exactly as
// the post's UPDATE judges it, so ErrNotFound, *FinalError and *FencedError come
// before *OutcomeNotRecordedError.
func bookedPostInTx(ctx context.Context, tx pgx.Tx, id string, token int64, owner string, u postUpdate) (postUpdate, error) {
	var a attempt
	p, err := updateOrExplain(ctx, tx, "post payout: read the payout and its attempt", id,
		func() (lockapi.Payout, error) {
			var p lockapi.Payout
			var submission *int64
			var amount *int64
			var account, currency, beneficiary *string
			err := tx.QueryRow(ctx, bookedPostSQL, id, token, owner).Scan(
				&p.PayoutID, &p.AccountID, &p.AmountMinor, &p.Currency, &p.Beneficiary, &p.Status,
				&p.FenceToken, &p.ClaimedBy, &p.RailReference, &p.DeclineReason, &p.CreatedAt, &p.UpdatedAt,
				&submission, &a.Outcome, &a.RailReference, &a.DeclineReason, &account, &amount, &currency, &beneficiary)
			if err != nil {
				return p, err
			}
			a.Found = submission != nil
			if a.Found {
				a.SubmissionID, a.AccountID, a.AmountMinor, a.Currency, a.Beneficiary =
					*submission, deref(account), deref(amount), deref(currency), deref(beneficiary)
			}
			return p, nil
		},
		judgePost(token, owner))
	if err != nil {
		return u, err
	}
	return postVerdict(p, a, u)
}

func deref[T any](v *T) T {
	var zero T
	if v == nil {
		return zero
	}
	return *v
}

// settleSQL: only an AMBIGUOUS payout is settled (docs/contracts/reconciliation.md), and only once:
// a second settle finds it final. fence_token and claimed_by stay as the last
// claimant left them; the ledger entry is posted with that token. The settle is
// recorded in payout_history with no owner (the statement, not a holder, moved
// it) and the settling workload as actor.
const settleSQL = historyBegin + `UPDATE payout SET status=$2, rail_reference=$3, decline_reason=$4, updated_at=now()
 WHERE payout_id=$1 AND status='AMBIGUOUS'
RETURNING ` + payoutColumns + historyOwner + "NULL::text" + historyActor + "$5" + historyEnd

// settleEvidenceSQL locks the AMBIGUOUS payout as settleSQL would (a concurrent
// settle is waited for, and the row judged again) and reads what the statement
// copy says beyond its lines: how far it covers the rail's books for this
// payout, and whether that is later than the payout's forwardable attempt's
// submitted_at (with none, the payout's updated_at) plus PAYMENT_SETTLE_AFTER
// ($2, in microseconds), all on paydb's clock as the reconciler judges it; and
// whether a line of this payout could not be copied (an UNSTORABLE_LINE
// exception names it). What the copy covers is the later of the cursor's
// read_at (the start of the last complete read through rail-proxy) and the
// payout's account's coverage (statement files imported,
// statement_coverage): each proves the copy holds everything the rail had
// booked before it, and a reconciler sets only its own mode's, so this is
// right whichever mode it runs in (docs/contracts/reconciliation.md).
const settleEvidenceSQL = `SELECT ` + payoutColumns + `,
       greatest(c.read_at, v.covered_to),
       coalesce(greatest(c.read_at, v.covered_to) > coalesce(a.submitted_at, payout.updated_at) + $2 * interval '1 microsecond', false),
       EXISTS (SELECT 1 FROM reconciliation_exception e
                WHERE e.kind = 'UNSTORABLE_LINE' AND e.payout_id = payout.payout_id)
  FROM payout
  LEFT JOIN reconciler_cursor c ON true
  LEFT JOIN LATERAL (SELECT v.covered_to FROM statement_coverage v WHERE v.account_id = payout.account_id) v ON true
  LEFT JOIN LATERAL (SELECT s.submitted_at FROM rail_submission s
                      WHERE s.payout_id = payout.payout_id AND ` + forwardable + `) a ON true
 WHERE payout_id = $1 AND status = 'AMBIGUOUS'
   FOR UPDATE OF payout`

// statementLinesSQL reads the statement copy's lines of one payout, in the
// rail's order.
const statementLinesSQL = `SELECT seq, result, account_id, amount_minor, currency, beneficiary, rail_reference, decline_reason
  FROM rail_statement_line WHERE reference = $1 ORDER BY seq`

// settlementSQL records what moved the payout, for the repeat check and the audit.
const settlementSQL = `INSERT INTO payout_settlement (payout_id, outcome, rail_reference, decline_reason, statement_seq)
VALUES ($1, $2, $3, $4, $5)`

// selectSettlementSQL reads the settle that moved a payout, if one did.
const selectSettlementSQL = `SELECT outcome, rail_reference, decline_reason, statement_seq
  FROM payout_settlement WHERE payout_id = $1`

// SettleStatusError refuses a settle of a payout that is not AMBIGUOUS and not
// final: an executor still owns it (PENDING or CLAIMED).
type SettleStatusError struct{ Status string }

func (e *SettleStatusError) Error() string { return "payout is " + e.Status + ", not AMBIGUOUS" }

// Settle moves an AMBIGUOUS payout to the outcome the rail's statement proves. A
// PAID settle writes its ledger entry in the same transaction, posted with the
// payout's fence token. moved is false for a repeat identical to the settle that
// moved the payout: nothing is written. Refusals: ErrNotFound; *FinalError (a
// final payout, however it got there, unless the repeat is identical);
// *SettleStatusError (PENDING or CLAIMED).
func (s *store) Settle(ctx context.Context, id string, u lockapi.SettleRequest, actor string) (p lockapi.Payout, moved bool, err error) {
	tx, err := s.begin(ctx)
	if err != nil {
		return lockapi.Payout{}, false, fmt.Errorf("settle payout: %w", err)
	}
	defer rollback(ctx, tx)
	if s.books {
		err := s.checkSettle(ctx, tx, id, u)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			// Not AMBIGUOUS (any more): a repeat, a final payout or one an
			// executor owns, explained as without the check.
			return s.explainSettle(ctx, tx, id, u)
		case err != nil:
			return lockapi.Payout{}, false, err
		}
	}
	p, err = scanPayout(tx.QueryRow(ctx, settleSQL, id, u.Outcome, u.RailReference, u.DeclineReason, actor))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Not AMBIGUOUS (any more). Under READ COMMITTED this statement sees a
		// concurrent settle that committed while the UPDATE waited for the row.
		return s.explainSettle(ctx, tx, id, u)
	case err != nil:
		return lockapi.Payout{}, false, classify("settle payout", err)
	}
	if _, err := tx.Exec(ctx, settlementSQL, id, u.Outcome, u.RailReference, u.DeclineReason, u.StatementSeq); err != nil {
		return lockapi.Payout{}, false, classify("settle payout: settlement record", err)
	}
	if p.Status == lockapi.StatusPaid {
		if _, err := tx.Exec(ctx, ledgerSQL, p.PayoutID, p.AccountID, -p.AmountMinor, p.Currency, p.FenceToken); err != nil {
			return lockapi.Payout{}, false, classify("settle payout: ledger entry", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return lockapi.Payout{}, false, classify("settle payout: commit", err)
	}
	return p, true, nil
}

// checkSettle checks a settle against the statement copy in tx
// (docs/contracts/books.md), after locking the AMBIGUOUS payout. It returns
// pgx.ErrNoRows when the payout is not AMBIGUOUS (the caller explains that as a
// settle does without the check), and a *SettleContradictsError when the
// statement copy does not say what the settle says.
func (s *store) checkSettle(ctx context.Context, tx pgx.Tx, id string, u lockapi.SettleRequest) error {
	var p lockapi.Payout
	var ev statementEvidence
	err := tx.QueryRow(ctx, settleEvidenceSQL, id, s.settleAfter.Microseconds()).Scan(
		&p.PayoutID, &p.AccountID, &p.AmountMinor, &p.Currency, &p.Beneficiary, &p.Status,
		&p.FenceToken, &p.ClaimedBy, &p.RailReference, &p.DeclineReason, &p.CreatedAt, &p.UpdatedAt,
		&ev.ReadAt, &ev.WindowPassed, &ev.Unstorable)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return err
	case err != nil:
		return classify("settle payout: read the payout and the statement's read", err)
	}
	rows, err := tx.Query(ctx, statementLinesSQL, id)
	if err != nil {
		return classify("settle payout: read the statement lines", err)
	}
	ev.Lines, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (statementLine, error) {
		var l statementLine
		err := r.Scan(&l.Seq, &l.Result, &l.AccountID, &l.AmountMinor, &l.Currency, &l.Beneficiary, &l.RailReference, &l.DeclineReason)
		return l, err
	})
	if err != nil {
		return classify("settle payout: read the statement lines", err)
	}
	return settleVerdict(p, ev, u)
}

// explainSettle says why settleSQL matched nothing: no such payout, a repeat of
// the settle that moved it (the payout as it is, moved false), a final payout, or
// one an executor still owns.
func (s *store) explainSettle(ctx context.Context, tx pgx.Tx, id string, u lockapi.SettleRequest) (lockapi.Payout, bool, error) {
	p, err := scanPayout(tx.QueryRow(ctx, selectPayoutSQL, id))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return lockapi.Payout{}, false, ErrNotFound
	case err != nil:
		return lockapi.Payout{}, false, classify("settle payout: read the payout", err)
	case p.Status == lockapi.StatusAmbiguous:
		// Only a settle moves an AMBIGUOUS payout, and one just failed to: a
		// concurrent settle rolled back. The caller may try again.
		return lockapi.Payout{}, false, fmt.Errorf("settle payout %s: AMBIGUOUS but not updated: %w", id, ErrUnavailable)
	case !isFinal(p.Status):
		return lockapi.Payout{}, false, &SettleStatusError{Status: p.Status}
	}
	var prev lockapi.SettleRequest
	err = tx.QueryRow(ctx, selectSettlementSQL, id).Scan(&prev.Outcome, &prev.RailReference, &prev.DeclineReason, &prev.StatementSeq)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return lockapi.Payout{}, false, &FinalError{Status: p.Status} // an executor made it final
	case err != nil:
		return lockapi.Payout{}, false, classify("settle payout: read the settlement", err)
	case sameSettle(prev, u):
		return p, false, nil
	}
	return lockapi.Payout{}, false, &FinalError{Status: p.Status}
}

func sameSettle(a, b lockapi.SettleRequest) bool {
	return a.Outcome == b.Outcome && eqPtr(a.RailReference, b.RailReference) &&
		eqPtr(a.DeclineReason, b.DeclineReason) && eqPtr(a.StatementSeq, b.StatementSeq)
}

func eqPtr[T comparable](a, b *T) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// isFinal: nothing moves a payout out of PAID, DECLINED or NOT_PRESENTED, and no
// executor moves one out of AMBIGUOUS (only a settle does, docs/contracts/database.md).
func isFinal(status string) bool {
	return status == lockapi.StatusPaid || status == lockapi.StatusDeclined || status == lockapi.StatusAmbiguous ||
		status == lockapi.StatusNotPresented
}

// setStatementTimeoutSQL bounds the rest of a transaction's statements on the
// server. At the context's deadline pgx drops the connection and sends the
// server a cancel request, but that request is best effort and races the
// statement. So every write runs in an explicit transaction — a statement that
// finishes after its client left can then never commit (an autocommitted UPDATE
// waiting on a row lock did, in testing, after its request had answered 503) —
// and the server stops the statement at the same bound by itself.
const setStatementTimeoutSQL = `SELECT set_config('statement_timeout', $1, true)`

// begin opens a transaction whose statements the server itself stops at ctx's
// deadline. So a request that answers 503 has written nothing — unless the
// bound ran out during COMMIT, the one moment whose outcome a client cannot know.
//
// dbconn.Begin makes the COMMIT wait for paydb's synchronous standby and reports
// a wait that was cancelled (dbconn.ErrCommitNotDurable, classified unavailable:
// 503). The statement_timeout set here never silently cancels that wait:
// PostgreSQL disarms statement_timeout before it commits (finish_xact_command,
// PostgreSQL 13 and later; dbconn's TestStatementTimeoutDoesNotCancelTheSyncWait holds a
// COMMIT past it). Were a cancel ever to reach the wait, its warning would be
// caught and answered 503 all the same. The client's own deadline during the wait
// closes the connection: 503, the outcome unknown, as for any lost COMMIT answer.
func (s *store) begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := dbconn.Begin(ctx, s.pool)
	if err != nil {
		return nil, classify("begin", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		ms := time.Until(dl).Milliseconds()
		if ms < 1 {
			rollback(ctx, tx)
			return nil, classify("begin", context.DeadlineExceeded)
		}
		if _, err := tx.Exec(ctx, setStatementTimeoutSQL, strconv.FormatInt(ms, 10)); err != nil {
			rollback(ctx, tx)
			return nil, classify("begin", err)
		}
	}
	return tx, nil
}

// rollback ends tx if it is still open. It runs detached from the request and
// briefly bounded, so a cancelled request never leaves a transaction open.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = tx.Rollback(rctx)
}

// classify wraps err, marking it ErrUnavailable when paydb could not be reached
// or did not answer in time; anything else is a fault of ours (500).
func classify(op string, err error) error {
	if unavailable(err) {
		return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

func unavailable(err error) bool {
	// A commit the synchronous standby did not confirm is not durable, so it did
	// not happen: paydb did not take the write.
	if errors.Is(err, dbconn.ErrCommitNotDurable) {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || pgconn.Timeout(err) {
		return true
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// 08 connection exception, 53 insufficient resources, 57 operator
		// intervention (cancelled, shutting down, cannot connect now).
		return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "53") || strings.HasPrefix(pe.Code, "57")
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || pgconn.SafeToRetry(err)
}
