package railproxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/dbconn"
	"lock.dev/lockapi"
)

// This file and store.go are the only ones that speak SQL or know pgx: the
// group forms of admission and resolution (docs/contracts/rail-proxy.md, "Group
// admission"; admission.go names both places the fence is compared).

// admitGroupSQL calls paydb's rail_admit_group_skip_locked_by, defined in
// internal/paydb/migrations/00012_rail_admit_group_submitter.sql —
// rail_admit_group_skip_locked (00007) with each member's submitter identity as
// an eleventh argument, recorded on its row — steps 1–2
// for the whole group, in one statement, never waiting for a mark row another
// transaction holds (those members come back deferred). The fence is its line
// `v_passed[j] := v_marks[k] < p_token[i]`: the mark each member meets is its
// account's as the group's earlier members left it, so the verdicts are those
// of admitSQL one by one (TestGroupAdmissionEqualsOneByOne). It is the group
// statement with the books check off.
const admitGroupSQL = `SELECT o_ord, o_deferred, o_submission_id, o_submitted_at, o_outcome, o_passed_fence, o_mark
  FROM rail_admit_group_skip_locked_by($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`

// admitGroupBooksSQL is the group statement with the books check on
// (docs/contracts/books.md): paydb's rail_admit_group_books_by (00012: the
// submitter identities added to rail_admit_group_books, defined in
// internal/paydb/migrations/00010_rail_admit_group_books.sql), which is
// rail_admit_group_skip_locked judging each member's payout row too — the fence
// verdict first, then the first books check that fails (o_mismatch, in the
// order of lockapi.BooksMismatchOrder) makes the member UNBOOKED and leaves
// its mark where it was — exactly as the one-by-one books statement does
// (TestGroupAdmissionEqualsOneByOne). Same arguments as admitGroupSQL.
const admitGroupBooksSQL = `SELECT o_ord, o_deferred, o_submission_id, o_submitted_at, o_outcome, o_passed_fence, o_mark,
       o_mismatch
  FROM rail_admit_group_books_by($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`

// skipHeldSQL bounds, for the rest of the transaction, how long a statement
// waits for a row another transaction holds: the bound rail_admit_group_skip_locked
// sets on itself, for the worker's group of one (the pinned statements).
const skipHeldSQL = `SET LOCAL lock_timeout = '1ms'`

// MemberResult is what became of one member of a group: its committed admission,
// the *CommitError its answer is made of, or Alone.
type MemberResult struct {
	Admission Admission
	Err       error
	// Alone: the group did not decide this member and wrote nothing for it — its
	// account's mark row was held by another transaction, or the group's
	// statement failed before COMMIT for a reason one member, a meeting with
	// another transaction or the group's own deadline can cause. It is to be
	// admitted on its own (Store.Admit), within its own bound.
	Alone bool
}

// dbConn is a pooled paydb connection a group holds from the moment it is formed
// until its transaction has ended; the dispatcher (group.go) handles it without
// knowing pgx.
type dbConn struct{ c *pgxpool.Conn }

func (d dbConn) release() { d.c.Release() }

// acquire waits for a paydb connection (ctx bounds the wait).
func (s *Store) acquire(ctx context.Context) (dbConn, error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return dbConn{}, err
	}
	return dbConn{c: c}, nil
}

// maxConns is the paydb pool's size.
func (s *Store) maxConns() int { return int(s.pool.Config().MaxConns) }

// AdmitGroup runs steps 1–3 for subs, as Admit does for one: the verdicts, rows
// and marks are those of admitting subs one by one — the group's decided
// members in their order, then the members it left Alone, one by one in theirs
// (each on its own connection, as Admit). It returns one result per member, in
// subs' order, none Alone. ctx bounds everything, the waits for connections
// included.
func (s *Store) AdmitGroup(ctx context.Context, subs []Submission, fencing, books bool, interruptAfter time.Duration) []MemberResult {
	conn, err := s.acquire(ctx)
	if err != nil {
		return failAll(len(subs), &CommitError{Err: fmt.Errorf("waiting for a paydb connection: %w", err)})
	}
	out, _ := admitGroupOn(ctx, conn.c, subs, fencing, books, interruptAfter)
	conn.release()
	for i := range out {
		if out[i].Alone {
			a, err := s.Admit(ctx, subs[i], fencing, books, interruptAfter)
			out[i] = MemberResult{Admission: a, Err: err}
		}
	}
	return out
}

// groupSubmitters is the group statement's p_submitter: each member's verified
// SPIFFE ID, NULL for a member presented without one; NULL as a whole (one
// parameter, nothing per member) when no member has one — a proxy without
// identities.
func groupSubmitters(subs []Submission) []*string {
	var out []*string
	for i := range subs {
		if subs[i].SubmitterIdentity == "" {
			continue
		}
		if out == nil {
			out = make([]*string, len(subs))
		}
		out[i] = &subs[i].SubmitterIdentity
	}
	return out
}

func failAll(n int, err error) []MemberResult {
	out := make([]MemberResult, n)
	for i := range out {
		out[i].Err = err
	}
	return out
}

func allAlone(n int) []MemberResult {
	out := make([]MemberResult, n)
	for i := range out {
		out[i].Alone = true
	}
	return out
}

// admitGroupOn is AdmitGroup on a connection the caller holds, without the
// admissions of the members it leaves Alone: it never waits for a mark row
// another transaction holds, so what one account's row does decides nothing
// for the others. Round trips: BEGIN, the synchronous-commit raise and the
// group statement in one pipelined batch; the first-attempt reads of DUPLICATE
// members (rare); COMMIT on its own, once every submission_id is known, so a
// commit whose answer is lost still names the rows that may exist.
//
// A member whose account's mark row another transaction holds is Alone; the
// others are decided and committed. A group of one runs the pinned statements
// with the same bound on the wait (skipHeldSQL).
//
// When the transaction fails before COMMIT for a reason one member's values or
// a meeting with another transaction can cause (a data exception, an integrity
// violation, a lock not available, a deadlock or serialization failure), or
// because ctx — the earliest member's bound — ran out, it is rolled back and
// every member is Alone: nothing was written, and each member is then admitted
// on its own, within its own bound rather than what is left of another's;
// fellBack is then the failure. Any other failure before COMMIT (paydb cannot
// take work) fails every member: nothing was written.
func admitGroupOn(ctx context.Context, conn *pgxpool.Conn, subs []Submission, fencing, books bool, interruptAfter time.Duration) (_ []MemberResult, fellBack error) {
	if len(subs) == 1 {
		a, err := admitOn(ctx, conn, subs[0], fencing, books, interruptAfter, true)
		if lockNotAvailable(err) {
			return allAlone(1), nil
		}
		return []MemberResult{{Admission: a, Err: err}}, nil
	}
	n := len(subs)
	var (
		accounts, payouts, owners, idems, currencies, beneficiaries = make([]string, n), make([]string, n),
			make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		tokens, amounts = make([]int64, n), make([]int64, n)
	)
	for i, s := range subs {
		accounts[i], tokens[i], payouts[i], owners[i], idems[i] = s.AccountID, s.Token, s.PayoutID, s.OwnerID, s.IdempotencyKey
		amounts[i], currencies[i], beneficiaries[i] = s.AmountMinor, s.Currency, s.Beneficiary
	}
	submitters := groupSubmitters(subs)

	inTx := false
	// failed ends the transaction after a failure before COMMIT.
	failed := func(err error) ([]MemberResult, error) {
		inTx = inTx || conn.Conn().PgConn().TxStatus() != 'I'
		if inTx {
			rollback(ctx, conn)
		}
		if memberCaused(err) || lockNotAvailable(err) || ctx.Err() != nil {
			return allAlone(n), err
		}
		return failAll(n, &CommitError{Err: err}), nil
	}

	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue(dbconn.RaiseSyncCommitSQL)
	sql := admitGroupSQL
	if books {
		sql = admitGroupBooksSQL
	}
	b.Queue(sql, accounts, tokens, payouts, owners, idems, amounts, currencies, beneficiaries,
		fencing, interruptAfter.Milliseconds(), submitters)
	br := conn.SendBatch(ctx, b)
	out := make([]MemberResult, n)
	_, err := br.Exec()
	if err == nil {
		inTx = true
		_, err = br.Exec()
	}
	if err == nil {
		err = scanGroup(br, out, books)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return failed(fmt.Errorf("group admission statement: %w", err))
	}

	for i := range out {
		a := &out[i].Admission
		if out[i].Alone || a.Verdict != Duplicate {
			continue
		}
		first, err := firstAttempt(ctx, conn, subs[i].PayoutID)
		if err != nil {
			return failed(fmt.Errorf("reading the first attempt: %w", err))
		}
		a.First = first
	}

	if cerr := commit(ctx, conn); cerr != nil {
		for i := range out {
			if out[i].Alone {
				continue // nothing of it was written
			}
			e := *cerr
			e.SubmissionID, e.Intent = out[i].Admission.SubmissionID, out[i].Admission.Verdict == Admitted
			out[i] = MemberResult{Err: &e}
		}
	}
	return out, nil
}

// scanGroup reads the group statement's rows into out, by ordinal; with books,
// the rows of admitGroupBooksSQL, which carry the mismatch.
func scanGroup(br pgx.BatchResults, out []MemberResult, books bool) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var (
			ord      int32
			deferred bool
			id       *int64
			at       *time.Time
			outcome  *string
			passed   *bool
			mark     *int64
			mismatch string
		)
		if books {
			// Declared here, so that only the books path pays for scanning it.
			var mm *string
			if err := rows.Scan(&ord, &deferred, &id, &at, &outcome, &passed, &mark, &mm); err != nil {
				return err
			}
			if mm != nil {
				mismatch = *mm
			}
		} else if err := rows.Scan(&ord, &deferred, &id, &at, &outcome, &passed, &mark); err != nil {
			return err
		}
		if ord < 1 || int(ord) > len(out) {
			return fmt.Errorf("group admission returned ordinal %d for a group of %d", ord, len(out))
		}
		seen++
		if deferred {
			out[ord-1].Alone = true
			continue
		}
		if id == nil || at == nil || passed == nil {
			return fmt.Errorf("group admission returned member %d decided without its row", ord)
		}
		a := Admission{SubmissionID: *id, SubmittedAt: *at, PassedFence: *passed}
		switch {
		case outcome == nil:
			a.Verdict = Admitted
		case *outcome == lockapi.OutcomeFenced:
			a.Verdict = Fenced
			if mark == nil {
				return errors.New("group admission fenced a submission without a mark")
			}
			a.HighestToken = *mark
		case *outcome == lockapi.OutcomeDuplicate:
			a.Verdict = Duplicate
		case books && *outcome == lockapi.OutcomeUnbooked:
			a.Verdict = Unbooked
			if mismatch == "" {
				return errors.New("group admission refused a submission unbooked without naming the mismatch")
			}
			a.Mismatch = mismatch
		default:
			return fmt.Errorf("group admission returned outcome %q", *outcome)
		}
		out[ord-1].Admission = a
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if seen != len(out) {
		return fmt.Errorf("group admission returned %d rows for a group of %d", seen, len(out))
	}
	return nil
}

// memberCaused says whether a failed group statement may owe its failure to one
// member's values or to its meeting another transaction, rather than to paydb
// being unable to take it: then admitting the members one by one can still
// succeed for every member but the one at fault.
func memberCaused(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || len(pe.Code) != 5 {
		return false
	}
	switch pe.Code[:2] {
	case "22", "23": // data exception, integrity constraint violation
		return true
	}
	return pe.Code == "40P01" || pe.Code == "40001" // deadlock, serialization failure
}

// lockNotAvailable says whether err is PostgreSQL's lock_not_available: a
// statement that waited lock_timeout for a row another transaction holds.
func lockNotAvailable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

// resolveGroupSQL is the pinned resolution (docs/contracts/database.md) for
// many rows in one statement: the same conditional `outcome IS NULL`, so it is
// idempotent and never overwrites what someone else wrote; the rows it changed
// come back.
const resolveGroupSQL = `
UPDATE rail_submission s
   SET outcome = u.o, rail_reference = u.r, decline_reason = u.d, resolved_at = clock_timestamp()
  FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[]) AS u(id, o, r, d)
 WHERE s.submission_id = u.id AND s.outcome IS NULL
RETURNING s.submission_id`

// ResolveGroup makes the resolving writes of res in one statement and reports,
// for each, whether it changed the row (false: already resolved, or no such row
// — Attempt then tells which, as after Resolve). An error means none was made,
// except one wrapping dbconn.ErrCommitNotDurable: then the rows reported true are
// resolved on the primary, not known to be on the standby (as for Resolve).
func (s *Store) ResolveGroup(ctx context.Context, res []resolution) ([]bool, error) {
	if len(res) == 1 {
		ok, err := s.Resolve(ctx, res[0].id, res[0].outcome, res[0].railRef, res[0].reason)
		return []bool{ok}, err
	}
	// A row named twice (two writers of one outcome, a rare race) is written by
	// its first mention only; the other then finds it resolved, as it would one
	// by one.
	ids := make([]int64, 0, len(res))
	outcomes := make([]string, 0, len(res))
	refs := make([]*string, 0, len(res))
	reasons := make([]*string, 0, len(res))
	first := make(map[int64]int, len(res))
	for i, r := range res {
		if _, dup := first[r.id]; dup {
			continue
		}
		first[r.id] = i
		ids, outcomes = append(ids, r.id), append(outcomes, r.outcome)
		refs, reasons = append(refs, r.railRef), append(reasons, r.reason)
	}
	wrote := make(map[int64]bool, len(res))
	err := dbconn.DurableBatch(ctx, s.pool, func(b *pgx.Batch) {
		b.Queue(resolveGroupSQL, ids, outcomes, refs, reasons)
	}, func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return err
			}
			wrote[id] = true
		}
		return rows.Err()
	})
	out := make([]bool, len(res))
	for i, r := range res {
		out[i] = wrote[r.id] && first[r.id] == i
	}
	if err != nil {
		if !errors.Is(err, dbconn.ErrCommitNotDurable) {
			clear(out)
		}
		return out, fmt.Errorf("resolving %d submissions: %w", len(res), err)
	}
	return out, nil
}

// admitGroupConn is AdmitGroup on a connection the dispatcher holds.
func (s *Store) admitGroupConn(ctx context.Context, conn dbConn, subs []Submission, fencing, books bool, interruptAfter time.Duration) ([]MemberResult, error) {
	return admitGroupOn(ctx, conn.c, subs, fencing, books, interruptAfter)
}
