package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/dbconn"
)

// ExceptionBook is paydb as `reconciler exceptions` sees it: the exceptions, the
// context an operator decides them from, and their decisions — the only place
// the command speaks SQL. It reads what the operators' login may read
// (PAYDB_ROLE_OPERATOR's section of internal/paydb/grants.sql) and writes one
// thing: a reconciliation_decision row, once per exception.
type ExceptionBook struct{ pool *pgxpool.Pool }

// NewExceptionBook is the book over pool; the caller closes the pool.
func NewExceptionBook(pool *pgxpool.Pool) *ExceptionBook { return &ExceptionBook{pool: pool} }

const exceptionColumns = `e.exception_id, e.kind, e.payout_id, e.seq, e.file_id, e.detail, e.created_at,
       d.decision, d.decided_by, d.note, d.decided_login, d.decided_at`

// listExceptionsSQL: $1 all (decided ones too), $2 the kind (empty for any), $3
// the limit. In exception id order: the order they were found in.
const listExceptionsSQL = `
SELECT ` + exceptionColumns + `
  FROM reconciliation_exception e
  LEFT JOIN reconciliation_decision d ON d.exception_id = e.exception_id
 WHERE ($1 OR d.exception_id IS NULL) AND ($2 = '' OR e.kind = $2)
 ORDER BY e.exception_id
 LIMIT $3`

const oneExceptionSQL = `
SELECT ` + exceptionColumns + `
  FROM reconciliation_exception e
  LEFT JOIN reconciliation_decision d ON d.exception_id = e.exception_id
 WHERE e.exception_id = $1`

func scanException(row pgx.Row) (Exception, error) {
	var e Exception
	var decision, by, note, login *string
	var at *time.Time
	if err := row.Scan(&e.ExceptionID, &e.Kind, &e.PayoutID, &e.Seq, &e.FileID, &e.Detail, &e.CreatedAt,
		&decision, &by, &note, &login, &at); err != nil {
		return e, err
	}
	if decision != nil {
		e.Decision = &Decision{Decision: *decision, DecidedBy: deref(by), Note: deref(note), DecidedLogin: deref(login), DecidedAt: deref(at)}
	}
	return e, nil
}

// List returns the exceptions opts selects, in id order, and whether more
// than opts.Limit matched.
func (b *ExceptionBook) List(ctx context.Context, opts ListOptions) (list []Exception, more bool, err error) {
	rows, err := b.pool.Query(ctx, listExceptionsSQL, opts.All, opts.Kind, opts.Limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list exceptions: %w", err)
	}
	list, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Exception, error) { return scanException(r) })
	if err != nil {
		return nil, false, fmt.Errorf("list exceptions: %w", err)
	}
	if len(list) > opts.Limit {
		return list[:opts.Limit], true, nil
	}
	return list, false, nil
}

// The context of one exception. The lines are those whose reference is the
// exception's payout, and the exception's own line (an UNKNOWN_REFERENCE names
// no payout); the files, every version of the name the exception's file row
// carries (the version imported and the one that changed).
const (
	contextPayoutSQL = `
SELECT payout_id, account_id, amount_minor, currency, beneficiary, status, fence_token, claimed_by,
       rail_reference, decline_reason, created_at, updated_at
  FROM payout WHERE payout_id = $1`
	contextHistorySQL = `
SELECT history_id, status, fence_token, owner_id, actor, rail_reference, decline_reason, recorded_at
  FROM payout_history WHERE payout_id = $1 ORDER BY history_id`
	contextSettlementSQL = `
SELECT outcome, rail_reference, decline_reason, statement_seq, settled_at
  FROM payout_settlement WHERE payout_id = $1`
	contextLinesSQL = `
SELECT seq, received_at, reference, account_id, amount_minor, currency, beneficiary, result,
       rail_reference, decline_reason, imported_at
  FROM rail_statement_line
 WHERE reference = $1 OR seq = $2
 ORDER BY seq`
	contextSubmissionsSQL = `
SELECT submission_id, account_id, presented_token, owner_id, submitter_identity, amount_minor, currency,
       beneficiary, outcome, rail_reference, decline_reason, submitted_at, resolved_at
  FROM rail_submission WHERE payout_id = $1 ORDER BY submission_id`
	contextFilesSQL = `
SELECT f.file_id, f.name, f.sha256, f.result, f.entries, f.imported_at
  FROM statement_file f
 WHERE f.name = (SELECT name FROM statement_file WHERE file_id = $1)
 ORDER BY f.file_id`
)

// Show returns exception id with its context, or ErrNoSuchException. The reads
// are one REPEATABLE READ transaction: one snapshot of paydb, so the payout, its
// history and its lines agree with each other.
func (b *ExceptionBook) Show(ctx context.Context, id int64) (ExceptionContext, error) {
	var c ExceptionContext
	tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return c, fmt.Errorf("show exception %d: %w", id, err)
	}
	defer rollback(ctx, tx)
	c.Exception, err = scanException(tx.QueryRow(ctx, oneExceptionSQL, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return c, fmt.Errorf("%w: %d", ErrNoSuchException, id)
	}
	if err != nil {
		return c, fmt.Errorf("show exception %d: %w", id, err)
	}
	payout := deref(c.PayoutID)
	if err := b.readContext(ctx, tx, &c, payout); err != nil {
		return c, fmt.Errorf("show exception %d: %w", id, err)
	}
	return c, nil
}

func (b *ExceptionBook) readContext(ctx context.Context, tx pgx.Tx, c *ExceptionContext, payout string) error {
	c.History, c.Lines, c.Submissions, c.Files = []ContextMove{}, []ContextLine{}, []ContextSubmission{}, []ContextFile{}
	if payout != "" {
		var p ContextPayout
		err := tx.QueryRow(ctx, contextPayoutSQL, payout).Scan(&p.PayoutID, &p.AccountID, &p.AmountMinor, &p.Currency,
			&p.Beneficiary, &p.Status, &p.FenceToken, &p.ClaimedBy, &p.RailReference, &p.DeclineReason, &p.CreatedAt, &p.UpdatedAt)
		switch {
		case err == nil:
			c.Payout = &p
		case !errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("payout: %w", err)
		}
		rows, _ := tx.Query(ctx, contextHistorySQL, payout)
		if c.History, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ContextMove, error) {
			var m ContextMove
			err := r.Scan(&m.HistoryID, &m.Status, &m.FenceToken, &m.OwnerID, &m.Actor, &m.RailReference, &m.DeclineReason, &m.RecordedAt)
			return m, err
		}); err != nil {
			return fmt.Errorf("payout history: %w", err)
		}
		var s ContextSettlement
		err = tx.QueryRow(ctx, contextSettlementSQL, payout).Scan(&s.Outcome, &s.RailReference, &s.DeclineReason, &s.StatementSeq, &s.SettledAt)
		switch {
		case err == nil:
			c.Settlement = &s
		case !errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("settlement: %w", err)
		}
		rows, _ = tx.Query(ctx, contextSubmissionsSQL, payout)
		if c.Submissions, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ContextSubmission, error) {
			var s ContextSubmission
			err := r.Scan(&s.SubmissionID, &s.AccountID, &s.PresentedToken, &s.OwnerID, &s.SubmitterIdentity, &s.AmountMinor,
				&s.Currency, &s.Beneficiary, &s.Outcome, &s.RailReference, &s.DeclineReason, &s.SubmittedAt, &s.ResolvedAt)
			return s, err
		}); err != nil {
			return fmt.Errorf("submissions: %w", err)
		}
	}
	if payout != "" || c.Seq != nil {
		var seq int64 // no line has seq 0: seqs start at 1
		if c.Seq != nil {
			seq = *c.Seq
		}
		rows, _ := tx.Query(ctx, contextLinesSQL, payout, seq)
		var err error
		if c.Lines, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ContextLine, error) {
			var l ContextLine
			err := r.Scan(&l.Seq, &l.ReceivedAt, &l.Reference, &l.AccountID, &l.AmountMinor, &l.Currency, &l.Beneficiary,
				&l.Result, &l.RailReference, &l.DeclineReason, &l.ImportedAt)
			return l, err
		}); err != nil {
			return fmt.Errorf("statement lines: %w", err)
		}
	}
	if c.FileID != nil {
		rows, _ := tx.Query(ctx, contextFilesSQL, *c.FileID)
		var err error
		if c.Files, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ContextFile, error) {
			var f ContextFile
			err := r.Scan(&f.FileID, &f.Name, &f.SHA256, &f.Result, &f.Entries, &f.ImportedAt)
			return f, err
		}); err != nil {
			return fmt.Errorf("statement files: %w", err)
		}
	}
	return nil
}

// insertDecisionSQL records a decision once. decided_login and decided_at are
// left to their defaults — the login writing, paydb's clock — and the
// operators' login may not set them. ON CONFLICT DO NOTHING waits for a
// concurrent decision on the same exception to commit or roll back, so of two
// operators deciding at once exactly one is recorded, and the other is told
// whose decision stands. A missing exception is the foreign key's refusal.
const insertDecisionSQL = `
INSERT INTO reconciliation_decision (exception_id, decision, decided_by, note)
VALUES ($1, $2, $3, $4)
ON CONFLICT (exception_id) DO NOTHING
RETURNING decision, decided_by, note, decided_login, decided_at`

const decisionSQL = `
SELECT decision, decided_by, note, decided_login, decided_at
  FROM reconciliation_decision WHERE exception_id = $1`

// foreignKeyViolation is PostgreSQL's SQLSTATE for a missing referenced row.
const foreignKeyViolation = "23503"

// Resolve records r on exception id and returns the decision as paydb holds
// it. A resolution Check refuses (ErrInvalidResolution) writes nothing and asks
// paydb nothing; an unknown id is ErrNoSuchException; an exception already
// decided is a *DecidedError carrying the decision that stands. It moves no
// payout and changes no exception.
func (b *ExceptionBook) Resolve(ctx context.Context, id int64, r Resolution) (Decision, error) {
	r, err := r.Check()
	if err != nil {
		return Decision{}, err
	}
	tx, err := dbconn.Begin(ctx, b.pool)
	if err != nil {
		return Decision{}, fmt.Errorf("resolve exception %d: %w", id, err)
	}
	defer rollback(ctx, tx)
	var d Decision
	err = tx.QueryRow(ctx, insertDecisionSQL, id, r.Decision, r.DecidedBy, r.Note).
		Scan(&d.Decision, &d.DecidedBy, &d.Note, &d.DecidedLogin, &d.DecidedAt)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == foreignKeyViolation:
		return Decision{}, fmt.Errorf("%w: %d", ErrNoSuchException, id)
	case errors.Is(err, pgx.ErrNoRows):
		// Decided before, or by a concurrent resolve that committed while this
		// one waited: a fresh snapshot (READ COMMITTED) sees it.
		var old Decision
		if err := tx.QueryRow(ctx, decisionSQL, id).Scan(&old.Decision, &old.DecidedBy, &old.Note, &old.DecidedLogin, &old.DecidedAt); err != nil {
			return Decision{}, fmt.Errorf("resolve exception %d: read the decision that stands: %w", id, err)
		}
		return Decision{}, &DecidedError{ExceptionID: id, Decision: old}
	case err != nil:
		return Decision{}, fmt.Errorf("resolve exception %d: %w", id, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Decision{}, fmt.Errorf("resolve exception %d: commit: %w", id, err)
	}
	return d, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
