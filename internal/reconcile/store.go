package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/dbconn"
	"lock.dev/lockapi"
)

// store is the reconciler's view of paydb, and the only file that speaks SQL. It
// writes its own three tables (rail_statement_line, reconciliation_exception,
// reconciler_cursor) and only reads the others: payout (payment-resource's, which
// it moves only through the settle endpoint) and rail_submission (rail-proxy's:
// the attempts' times, and the UNBOOKED attempts an ATTEMPT_MISMATCH names).
// Every time it compares is paydb's: now(), submitted_at, updated_at, read_at.
type store struct {
	pool *pgxpool.Pool
	// perAccount: the statement comes from files (dir mode), and the settle
	// window of a payout is judged against its account's coverage
	// (statement_coverage) instead of the cursor's read_at.
	perAccount bool
}

// openStore opens a pool of its own for one pass (Pass); Run's store is over the
// pool the service skeleton opened and checked.
func openStore(ctx context.Context, url string, maxConns int) (*store, error) {
	pool, err := dbconn.Open(ctx, url, int32(maxConns))
	return &store{pool: pool}, err
}

func (s *store) close() { s.pool.Close() }

const selectLastSeqSQL = `SELECT coalesce((SELECT last_seq FROM reconciler_cursor), 0)`

// lastSeq is the cursor's last imported seq (0 before the first import).
func (s *store) lastSeq(ctx context.Context) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, selectLastSeqSQL).Scan(&n); err != nil {
		return 0, fmt.Errorf("read the cursor: %w", err)
	}
	return n, nil
}

// PassLockKey is the session advisory lock a pass holds ("reconcil" in ASCII),
// distinct from goose's migration lock. An operator can see it in pg_locks
// (objid and classid are its two halves), or hold it to pause reconciliation.
const PassLockKey int64 = 0x7265636f6e63696c

// session is one pass: a dedicated connection holding the pass lock. A session
// lock belongs to its connection, so every statement of the pass runs on it; if
// the connection dies, the lock goes with it and the pass fails at its next
// statement.
type session struct {
	conn       *pgxpool.Conn
	perAccount bool // as the store's
}

// lockPass takes the pass lock without waiting: ok is false when another
// reconciler's pass holds it.
func (s *store) lockPass(ctx context.Context) (ss *session, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, DBTimeout)
	defer cancel()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("acquire a paydb connection: %w", err)
	}
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, PassLockKey).Scan(&ok); err != nil {
		conn.Release()
		return nil, false, fmt.Errorf("take the pass lock: %w", err)
	}
	if !ok {
		conn.Release()
		return nil, false, nil
	}
	return &session{conn: conn, perAccount: s.perAccount}, true, nil
}

// release gives the lock back. A connection that cannot say so is closed rather
// than returned to the pool: the lock must never outlive the pass on a pooled
// connection.
func (ss *session) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var unlocked bool
	if err := ss.conn.QueryRow(ctx, `SELECT pg_advisory_unlock($1)`, PassLockKey).Scan(&unlocked); err != nil || !unlocked {
		_ = ss.conn.Hijack().Close(ctx)
		return
	}
	ss.conn.Release()
}

// cursor is where a pass starts: paydb's now() (the pass start,
// docs/contracts/reconciliation.md step 1), the last seq imported and the start of
// the last complete read.
type cursor struct {
	passStart time.Time
	lastSeq   int64
	readAt    *time.Time
}

const (
	ensureCursorSQL = `INSERT INTO reconciler_cursor (id) VALUES (true) ON CONFLICT (id) DO NOTHING`
	startPassSQL    = `SELECT now(), last_seq, read_at FROM reconciler_cursor`
)

// start notes the pass start on paydb's clock and reads the cursor (creating its
// one row the first time).
func (ss *session) start(ctx context.Context) (cursor, error) {
	ctx, cancel := context.WithTimeout(ctx, DBTimeout)
	defer cancel()
	if _, err := ss.conn.Exec(ctx, ensureCursorSQL); err != nil {
		return cursor{}, fmt.Errorf("create the cursor: %w", err)
	}
	var c cursor
	if err := ss.conn.QueryRow(ctx, startPassSQL).Scan(&c.passStart, &c.lastSeq, &c.readAt); err != nil {
		return cursor{}, fmt.Errorf("read the cursor: %w", err)
	}
	return c, nil
}

// exception is one recorded disagreement (a reconciliation_exception row).
type exception struct {
	Kind     string
	PayoutID *string
	Seq      *int64
	FileID   *int64 // the statement_file row of a STATEMENT_FILE_CHANGED
	Detail   string
}

// maskSQL is lockapi.MaskBeneficiary in PostgreSQL, over the text expression
// expr: an exception's detail is logged, and a log carries at most a
// beneficiary's last four characters.
func maskSQL(expr string) string {
	return "CASE WHEN char_length(" + expr + ") <= 4 THEN '****' ELSE '****' || right(" + expr + ", 4) END"
}

const (
	// insertLinesSQL copies a page, each line once: idempotent by seq. Every line
	// carries its beneficiary (the column's CHECK holds every line copied since
	// it was added).
	insertLinesSQL = `
INSERT INTO rail_statement_line (seq, received_at, reference, account_id, amount_minor, currency, result, rail_reference, decline_reason, beneficiary)
SELECT * FROM unnest($1::bigint[], $2::timestamptz[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[])
ON CONFLICT (seq) DO NOTHING`

	// advanceCursorSQL moves the cursor forward only, and sets read_at (the start
	// of this complete read) when $2 is not null. GREATEST keeps both right should
	// two passes ever overlap (a pass whose connection died lost its lock).
	advanceCursorSQL = `
UPDATE reconciler_cursor
   SET last_seq = GREATEST(last_seq, $1),
       read_at  = CASE WHEN $2::timestamptz IS NULL THEN read_at ELSE GREATEST(coalesce(read_at, $2), $2) END`
)

// lineExceptionsSQL records what a line alone proves, for the lines with seq in
// [$1, $2]: a second (third …) ACCEPTED line of a payout, a line whose account,
// amount or currency is not its payout's, one whose account, amount and currency
// are and whose beneficiary is not (compared as IBANs: lockapi.BeneficiaryKeySQL;
// a line copied before lines carried a beneficiary is never compared), a line of
// no payout. It runs in the transaction that imports the lines, so no line is
// ever copied unchecked. A line of an unknown reference is UNKNOWN_REFERENCE
// only (no payout_id to carry), never also PRESENTED_TWICE; a line whose amount
// and beneficiary both differ is AMOUNT_MISMATCH only.
var lineExceptionsSQL = `
INSERT INTO reconciliation_exception (kind, payout_id, seq, detail)
SELECT 'PRESENTED_TWICE', p.payout_id, l.seq,
       format('ACCEPTED again at seq %s (first ACCEPTED at seq %s): %s %s on %s paid twice',
              l.seq, f.first_seq, l.amount_minor, l.currency, l.account_id)
  FROM rail_statement_line l
  JOIN payout p ON p.payout_id = l.reference
  JOIN LATERAL (SELECT min(seq) AS first_seq FROM rail_statement_line x
                 WHERE x.reference = l.reference AND x.result = 'ACCEPTED') f ON true
 WHERE l.seq BETWEEN $1 AND $2 AND l.result = 'ACCEPTED' AND f.first_seq < l.seq
UNION ALL
SELECT 'AMOUNT_MISMATCH', p.payout_id, l.seq,
       format('%s line at seq %s is %s %s on %s; the payout is %s %s on %s',
              l.result, l.seq, l.amount_minor, l.currency, l.account_id, p.amount_minor, p.currency, p.account_id)
  FROM rail_statement_line l
  JOIN payout p ON p.payout_id = l.reference
 WHERE l.seq BETWEEN $1 AND $2
   AND (l.account_id, l.amount_minor, l.currency) IS DISTINCT FROM (p.account_id, p.amount_minor, p.currency)
UNION ALL
SELECT 'BENEFICIARY_MISMATCH', p.payout_id, l.seq,
       format('%s line at seq %s is %s %s on %s to beneficiary %s; the payout''s beneficiary is %s',
              l.result, l.seq, l.amount_minor, l.currency, l.account_id, ` + maskSQL("l.beneficiary") + `, ` + maskSQL("p.beneficiary") + `)
  FROM rail_statement_line l
  JOIN payout p ON p.payout_id = l.reference
 WHERE l.seq BETWEEN $1 AND $2
   AND (l.account_id, l.amount_minor, l.currency) IS NOT DISTINCT FROM (p.account_id, p.amount_minor, p.currency)
   AND l.beneficiary IS NOT NULL
   AND ` + lockapi.BeneficiaryKeySQL("l.beneficiary") + ` <> ` + lockapi.BeneficiaryKeySQL("p.beneficiary") + `
UNION ALL
SELECT 'UNKNOWN_REFERENCE', NULL, l.seq,
       format('%s line at seq %s: %s %s on %s for reference %s, which is no payout',
              l.result, l.seq, l.amount_minor, l.currency, l.account_id, l.reference)
  FROM rail_statement_line l
 WHERE l.seq BETWEEN $1 AND $2
   AND NOT EXISTS (SELECT 1 FROM payout p WHERE p.payout_id = l.reference)
ON CONFLICT DO NOTHING
RETURNING kind, payout_id, seq, detail`

// importPage copies a page and moves the cursor to lastSeq in one transaction,
// with the exceptions its lines prove on their own; readAt, when set, is stored
// as the start of a complete read (the page was the last). It returns the lines
// newly copied and the exceptions newly recorded.
func (ss *session) importPage(ctx context.Context, lines []lockapi.StatementLine, lastSeq int64, readAt *time.Time) (imported int64, recorded []exception, repeated []lockapi.StatementLine, err error) {
	ctx, cancel := context.WithTimeout(ctx, DBTimeout)
	defer cancel()
	// A copy paydb forgets in a failover is imported again from the cursor it
	// remembers (lines, cursor and exceptions commit together), so a commit
	// whose synchronous wait was cancelled needs no detection here; the commit
	// still waits for the standby, whatever the role's default.
	tx, err := ss.conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: "BEGIN; " + dbconn.RaiseSyncCommitSQL})
	if err != nil {
		return 0, nil, nil, fmt.Errorf("import: begin: %w", err)
	}
	defer rollback(ctx, tx)
	// An ACCEPTED line already in the copy under its account and rail
	// reference (the rail showing a booking again) is not copied again.
	lines, repeated, err = ss.withoutRepeats(ctx, tx, lines)
	if err != nil {
		return 0, nil, nil, err
	}
	// A line whose text paydb cannot store and show as it is is not copied: it
	// would fail the whole page's insert, every pass, for ever. It is recorded as
	// an exception in this same transaction, and the import goes on past it.
	lines, recorded, err = ss.setAsideUnstorable(ctx, tx, lines)
	if err != nil {
		return 0, nil, nil, err
	}
	if imported, err = insertLines(ctx, tx, lines); err != nil {
		return 0, nil, nil, err
	}
	proved, err := lineExceptions(ctx, tx, lines)
	if err != nil {
		return 0, nil, nil, err
	}
	recorded = append(recorded, proved...)
	if _, err := tx.Exec(ctx, advanceCursorSQL, lastSeq, readAt); err != nil {
		return 0, nil, nil, fmt.Errorf("advance the cursor to %d: %w", lastSeq, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, nil, nil, fmt.Errorf("import: commit: %w", err)
	}
	return imported, recorded, repeated, nil
}

// insertUnstorableSQL records a line that was not copied; payout_id is its
// reference when that names a payout ($1 is null when the reference is itself
// not storable text).
const insertUnstorableSQL = `
INSERT INTO reconciliation_exception (kind, payout_id, seq, detail)
SELECT $2, (SELECT payout_id FROM payout WHERE payout_id = $1), $3, $4
ON CONFLICT DO NOTHING
RETURNING kind, payout_id, seq, detail`

// setAsideUnstorable returns the lines that are storable text (unstorable), in
// order, and records each other one as an UNSTORABLE_LINE exception in tx,
// returning those newly recorded.
func (ss *session) setAsideUnstorable(ctx context.Context, tx pgx.Tx, lines []lockapi.StatementLine) ([]lockapi.StatementLine, []exception, error) {
	var recorded []exception
	kept, copied := lines, true // kept is lines itself until a line is set aside
	for i, l := range lines {
		field, problem := unstorable(l)
		if field == "" {
			if !copied {
				kept = append(kept, l)
			}
			continue
		}
		if copied {
			kept, copied = slices.Clone(lines[:i]), false
		}
		ref, e := unstorableException(l, field, problem)
		rows, err := tx.Query(ctx, insertUnstorableSQL, ref, e.Kind, e.Seq, e.Detail)
		if err != nil {
			return nil, nil, fmt.Errorf("record line %d as %s: %w", l.Seq, KindUnstorableLine, err)
		}
		got, err := collectExceptions(rows)
		if err != nil {
			return nil, nil, fmt.Errorf("record line %d as %s: %w", l.Seq, KindUnstorableLine, err)
		}
		recorded = append(recorded, got...)
	}
	return kept, recorded, nil
}

func collectExceptions(rows pgx.Rows) ([]exception, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (exception, error) {
		var e exception
		err := r.Scan(&e.Kind, &e.PayoutID, &e.Seq, &e.Detail)
		return e, err
	})
}

// line is an imported statement line as the settle rules look at it.
// Beneficiary is nil for a line copied before lines carried one.
type line struct {
	Seq           int64
	AccountID     string
	AmountMinor   int64
	Currency      string
	Beneficiary   *string
	Result        string
	RailReference *string
	DeclineReason *string
}

// candidate is an AMBIGUOUS payout with its imported lines, oldest first.
// WindowPassed: the last complete read started (in dir mode: the payout's
// account's coverage reaches) later than the payout's last forwardable
// attempt's submitted_at (with none, its updated_at) plus the settle window —
// judged in SQL, on paydb's clock.
type candidate struct {
	PayoutID     string
	AccountID    string
	AmountMinor  int64
	Currency     string
	Beneficiary  string
	WindowPassed bool
	// Unstorable: a statement line of this payout was not copied, its text not
	// storable (an UNSTORABLE_LINE exception names the payout).
	Unstorable bool
	Lines      []line
}

const (
	// ambiguousSQL pages through the AMBIGUOUS payouts by payout_id. The
	// forwardable rows are those rail_submission_attempt_uidx covers
	// (docs/contracts/database.md): the payout's one attempt at the rail. $4:
	// dir mode, where what the statement covers is the payout's account's
	// coverage, not the cursor's read_at.
	ambiguousSQL = `
SELECT p.payout_id, p.account_id, p.amount_minor, p.currency, p.beneficiary,
       coalesce(CASE WHEN $4 THEN v.covered_to ELSE c.read_at END
                > coalesce(a.submitted_at, p.updated_at) + $1 * interval '1 microsecond', false),
       EXISTS (SELECT 1 FROM reconciliation_exception e
                WHERE e.kind = 'UNSTORABLE_LINE' AND coalesce(e.payout_id, '') = p.payout_id)
  FROM payout p
  LEFT JOIN reconciler_cursor c ON true
  LEFT JOIN statement_coverage v ON v.account_id = p.account_id
  LEFT JOIN LATERAL (SELECT max(s.submitted_at) AS submitted_at FROM rail_submission s
                      WHERE s.payout_id = p.payout_id
                        AND (s.outcome IS NULL OR s.outcome IN ('ACKED','REJECTED','TIMEOUT'))) a ON true
 WHERE p.status = 'AMBIGUOUS' AND p.payout_id > $2
 ORDER BY p.payout_id
 LIMIT $3`

	linesOfSQL = `
SELECT reference, seq, account_id, amount_minor, currency, beneficiary, result, rail_reference, decline_reason
  FROM rail_statement_line
 WHERE reference = ANY($1)
 ORDER BY seq`
)

// ambiguous returns up to limit AMBIGUOUS payouts with payout_id after afterID,
// each with its lines.
func (ss *session) ambiguous(ctx context.Context, settleAfter time.Duration, afterID string, limit int) ([]candidate, error) {
	ctx, cancel := context.WithTimeout(ctx, DBTimeout)
	defer cancel()
	rows, err := ss.conn.Query(ctx, ambiguousSQL, settleAfter.Microseconds(), afterID, limit, ss.perAccount)
	if err != nil {
		return nil, fmt.Errorf("read AMBIGUOUS payouts: %w", err)
	}
	cands, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (candidate, error) {
		var c candidate
		err := r.Scan(&c.PayoutID, &c.AccountID, &c.AmountMinor, &c.Currency, &c.Beneficiary, &c.WindowPassed, &c.Unstorable)
		return c, err
	})
	if err != nil || len(cands) == 0 {
		if err != nil {
			err = fmt.Errorf("read AMBIGUOUS payouts: %w", err)
		}
		return nil, err
	}
	ids := make([]string, len(cands))
	at := make(map[string]int, len(cands))
	for i, c := range cands {
		ids[i], at[c.PayoutID] = c.PayoutID, i
	}
	rows, err = ss.conn.Query(ctx, linesOfSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("read their statement lines: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var ref string
		var l line
		if err := rows.Scan(&ref, &l.Seq, &l.AccountID, &l.AmountMinor, &l.Currency, &l.Beneficiary, &l.Result, &l.RailReference, &l.DeclineReason); err != nil {
			return nil, fmt.Errorf("read their statement lines: %w", err)
		}
		c := &cands[at[ref]]
		c.Lines = append(c.Lines, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read their statement lines: %w", err)
	}
	return cands, nil
}

const insertExceptionSQL = `
INSERT INTO reconciliation_exception (kind, payout_id, seq, detail) VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING
RETURNING kind, payout_id, seq, detail`

// record records one exception; recorded is false when it was recorded before.
func (ss *session) record(ctx context.Context, e exception) (recorded bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, DBTimeout)
	defer cancel()
	var got exception
	err = ss.conn.QueryRow(ctx, insertExceptionSQL, e.Kind, e.PayoutID, e.Seq, e.Detail).Scan(&got.Kind, &got.PayoutID, &got.Seq, &got.Detail)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("record %s: %w", e.Kind, err)
	}
	return true, nil
}

const (
	// contradictionsSQL: a line whose result the payout's final status denies. An
	// ACCEPTED line for a DECLINED or NOT_PRESENTED payout is money moved that the
	// books say did not; a DECLINED line for a PAID or NOT_PRESENTED payout is a
	// presentation the books do not show (for NOT_PRESENTED: the assumption that
	// status rests on, that the rail records a call within the settle window, was
	// broken — no money moved this time). Over every line, every pass: a payout's
	// status can change long after its lines were imported.
	contradictionsSQL = `
INSERT INTO reconciliation_exception (kind, payout_id, seq, detail)
SELECT 'LINE_CONTRADICTS_PAYOUT', p.payout_id, l.seq,
       format('%s line at seq %s (%s %s on %s) for a %s payout', l.result, l.seq, l.amount_minor, l.currency, l.account_id, p.status)
  FROM rail_statement_line l
  JOIN payout p ON p.payout_id = l.reference
 WHERE (l.result = 'ACCEPTED' AND p.status IN ('DECLINED','NOT_PRESENTED'))
    OR (l.result = 'DECLINED' AND p.status IN ('PAID','NOT_PRESENTED'))
ON CONFLICT DO NOTHING
RETURNING kind, payout_id, seq, detail`

	// paidWithoutLineSQL: a PAID payout with no ACCEPTED line although the last
	// complete read started (in dir mode, $2: its account's coverage reaches)
	// past its last ACKED attempt's submitted_at (with none, its updated_at) plus
	// the settle window: booked, and the rail says it never paid.
	paidWithoutLineSQL = `
INSERT INTO reconciliation_exception (kind, payout_id, seq, detail)
SELECT 'PAID_WITHOUT_LINE', p.payout_id, NULL,
       CASE WHEN $2
       THEN format('PAID with rail reference %s, but the statements covering account %s to %s have no ACCEPTED line of it',
                   coalesce(p.rail_reference, '(none)'), p.account_id, v.covered_to)
       ELSE format('PAID with rail reference %s, but the statement read at %s has no ACCEPTED line of it',
                   coalesce(p.rail_reference, '(none)'), c.read_at) END
  FROM payout p
  LEFT JOIN reconciler_cursor c ON true
  LEFT JOIN statement_coverage v ON v.account_id = p.account_id
  LEFT JOIN LATERAL (SELECT max(s.submitted_at) AS submitted_at FROM rail_submission s
                      WHERE s.payout_id = p.payout_id AND s.outcome = 'ACKED') a ON true
 WHERE p.status = 'PAID'
   AND CASE WHEN $2 THEN v.covered_to ELSE c.read_at END
       > coalesce(a.submitted_at, p.updated_at) + $1 * interval '1 microsecond'
   AND NOT EXISTS (SELECT 1 FROM rail_statement_line l WHERE l.reference = p.payout_id AND l.result = 'ACCEPTED')
ON CONFLICT DO NOTHING
RETURNING kind, payout_id, seq, detail`
)

// attemptMismatchSQL: a CLAIMED payout whose own current claim — its fence
// token, its claimed_by — presented it to rail-proxy with an account, amount,
// currency or beneficiary the books refused (an UNBOOKED row of that token and
// owner whose fields are not the payout's). Its executor posts nothing and
// leaves it CLAIMED; only a person can say what the holder meant to pay. The
// fields compare exactly, as the gate compared them. One exception per payout
// (seq NULL: the unique index keeps it once, whatever later attempts of that
// claim do), carrying the first such attempt. payout_status_idx finds the CLAIMED
// payouts, rail_submission_payout_idx their attempts.
var attemptMismatchSQL = `
INSERT INTO reconciliation_exception (kind, payout_id, seq, detail)
SELECT DISTINCT ON (p.payout_id) 'ATTEMPT_MISMATCH', p.payout_id, NULL::bigint,
       format('CLAIMED by %s under fence token %s; its holder presented it (submission %s at %s) as %s %s on %s to beneficiary %s, which the books refused: the payout is %s %s on %s to beneficiary %s',
              p.claimed_by, p.fence_token, s.submission_id, s.submitted_at, s.amount_minor, s.currency, s.account_id,
              ` + maskSQL("s.beneficiary") + `, p.amount_minor, p.currency, p.account_id, ` + maskSQL("p.beneficiary") + `)
  FROM payout p
  JOIN rail_submission s ON s.payout_id = p.payout_id AND s.outcome = 'UNBOOKED'
                        AND s.presented_token = p.fence_token AND s.owner_id = p.claimed_by
 WHERE p.status = 'CLAIMED'
   AND (s.account_id, s.amount_minor, s.currency, s.beneficiary) IS DISTINCT FROM (p.account_id, p.amount_minor, p.currency, p.beneficiary)
 ORDER BY p.payout_id, s.submission_id
ON CONFLICT DO NOTHING
RETURNING kind, payout_id, seq, detail`

// crossCheck records what the lines and the books' current state prove together
// (step 3 of docs/contracts/reconciliation.md): LINE_CONTRADICTS_PAYOUT and
// PAID_WITHOUT_LINE; and what the audit trail and the books prove together:
// ATTEMPT_MISMATCH. It returns the exceptions newly recorded.
func (ss *session) crossCheck(ctx context.Context, settleAfter time.Duration) ([]exception, error) {
	ctx, cancel := context.WithTimeout(ctx, DBTimeout)
	defer cancel()
	var all []exception
	for _, q := range []struct {
		what string
		sql  string
		args []any
	}{
		{"contradicting lines", contradictionsSQL, nil},
		{"PAID payouts without a line", paidWithoutLineSQL, []any{settleAfter.Microseconds(), ss.perAccount}},
		{"claimed payouts presented otherwise", attemptMismatchSQL, nil},
	} {
		rows, err := ss.conn.Query(ctx, q.sql, q.args...)
		if err != nil {
			return all, fmt.Errorf("cross-check %s: %w", q.what, err)
		}
		got, err := collectExceptions(rows)
		if err != nil {
			return all, fmt.Errorf("cross-check %s: %w", q.what, err)
		}
		all = append(all, got...)
	}
	return all, nil
}

const countAmbiguousSQL = `SELECT count(*) FROM payout WHERE status = 'AMBIGUOUS'`

// countAmbiguous is the number of AMBIGUOUS payouts now.
func (ss *session) countAmbiguous(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, DBTimeout)
	defer cancel()
	var n int64
	if err := ss.conn.QueryRow(ctx, countAmbiguousSQL).Scan(&n); err != nil {
		return 0, fmt.Errorf("count AMBIGUOUS payouts: %w", err)
	}
	return n, nil
}

// countOverdueSQL counts rail-proxy's intents (outcome NULL) still unresolved
// OverdueGrace after their interrupt_at — submitted_at + 60 s, the default of
// docs/contracts/configuration.md RAIL_PROXY_INTERRUPTED_AFTER, for rows older than
// interrupt_at — judged by paydb's clock. Every live rail-proxy's janitor resolves
// such a row within its sweep interval (at most 10 s); one that stays means no
// janitor is sweeping paydb: every proxy is down, or paydb refuses their writes.
// The partial index rail_submission_unresolved_idx keeps this to the unresolved
// rows.
const countOverdueSQL = `SELECT count(*) FROM rail_submission
 WHERE outcome IS NULL
   AND coalesce(interrupt_at, submitted_at + interval '60 seconds') < now() - $1 * interval '1 millisecond'`

// OverdueGrace is how long past its interrupt_at an unresolved intent must be
// to count as overdue: three of a janitor's longest sweep intervals.
const OverdueGrace = 30 * time.Second

// countOverdue is the number of overdue intents now.
func (ss *session) countOverdue(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, DBTimeout)
	defer cancel()
	var n int64
	if err := ss.conn.QueryRow(ctx, countOverdueSQL, OverdueGrace.Milliseconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("count overdue intents: %w", err)
	}
	return n, nil
}

// rollback ends tx if it is still open, detached from a cancelled pass and briefly
// bounded, so a stopped pass never leaves a transaction open on its connection.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = tx.Rollback(rctx)
}

// knownFile is what paydb holds of one statement file name: the SHA-256 it was
// imported with ("" when it was not), and the other versions recorded as
// changed.
type knownFile struct {
	imported string
	changed  map[string]bool
}

const knownFilesSQL = `SELECT name, sha256, result FROM statement_file WHERE name = ANY($1)`

// knownFiles reads what paydb holds of the files named.
func (ss *session) knownFiles(ctx context.Context, names []string) (map[string]knownFile, error) {
	ctx, cancel := context.WithTimeout(ctx, DBTimeout)
	defer cancel()
	out := map[string]knownFile{}
	// A name paydb cannot take as text (NUL is no file name; invalid UTF-8 is)
	// was never imported: it is read, and found invalid.
	storable := make([]string, 0, len(names))
	for _, n := range names {
		if lockapi.StorableTextProblem(n, maxFileNameLen) == "" {
			storable = append(storable, n)
		}
	}
	rows, err := ss.conn.Query(ctx, knownFilesSQL, storable)
	if err != nil {
		return nil, fmt.Errorf("read the statement files imported: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, sum, result string
		if err := rows.Scan(&name, &sum, &result); err != nil {
			return nil, fmt.Errorf("read the statement files imported: %w", err)
		}
		k := out[name]
		if result == fileImported {
			k.imported = sum
		} else {
			if k.changed == nil {
				k.changed = map[string]bool{}
			}
			k.changed[sum] = true
		}
		out[name] = k
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the statement files imported: %w", err)
	}
	return out, nil
}

const (
	insertFileSQL = `INSERT INTO statement_file (name, sha256, result, entries) VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING
RETURNING file_id`

	insertFileExceptionSQL = `
INSERT INTO reconciliation_exception (kind, file_id, detail) VALUES ('STATEMENT_FILE_CHANGED', $1, $2)
ON CONFLICT DO NOTHING
RETURNING kind, payout_id, seq, detail`
)

// recordChangedFile records a version of an imported file name with other bytes,
// and its STATEMENT_FILE_CHANGED exception, in one transaction; each version
// once. It returns the exception when newly recorded.
func (ss *session) recordChangedFile(ctx context.Context, name, sum, importedSum string) ([]exception, error) {
	ctx, cancel := context.WithTimeout(ctx, DBTimeout)
	defer cancel()
	tx, err := ss.conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: "BEGIN; " + dbconn.RaiseSyncCommitSQL})
	if err != nil {
		return nil, fmt.Errorf("record changed statement file %s: begin: %w", name, err)
	}
	defer rollback(ctx, tx)
	var fileID int64
	err = tx.QueryRow(ctx, insertFileSQL, name, sum, fileChanged, nil).Scan(&fileID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil // recorded before
	}
	if err != nil {
		return nil, fmt.Errorf("record changed statement file %s: %w", name, err)
	}
	detail := fmt.Sprintf("statement file %s changed after its import: its bytes now have SHA-256 %s, it was imported with %s; nothing of this version is imported",
		name, sum, importedSum)
	rows, err := tx.Query(ctx, insertFileExceptionSQL, fileID, detail)
	if err != nil {
		return nil, fmt.Errorf("record changed statement file %s: %w", name, err)
	}
	recorded, err := collectExceptions(rows)
	if err != nil {
		return nil, fmt.Errorf("record changed statement file %s: %w", name, err)
	}
	for i := range recorded {
		recorded[i].FileID = &fileID
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("record changed statement file %s: commit: %w", name, err)
	}
	return recorded, nil
}

// copiedAcceptedSQL finds which of the given (account, rail reference) pairs an
// ACCEPTED line of the copy already has (rail_statement_line_rail_reference_idx).
const copiedAcceptedSQL = `
SELECT DISTINCT l.account_id, l.rail_reference
  FROM rail_statement_line l
  JOIN unnest($1::text[], $2::text[]) AS k(account_id, rail_reference)
    ON l.account_id = k.account_id AND l.rail_reference = k.rail_reference
 WHERE l.result = 'ACCEPTED'`

// withoutRepeats drops the ACCEPTED lines whose account and rail reference are
// already in the copy, or earlier in lines: the same booking shown again (an
// overlapping statement) is not a second payment, and is not imported again —
// so it raises no PRESENTED_TWICE. Lines paydb cannot store are kept, for the
// import to set aside as it does.
func (ss *session) withoutRepeats(ctx context.Context, tx pgx.Tx, lines []lockapi.StatementLine) (kept, repeated []lockapi.StatementLine, err error) {
	type key struct{ account, ref string }
	keyOf := func(l lockapi.StatementLine) (key, bool) {
		if l.Result != lockapi.ResultAccepted || l.RailReference == nil || *l.RailReference == "" {
			return key{}, false
		}
		if f, _ := unstorable(l); f != "" {
			return key{}, false
		}
		return key{l.AccountID, *l.RailReference}, true
	}
	var accts, refs []string
	for _, l := range lines {
		if k, ok := keyOf(l); ok {
			accts, refs = append(accts, k.account), append(refs, k.ref)
		}
	}
	if len(accts) == 0 {
		return lines, nil, nil
	}
	rows, err := tx.Query(ctx, copiedAcceptedSQL, accts, refs)
	if err != nil {
		return nil, nil, fmt.Errorf("look up lines already copied: %w", err)
	}
	seen := map[key]bool{}
	for rows.Next() {
		var k key
		if err := rows.Scan(&k.account, &k.ref); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("look up lines already copied: %w", err)
		}
		seen[k] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("look up lines already copied: %w", err)
	}
	kept = make([]lockapi.StatementLine, 0, len(lines))
	for _, l := range lines {
		k, ok := keyOf(l)
		switch {
		case !ok:
		case seen[k]:
			repeated = append(repeated, l)
			continue
		default:
			seen[k] = true
		}
		kept = append(kept, l)
	}
	return kept, repeated, nil
}

const (
	// nextSeqSQL is where the lines of a file start: after every line copied
	// and after the cursor (a line set aside as unstorable has a seq too).
	nextSeqSQL = `SELECT greatest(coalesce((SELECT max(seq) FROM rail_statement_line), 0),
                coalesce((SELECT last_seq FROM reconciler_cursor), 0))`

	// advanceCoverageSQL moves each account's coverage forward to the end of
	// the latest statement period imported for it, never past paydb's clock
	// now: a statement that claims to cover the future covers only what has
	// happened. One row per account (an account with several statements in
	// one file takes the latest).
	advanceCoverageSQL = `
INSERT INTO statement_coverage AS c (account_id, covered_to)
SELECT account_id, least(max(to_time), now())
  FROM unnest($1::text[], $2::timestamptz[]) AS u(account_id, to_time)
 GROUP BY account_id
ON CONFLICT (account_id) DO UPDATE SET covered_to = GREATEST(c.covered_to, EXCLUDED.covered_to)`
)

// fileImport is what importing one statement file did.
type fileImport struct {
	done     bool // false: the name was imported meanwhile, nothing done
	imported int64
	lastSeq  int64
	recorded []exception
	repeated []lockapi.StatementLine // ACCEPTED lines already in the copy, left out
}

// importFile imports a valid statement file in one transaction: its lines,
// numbered after every line copied in entry order (an ACCEPTED line already in
// the copy left out), the exceptions they prove on their own, the file's row,
// the coverage of each account whose statement has a period, and the cursor. A
// failure anywhere imports nothing of it.
func (ss *session) importFile(ctx context.Context, name, sum string, pf parsedFile) (res fileImport, err error) {
	ctx, cancel := context.WithTimeout(ctx, DBTimeout)
	defer cancel()
	tx, err := ss.conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: "BEGIN; " + dbconn.RaiseSyncCommitSQL})
	if err != nil {
		return res, fmt.Errorf("begin: %w", err)
	}
	defer rollback(ctx, tx)
	var next int64
	if err := tx.QueryRow(ctx, nextSeqSQL).Scan(&next); err != nil {
		return res, fmt.Errorf("number its lines: %w", err)
	}
	lines, repeated, err := ss.withoutRepeats(ctx, tx, pf.lines)
	if err != nil {
		return res, err
	}
	lines = slices.Clone(lines)
	for i := range lines {
		next++
		lines[i].Seq = next
	}
	res.lastSeq = next
	lines, res.recorded, err = ss.setAsideUnstorable(ctx, tx, lines)
	if err != nil {
		return res, err
	}
	if res.imported, err = insertLines(ctx, tx, lines); err != nil {
		return res, err
	}
	proved, err := lineExceptions(ctx, tx, lines)
	if err != nil {
		return res, err
	}
	res.recorded = append(res.recorded, proved...)
	var fileID int64
	err = tx.QueryRow(ctx, insertFileSQL, name, sum, fileImported, len(pf.lines)).Scan(&fileID)
	if errors.Is(err, pgx.ErrNoRows) {
		return fileImport{}, nil
	}
	if err != nil {
		return res, fmt.Errorf("record the file: %w", err)
	}
	var accts []string
	var tos []time.Time
	for _, s := range pf.stmts {
		if s.To == nil || lockapi.StorableTextProblem(s.Account, maxLineTextLen) != "" {
			continue // no period: it says nothing of what the rail had not booked
		}
		accts, tos = append(accts, s.Account), append(tos, *s.To)
	}
	if len(accts) > 0 {
		if _, err := tx.Exec(ctx, advanceCoverageSQL, accts, tos); err != nil {
			return res, fmt.Errorf("advance the coverage: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, advanceCursorSQL, res.lastSeq, nil); err != nil {
		return res, fmt.Errorf("advance the cursor to %d: %w", res.lastSeq, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("commit: %w", err)
	}
	res.done, res.repeated = true, repeated
	return res, nil
}

// insertLines copies lines (storable, numbered) in tx and returns how many were
// new.
func insertLines(ctx context.Context, tx pgx.Tx, lines []lockapi.StatementLine) (int64, error) {
	n := len(lines)
	if n == 0 {
		return 0, nil
	}
	var (
		seqs    = make([]int64, n)
		at      = make([]time.Time, n)
		refs    = make([]string, n)
		accts   = make([]string, n)
		amounts = make([]int64, n)
		curs    = make([]string, n)
		results = make([]string, n)
		railRef = make([]*string, n)
		reasons = make([]*string, n)
		benefs  = make([]string, n)
	)
	for i, l := range lines {
		seqs[i], at[i], refs[i], accts[i], amounts[i] = l.Seq, l.ReceivedAt, l.Reference, l.AccountID, l.AmountMinor
		curs[i], results[i], railRef[i], reasons[i], benefs[i] = l.Currency, l.Result, l.RailReference, l.DeclineReason, l.Beneficiary
	}
	tag, err := tx.Exec(ctx, insertLinesSQL, seqs, at, refs, accts, amounts, curs, results, railRef, reasons, benefs)
	if err != nil {
		return 0, fmt.Errorf("import lines %d–%d: %w", lines[0].Seq, lines[n-1].Seq, err)
	}
	return tag.RowsAffected(), nil
}

// lineExceptions records in tx what the lines just copied prove on their own.
func lineExceptions(ctx context.Context, tx pgx.Tx, lines []lockapi.StatementLine) ([]exception, error) {
	n := len(lines)
	if n == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, lineExceptionsSQL, lines[0].Seq, lines[n-1].Seq)
	if err != nil {
		return nil, fmt.Errorf("check lines %d–%d: %w", lines[0].Seq, lines[n-1].Seq, err)
	}
	proved, err := collectExceptions(rows)
	if err != nil {
		return nil, fmt.Errorf("check lines %d–%d: %w", lines[0].Seq, lines[n-1].Seq, err)
	}
	return proved, nil
}
