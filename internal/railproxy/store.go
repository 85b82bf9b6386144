package railproxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/dbconn"
	"lock.dev/lockapi"
)

// This file is the only one that speaks SQL or knows pgx. It speaks the domain
// upwards: verdicts, attempts and the two errors below, never driver types.

// Submission is one admission attempt as the caller presented it.
type Submission struct {
	PayoutID       string
	AccountID      string
	Token          int64
	OwnerID        string
	IdempotencyKey string
	AmountMinor    int64
	Currency       string
	Beneficiary    string
	// SubmitterIdentity is the verified SPIFFE ID of the workload that presented
	// it (docs/contracts/workload-identity.md), recorded on its row; "" (NULL)
	// when the proxy runs without identities.
	SubmitterIdentity string
}

// submitter is s's SubmitterIdentity as a statement's parameter: NULL when no
// caller was verified.
func (s Submission) submitter() any {
	if s.SubmitterIdentity == "" {
		return nil
	}
	return s.SubmitterIdentity
}

// Verdict is what the admission transaction decided.
type Verdict int

// The verdicts of steps 1–3.
const (
	Admitted  Verdict = iota + 1 // intent committed with outcome NULL: forward it
	Fenced                       // FENCED row committed: token ≤ mark
	Duplicate                    // DUPLICATE row committed: the payout has a forwardable row
	Unbooked                     // UNBOOKED row committed: the books refused it (Admission.Mismatch says why)
)

// Attempt is the part of a rail_submission row an answer describes.
type Attempt struct {
	SubmissionID  int64
	SubmittedAt   time.Time
	Outcome       *string // nil while unresolved
	RailReference *string
	DeclineReason *string
	// What the attempt presented (filled by firstAttempt, for a DUPLICATE
	// answer's first* members): the executor adopts the first outcome only when
	// these equal its payout's (docs/contracts/books.md).
	AccountID   string
	AmountMinor int64
	Currency    string
	Beneficiary string
	// InTime: resolved before its interrupt_at, so not by a janitor, which only
	// resolves rows past it (read by Store.Attempt only).
	InTime bool
}

// Admission is the committed result of steps 1–3.
type Admission struct {
	Verdict      Verdict
	SubmissionID int64
	SubmittedAt  time.Time
	PassedFence  bool     // the upsert returned its row (false with fencing off means admitted anyway)
	HighestToken int64    // Fenced: the mark that refused the token, read under its row lock
	First        *Attempt // Duplicate: the payout's forwardable row (nil only if it vanished, see firstAttempt)
	Mismatch     string   // Unbooked: the first books check that failed (lockapi.BooksMismatchOrder)
}

// CommitError is a failed admission transaction: paydb could not take the attempt
// in time. Unsure is false when the transaction certainly did not commit (nothing
// was written); true when COMMIT was sent and its answer lost, in which case
// SubmissionID names the row that may exist.
type CommitError struct {
	SubmissionID int64
	Intent       bool // the row at stake is an intent (outcome NULL), not a FENCED/UNBOOKED/DUPLICATE row
	Unsure       bool
	// BackendPID is the paydb backend that was sent the COMMIT (when Unsure): until
	// its transaction is over, a row not found may still be committed.
	BackendPID uint32
	Err        error
}

func (e *CommitError) Error() string { return "admission transaction: " + e.Err.Error() }
func (e *CommitError) Unwrap() error { return e.Err }

// ErrNoRow says a row looked up by id does not exist.
var ErrNoRow = errors.New("no such rail_submission row")

// Store is rail_high_water and rail_submission on paydb's primary.
type Store struct {
	pool *pgxpool.Pool
}

// OpenStore opens the paydb pool. It does not wait for the server.
func OpenStore(ctx context.Context, url string, maxConns int) (*Store, error) {
	pool, err := dbconn.Open(ctx, url, int32(maxConns))
	if err != nil {
		return nil, err
	}
	return &Store{pool: pool}, nil
}

// Close closes the pool.
func (s *Store) Close() { s.pool.Close() }

// ErrSchemaBehind is dbconn.ErrSchemaBehind, re-exported so callers need not
// import the migration mechanics.
var ErrSchemaBehind = dbconn.ErrSchemaBehind

// InRecovery reports whether the server is a standby. A standby's mark lags the
// primary's, so a stale token would pass the lagging read (docs/contracts/rail-proxy.md).
func (s *Store) InRecovery(ctx context.Context) (bool, error) {
	var r bool
	if err := s.pool.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&r); err != nil {
		return false, fmt.Errorf("asking paydb whether it is in recovery: %w", err)
	}
	return r, nil
}

// admitSQL is steps 1 and 2 in one statement (admission.go lists the steps and
// the group form of the same fence), so the whole decision costs one round trip.
//
// The fence is the pinned upsert of docs/contracts/database.md, verbatim,
// strict `<`. The intent insert reads the fence's RETURNING, so it runs after the
// upsert has taken the account's row lock: admissions of one account are
// serialised by that lock and their submission_ids follow admission order.
// ON CONFLICT names the unique index's predicate, so the verdict "duplicate" is
// the index's own: a concurrent uncommitted intent for the same payout makes
// this insert wait for it, which a prior SELECT could never do. When the intent
// is not inserted, the attempt is still recorded, already resolved, as FENCED
// (the fence refused it) or DUPLICATE (the fence passed, the index refused it);
// the mark it advanced stays advanced.
//
// $9 is the fencing switch: false admits a refused token anyway. In both modes
// the fence must run to completion, its row lock taken, before the first intent
// row is formed; so the intent's gate is a count compared with a CASE on the
// flag, which the planner cannot fold. A gate such as `EXISTS (fence) OR NOT $9`
// folds to true with fencing off, and the intent insert would draw its
// submission_id before the mark row is locked
// (TestFenceRunsBeforeIntentInBothModes).
//
// $10 is this replica's RAIL_PROXY_INTERRUPTED_AFTER in milliseconds: the
// intent carries its own interrupt_at, judged by paydb's clock like
// submitted_at, so the janitor of any replica leaves it alone for as long as the
// replica that admitted it may still be carrying it. FENCED and DUPLICATE rows
// are not intents: NULL.
//
// $11 is the submitter's verified SPIFFE ID (submitter_identity), whatever row
// the submission leaves; NULL without identities.
const admitSQL = `
WITH fence AS (
    INSERT INTO rail_high_water (account_id, highest_token, updated_at)
    VALUES ($1, $2, now())
    ON CONFLICT (account_id) DO UPDATE
       SET highest_token = EXCLUDED.highest_token,
           updated_at    = now()
     WHERE rail_high_water.highest_token < EXCLUDED.highest_token
    RETURNING highest_token
), intent AS (
    INSERT INTO rail_submission
           (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency, beneficiary,
            interrupt_at, submitter_identity)
    SELECT $3, $1, $2, $4, $5, $6, $7, $8, clock_timestamp() + $10 * interval '1 millisecond', $11::text
     WHERE (SELECT count(*) FROM fence) >= CASE WHEN $9::boolean THEN 1 ELSE 0 END
    ON CONFLICT (payout_id) WHERE outcome IS NULL OR outcome IN ('ACKED','REJECTED','TIMEOUT') DO NOTHING
    RETURNING submission_id, submitted_at
), refused AS (
    INSERT INTO rail_submission
           (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency, beneficiary,
            outcome, resolved_at, submitter_identity)
    SELECT $3, $1, $2, $4, $5, $6, $7, $8,
           CASE WHEN EXISTS (SELECT FROM fence) OR NOT $9::boolean THEN 'DUPLICATE' ELSE 'FENCED' END,
           clock_timestamp(), $11::text
     WHERE NOT EXISTS (SELECT FROM intent)
    RETURNING submission_id, submitted_at, outcome
)
SELECT EXISTS (SELECT FROM fence), i.submission_id, i.submitted_at, NULL::text FROM intent i
UNION ALL
SELECT EXISTS (SELECT FROM fence), r.submission_id, r.submitted_at, r.outcome FROM refused r`

// booksChecks is the books verdict of docs/contracts/books.md, in
// lockapi.BooksMismatchOrder() (TestBooksChecksFollowTheMismatchOrder): each
// check's mismatch name and the SQL condition under which it fails, over the
// payout row b (every column NULL when there is none) and admitBooksSQL's
// parameters. The first that holds names the refusal. Once not_found has not
// held, every column of b is NOT NULL but claimed_by, hence IS DISTINCT FROM
// there. The beneficiary is compared exactly, as stored: the books hold what the
// executor presents, byte for byte.
var booksChecks = []struct{ name, fails string }{
	{lockapi.MismatchNotFound, "b.status IS NULL"},
	{lockapi.MismatchNotClaimed, "b.status <> 'CLAIMED'"},
	{lockapi.MismatchToken, "b.fence_token <> $2"},
	{lockapi.MismatchOwner, "b.claimed_by IS DISTINCT FROM $4"},
	{lockapi.MismatchAccount, "b.account_id <> $1"},
	{lockapi.MismatchAmount, "b.amount_minor <> $6"},
	{lockapi.MismatchCurrency, "b.currency <> $7"},
	{lockapi.MismatchBeneficiary, "b.beneficiary <> $8"},
}

// admitBooksSQL is admitSQL with the books verdict (docs/contracts/books.md),
// used when RAIL_PROXY_BOOKS_CHECK is on: still one statement, one round trip,
// at READ COMMITTED. Its parameters are admitSQL's. In this order:
//
//   - mark: the account's mark row is locked and read (FOR UPDATE;
//     MATERIALIZED, so it runs exactly once). READ COMMITTED gives the locked
//     row's newest version: the value compared is the mark as it is now.
//   - book: the payout row (payment-resource's payout table) is read without a
//     lock: a lock would let one payout's holder stall every other submission
//     that reads it.
//   - verdict: the fence first — with fencing on, a token at or below the locked
//     mark is FENCED whatever the books say — then the first failing books check
//     (booksChecks).
//   - fence: the pinned upsert of docs/contracts/database.md, verbatim but for
//     its row coming from the verdict: it runs only for a submission that passes
//     the books and was not fenced, so it stays the one statement that advances a
//     mark, and no mark row is ever created for a submission the books refuse.
//     An account with no mark row yet had nothing to lock: the upsert arbitrates
//     it exactly as in admitSQL (a concurrent first admission's row makes it wait
//     and compare), and with fencing on an upsert that returns no row is FENCED.
//   - intent and refused: as in admitSQL; a submission the books refused leaves
//     an UNBOOKED row, already resolved, and the mismatch comes back with it.
//
// The intent's gate reads the verdict, which reads the locked mark: in both
// fencing modes the mark row's lock is taken before the first intent row is
// formed (TestFenceRunsBeforeIntentInBothModes).
var admitBooksSQL = booksStatement()

func booksStatement() string {
	var c strings.Builder
	for _, k := range booksChecks {
		fmt.Fprintf(&c, "\n                WHEN %s THEN '%s'", k.fails, k.name)
	}
	return `
WITH mark AS MATERIALIZED (
    SELECT highest_token FROM rail_high_water WHERE account_id = $1 FOR UPDATE
), book AS MATERIALIZED (
    SELECT status, fence_token, claimed_by, account_id, amount_minor, currency, beneficiary
      FROM payout WHERE payout_id = $3
), verdict AS MATERIALIZED (
    SELECT m.highest_token AS mark,
           coalesce($9::boolean AND m.highest_token >= $2, false) AS fenced,
           CASE` + c.String() + `
           END AS mismatch
      FROM (SELECT 1) AS one
      LEFT JOIN mark m ON true
      LEFT JOIN book b ON true
), fence AS (
    INSERT INTO rail_high_water (account_id, highest_token, updated_at)
    SELECT $1, $2, now() FROM verdict WHERE NOT fenced AND mismatch IS NULL
    ON CONFLICT (account_id) DO UPDATE
       SET highest_token = EXCLUDED.highest_token,
           updated_at    = now()
     WHERE rail_high_water.highest_token < EXCLUDED.highest_token
    RETURNING highest_token
), intent AS (
    INSERT INTO rail_submission
           (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency, beneficiary,
            interrupt_at, submitter_identity)
    SELECT $3, $1, $2, $4, $5, $6, $7, $8, clock_timestamp() + $10 * interval '1 millisecond', $11::text
     WHERE (SELECT NOT fenced AND mismatch IS NULL FROM verdict)
       AND (SELECT count(*) FROM fence) >= CASE WHEN $9::boolean THEN 1 ELSE 0 END
    ON CONFLICT (payout_id) WHERE outcome IS NULL OR outcome IN ('ACKED','REJECTED','TIMEOUT') DO NOTHING
    RETURNING submission_id, submitted_at
), refused AS (
    INSERT INTO rail_submission
           (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency, beneficiary,
            outcome, resolved_at, submitter_identity)
    SELECT $3, $1, $2, $4, $5, $6, $7, $8,
           CASE WHEN v.fenced THEN 'FENCED'
                WHEN v.mismatch IS NOT NULL THEN 'UNBOOKED'
                WHEN EXISTS (SELECT FROM fence) OR NOT $9::boolean THEN 'DUPLICATE'
                ELSE 'FENCED' END,
           clock_timestamp(), $11::text
      FROM verdict v
     WHERE NOT EXISTS (SELECT FROM intent)
    RETURNING submission_id, submitted_at, outcome
)
SELECT EXISTS (SELECT FROM fence), i.submission_id, i.submitted_at, NULL::text, NULL::text, v.mark
  FROM intent i, verdict v
UNION ALL
SELECT EXISTS (SELECT FROM fence), r.submission_id, r.submitted_at, r.outcome,
       CASE WHEN r.outcome = 'UNBOOKED' THEN v.mismatch END, v.mark
  FROM refused r, verdict v`
}

// markSQL reads the mark that fenced an attempt. It runs in the admission
// transaction after the upsert, which locked the row even though it did not
// update it, and READ COMMITTED gives the statement a fresh snapshot: the value is
// exactly the mark the token was compared with.
const markSQL = `SELECT highest_token FROM rail_high_water WHERE account_id = $1`

// firstSQL reads the payout's forwardable row, the one the unique index holds.
// Its predicate is the index's, so the index serves it.
const firstSQL = `
SELECT submission_id, submitted_at, outcome, rail_reference, decline_reason,
       account_id, amount_minor, currency, beneficiary
  FROM rail_submission
 WHERE payout_id = $1 AND (outcome IS NULL OR outcome IN ('ACKED','REJECTED','TIMEOUT'))`

// firstUnsentSQL is the fallback when the forwardable row that made us a
// DUPLICATE was resolved UNSENT (its dial failed) between our insert and firstSQL.
const firstUnsentSQL = `
SELECT submission_id, submitted_at, outcome, rail_reference, decline_reason,
       account_id, amount_minor, currency, beneficiary
  FROM rail_submission
 WHERE payout_id = $1 AND outcome = 'UNSENT'
 ORDER BY submission_id DESC LIMIT 1`

// Admit runs steps 1–3 in one READ COMMITTED transaction on the primary and
// commits it. Round trips on the admitted path: BEGIN and the admission statement
// in one pipelined batch, then COMMIT — COMMIT is sent on its own, after the
// submission_id is known, so a commit whose answer is lost still names the row
// that may exist.
//
// ctx bounds everything, waiting for a pool connection included. interruptAfter
// is this replica's RAIL_PROXY_INTERRUPTED_AFTER, from which the intent's
// interrupt_at is set. Errors are *CommitError.
func (s *Store) Admit(ctx context.Context, sub Submission, fencing, books bool, interruptAfter time.Duration) (Admission, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return Admission{}, &CommitError{Err: fmt.Errorf("waiting for a paydb connection: %w", err)}
	}
	defer conn.Release()
	return admitOn(ctx, conn, sub, fencing, books, interruptAfter, false)
}

// admitOn is Admit on a connection the caller holds. With skipHeld (the group
// worker's group of one, groupstore.go) the transaction waits at most
// lock_timeout for the account's mark row: a row another transaction holds
// fails the statement with lock_not_available instead of stalling the worker.
func admitOn(ctx context.Context, conn *pgxpool.Conn, sub Submission, fencing, books bool, interruptAfter time.Duration, skipHeld bool) (Admission, error) {
	inTx := false
	fail := func(err error) (Admission, error) {
		if inTx {
			rollback(ctx, conn)
		}
		return Admission{}, &CommitError{Err: err}
	}

	// RaiseSyncCommitSQL rides in the same batch as BEGIN: the COMMIT below waits
	// for the synchronous standby, and a cancelled wait is reported to us,
	// whatever paydb's, the role's or the URL's settings, at no extra round trip.
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue(dbconn.RaiseSyncCommitSQL)
	if skipHeld {
		b.Queue(skipHeldSQL)
	}
	q := admitSQL
	if books {
		q = admitBooksSQL
	}
	b.Queue(q, sub.AccountID, sub.Token, sub.PayoutID, sub.OwnerID, sub.IdempotencyKey,
		sub.AmountMinor, sub.Currency, sub.Beneficiary, fencing, interruptAfter.Milliseconds(), sub.submitter())
	br := conn.SendBatch(ctx, b)
	var (
		a        Admission
		outcome  *string
		mismatch *string
		mark     *int64
	)
	_, err := br.Exec()
	if err == nil {
		inTx = true
		_, err = br.Exec()
	}
	if err == nil && skipHeld {
		_, err = br.Exec()
	}
	if err == nil {
		if books {
			mismatch, mark, err = scanBooks(br.QueryRow(), &a, &outcome)
		} else {
			err = br.QueryRow().Scan(&a.PassedFence, &a.SubmissionID, &a.SubmittedAt, &outcome)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// A failure before COMMIT leaves nothing behind: the transaction was never
		// committed and the server rolls it back (explicitly here, or when the
		// broken connection is dropped).
		inTx = inTx || conn.Conn().PgConn().TxStatus() != 'I'
		return fail(fmt.Errorf("admission statement: %w", err))
	}

	switch {
	case outcome == nil:
		a.Verdict = Admitted
	case *outcome == lockapi.OutcomeFenced:
		a.Verdict = Fenced
		if mark != nil && *mark >= sub.Token {
			// The books statement compared the token with the mark it locked.
			a.HighestToken = *mark
		} else if err := conn.QueryRow(ctx, markSQL, sub.AccountID).Scan(&a.HighestToken); err != nil {
			return fail(fmt.Errorf("reading the mark: %w", err))
		}
	case *outcome == lockapi.OutcomeUnbooked:
		if mismatch == nil {
			return fail(errors.New("admission statement refused a submission as unbooked without naming the mismatch"))
		}
		a.Verdict, a.Mismatch = Unbooked, *mismatch
	case *outcome == lockapi.OutcomeDuplicate:
		a.Verdict = Duplicate
		first, err := firstAttempt(ctx, conn, sub.PayoutID)
		if err != nil {
			return fail(fmt.Errorf("reading the first attempt: %w", err))
		}
		a.First = first
	default:
		return fail(fmt.Errorf("admission statement returned outcome %q", *outcome))
	}

	if err := commit(ctx, conn); err != nil {
		err.SubmissionID, err.Intent = a.SubmissionID, a.Verdict == Admitted
		return Admission{}, err
	}
	return a, nil
}

// scanBooks reads admitBooksSQL's row: admitSQL's columns, then the mismatch
// (UNBOOKED only) and the mark the statement locked (nil when the account had
// none). A function of its own, so that the statement without the books does
// not pay for these two values' allocations.
func scanBooks(row pgx.Row, a *Admission, outcome **string) (mismatch *string, mark *int64, err error) {
	err = row.Scan(&a.PassedFence, &a.SubmissionID, &a.SubmittedAt, outcome, &mismatch, &mark)
	return mismatch, mark, err
}

// commit sends COMMIT on its own and says what became of the transaction; nil
// when it is committed and durable. The caller fills in the rows at stake.
//
//   - ROLLBACK for an answer: the transaction had failed, nothing was written.
//   - No answer: it may have committed before the answer was lost (Unsure).
//   - The cancelled-synchronous-replication warning (dbconn.ErrCommitNotDurable):
//     committed on the primary only, so a failover may forget it. It is treated
//     as not committed — nothing is forwarded, the caller answers 503 — and as
//     Unsure, so the row that does exist on the primary is resolved UNSENT.
func commit(ctx context.Context, conn *pgxpool.Conn) *CommitError {
	tag, err := dbconn.ExecCommit(ctx, conn.Conn())
	switch {
	case err != nil:
		// COMMIT was sent: it may have committed before the answer was lost, or
		// it did commit but only on the primary (err wraps ErrCommitNotDurable).
		return &CommitError{Unsure: true, BackendPID: conn.Conn().PgConn().PID(), Err: fmt.Errorf("commit: %w", err)}
	case tag.String() != "COMMIT":
		// PostgreSQL answers COMMIT of a failed transaction with ROLLBACK.
		return &CommitError{Err: errors.New("transaction was rolled back")}
	}
	return nil
}

func firstAttempt(ctx context.Context, conn *pgxpool.Conn, payoutID string) (*Attempt, error) {
	for _, q := range []string{firstSQL, firstUnsentSQL} {
		var f Attempt
		err := conn.QueryRow(ctx, q, payoutID).Scan(&f.SubmissionID, &f.SubmittedAt, &f.Outcome, &f.RailReference, &f.DeclineReason,
			&f.AccountID, &f.AmountMinor, &f.Currency, &f.Beneficiary)
		if err == nil {
			return &f, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, err
		}
	}
	return nil, nil
}

// rollback ends a transaction even when the request's context is done: a
// cancelled caller must never leave a transaction (and the account's row lock)
// open. A rollback that fails closes the connection, which the server answers by
// rolling back.
func rollback(ctx context.Context, conn *pgxpool.Conn) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
		_ = conn.Conn().Close(rctx)
	}
}

// resolveSQL is the pinned resolution of docs/contracts/database.md: it only ever
// touches an unresolved row, so it is idempotent and can never overwrite what the
// janitor (or anyone) wrote.
const resolveSQL = `
UPDATE rail_submission
   SET outcome = $2, rail_reference = $3, decline_reason = $4, resolved_at = clock_timestamp()
 WHERE submission_id = $1 AND outcome IS NULL`

const attemptSQL = `
SELECT submission_id, submitted_at, outcome, rail_reference, decline_reason,
       coalesce(resolved_at < interrupt_at, false)
  FROM rail_submission WHERE submission_id = $1`

// Resolve sets the outcome of an unresolved row. It reports false when the row
// was already resolved (or does not exist); then Attempt tells what it says.
//
// The write is a transaction of its own with synchronous_commit raised
// (dbconn.DurableBatch, one round trip): the outcome it records is relied upon
// (the executor books a PAID payout from the answer; the trail must say the
// same after a failover). A commit whose wait for the synchronous standby was
// cancelled returns true with an error wrapping dbconn.ErrCommitNotDurable: the
// row is resolved on the primary, not known to be on the standby.
func (s *Store) Resolve(ctx context.Context, id int64, outcome string, railRef, declineReason *string) (bool, error) {
	var n int64
	err := dbconn.DurableBatch(ctx, s.pool, func(b *pgx.Batch) {
		b.Queue(resolveSQL, id, outcome, railRef, declineReason)
	}, func(br pgx.BatchResults) error {
		tag, err := br.Exec()
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return n == 1 && errors.Is(err, dbconn.ErrCommitNotDurable), fmt.Errorf("resolving submission %d: %w", id, err)
	}
	return n == 1, nil
}

// TransactionOver says whether the paydb backend pid has no transaction open:
// it is gone, or idle. A COMMIT whose answer was lost may still be on its way to
// the backend or in its hands (the connection can break in front of a server
// that has yet to read it); only once the backend is past it does a row not
// found mean the intent was not committed. Nothing else is ever sent on that
// broken connection, so idle cannot be a later transaction's.
func (s *Store) TransactionOver(ctx context.Context, pid uint32) (bool, error) {
	var over bool
	err := s.pool.QueryRow(ctx, transactionOverSQL, int64(pid)).Scan(&over)
	return over, err
}

// ConfirmDurable says whether every transaction paydb's primary committed before
// it is on the synchronous standby: it commits a transaction of its own that
// writes WAL (confirmDurableSQL), whose COMMIT therefore waits for the standby to
// have flushed the WAL up to it — and so everything committed earlier. nil:
// durable; an error wrapping dbconn.ErrCommitNotDurable: that wait was cancelled;
// any other error: not known. It is how a resolving write whose COMMIT landed
// after its deadline (its answer, and any warning with it, given up on) learns
// whether it is durable.
func (s *Store) ConfirmDurable(ctx context.Context) error {
	return dbconn.DurableBatch(ctx, s.pool, func(b *pgx.Batch) {
		b.Queue(confirmDurableSQL)
	}, func(br pgx.BatchResults) error {
		_, err := br.Exec()
		return err
	})
}

// confirmDurableSQL writes a transactional logical-decoding message: WAL, and a
// transaction id, so that its COMMIT is logged and waits for the synchronous
// standby (a transaction that only takes an id writes no WAL before its commit
// record, and PostgreSQL does not make its COMMIT wait). It changes no table; a
// logical decoding consumer, if any, sees a message with this prefix.
const confirmDurableSQL = `SELECT pg_logical_emit_message(true, 'lock.dev/rail-proxy', 'durability check')`

// A state this role may not read (NULL) counts as busy: only gone or idle is over.
const transactionOverSQL = `SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state IS DISTINCT FROM 'idle')`

// Attempt reads one row by id; ErrNoRow when it does not exist.
func (s *Store) Attempt(ctx context.Context, id int64) (Attempt, error) {
	var a Attempt
	err := s.pool.QueryRow(ctx, attemptSQL, id).Scan(&a.SubmissionID, &a.SubmittedAt, &a.Outcome, &a.RailReference, &a.DeclineReason, &a.InTime)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, ErrNoRow
	}
	if err != nil {
		return a, fmt.Errorf("reading submission %d: %w", id, err)
	}
	return a, nil
}

// MaxListPage is the most rows one audit-trail answer carries
// (docs/contracts/rail-proxy.md, "Reading the audit trail"); the rest is reached
// by paging with after.
const MaxListPage = 100

// listSQL is one page of a payout's audit trail, oldest first. It reads
// rail_submission_payout_idx (payout_id, submission_id) as one range and stops
// one row past the page, which says whether there is a next page: the cost is the
// page's, whatever the size of the table.
const listSQL = `
SELECT submission_id, payout_id, account_id, amount_minor, currency, beneficiary, presented_token, owner_id, outcome,
       rail_reference, decline_reason, submitted_at, resolved_at, submitter_identity
  FROM rail_submission
 WHERE payout_id = $1 AND submission_id > $2
 ORDER BY submission_id
 LIMIT $3`

// List returns at most limit rows of a payout whose submission_id is above after,
// oldest first, and the submission_id to pass as after for the next page (nil when
// there is none).
func (s *Store) List(ctx context.Context, payoutID string, after int64, limit int) ([]lockapi.Submission, *int64, error) {
	rows, err := s.pool.Query(ctx, listSQL, payoutID, after, limit+1)
	if err != nil {
		return nil, nil, fmt.Errorf("listing submissions: %w", err)
	}
	out := []lockapi.Submission{}
	for rows.Next() {
		var r lockapi.Submission
		if err := rows.Scan(&r.SubmissionID, &r.PayoutID, &r.AccountID, &r.AmountMinor, &r.Currency, &r.Beneficiary, &r.PresentedToken, &r.OwnerID, &r.Outcome,
			&r.RailReference, &r.DeclineReason, &r.SubmittedAt, &r.ResolvedAt, &r.SubmitterIdentity); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("listing submissions: %w", err)
		}
		r.SubmittedAt = lockapi.UTC(r.SubmittedAt)
		r.ResolvedAt = lockapi.UTCPtr(r.ResolvedAt)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("listing submissions: %w", err)
	}
	if len(out) <= limit {
		return out, nil, nil
	}
	out = out[:limit]
	next := out[limit-1].SubmissionID
	return out, &next, nil
}

// Interrupted is an intent the janitor resolved to TIMEOUT.
type Interrupted struct {
	SubmissionID   int64
	PayoutID       string
	AccountID      string
	PresentedToken int64
	OwnerID        string
	SubmittedAt    time.Time
	ResolvedAt     time.Time
}

// interruptedSQL resolves interrupted intents to TIMEOUT: rows past their own
// interrupt_at, set at admission by the replica that admitted them, or — rows
// admitted before that column existed — older than this replica's bound ($1).
// Time is the database clock's, so every replica agrees on it. The candidates come
// from rail_submission_unresolved_idx (outcome IS NULL: the rows in flight, a
// handful), oldest first. SKIP LOCKED passes over a row a live proxy is resolving
// this very moment, and the outer `outcome IS NULL` keeps the update conditional:
// a row is resolved once, by whoever gets there first.
const interruptedSQL = `
UPDATE rail_submission
   SET outcome = 'TIMEOUT', resolved_at = clock_timestamp()
 WHERE submission_id IN (
        SELECT submission_id FROM rail_submission
         WHERE outcome IS NULL
           AND coalesce(interrupt_at, submitted_at + $1 * interval '1 millisecond') < clock_timestamp()
         ORDER BY submitted_at
         LIMIT $2
           FOR UPDATE SKIP LOCKED)
   AND outcome IS NULL
RETURNING submission_id, payout_id, account_id, presented_token, owner_id, submitted_at, resolved_at`

// ResolveInterrupted resolves at most limit interrupted intents to TIMEOUT — past
// their interrupt_at, or older than age when they have none — and returns them.
func (s *Store) ResolveInterrupted(ctx context.Context, age time.Duration, limit int) ([]Interrupted, error) {
	rows, err := s.pool.Query(ctx, interruptedSQL, age.Milliseconds(), limit)
	if err != nil {
		return nil, fmt.Errorf("resolving interrupted intents: %w", err)
	}
	var out []Interrupted
	for rows.Next() {
		var r Interrupted
		if err := rows.Scan(&r.SubmissionID, &r.PayoutID, &r.AccountID, &r.PresentedToken, &r.OwnerID, &r.SubmittedAt, &r.ResolvedAt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("resolving interrupted intents: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("resolving interrupted intents: %w", err)
	}
	return out, nil
}
