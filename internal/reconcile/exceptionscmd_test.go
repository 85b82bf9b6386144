package reconcile_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/pgtest"
	"lock.dev/internal/railstub"
	"lock.dev/internal/reconcile"
	"lock.dev/internal/service"
	"lock.dev/internal/stack"
	"lock.dev/lockapi"
)

// exceptionsFixture is a paydb with three open exceptions and what they are
// about: an AMBIGUOUS payout whose only line is for another amount
// (AMOUNT_MISMATCH, with its history, its attempt and the line), a line for no
// payout (UNKNOWN_REFERENCE) and a PAID payout without a line
// (PAID_WITHOUT_LINE).
type exceptionsFixture struct {
	url  string
	pool *pgxpool.Pool
	// ids of the three exceptions, by kind
	amount, unknown, paidWithout int64
}

func newExceptionsFixture(t *testing.T) *exceptionsFixture {
	t.Helper()
	f := &exceptionsFixture{url: pgtest.PaydbURL(t)}
	f.pool = pgtest.Pool(t, f.url)
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary, status, fence_token, claimed_by)
		 VALUES ('p-amount', 'acct-1', 1500, 'EUR', 'NL91ABNA0417164300', 'AMBIGUOUS', 7, 'executor-1'),
		        ('p-paid', 'acct-2', 900, 'EUR', 'DE89370400440532013000', 'PAID', 3, 'executor-2')`,
		`INSERT INTO payout_history (payout_id, status, fence_token, owner_id, actor)
		 VALUES ('p-amount', 'PENDING', 0, NULL, 'spiffe://lock.dev/ops'),
		        ('p-amount', 'CLAIMED', 7, 'executor-1', 'spiffe://lock.dev/executor'),
		        ('p-amount', 'AMBIGUOUS', 7, 'executor-1', 'spiffe://lock.dev/executor')`,
		`INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency,
		     beneficiary, outcome, resolved_at)
		 VALUES ('p-amount', 'acct-1', 7, 'executor-1', 'k-1', 1500, 'EUR', 'NL91ABNA0417164300', 'TIMEOUT', now())`,
		`INSERT INTO rail_statement_line (seq, received_at, reference, account_id, amount_minor, currency, beneficiary, result, rail_reference)
		 VALUES (1, now(), 'p-amount', 'acct-1', 1501, 'EUR', 'NL91ABNA0417164300', 'ACCEPTED', 'R-1'),
		        (2, now(), 'nobody', 'acct-3', 77, 'EUR', 'FR7630006000011234567890189', 'ACCEPTED', 'R-2')`,
	} {
		if _, err := f.pool.Exec(ctx, q); err != nil {
			t.Fatalf("fixture: %v\n%s", err, q)
		}
	}
	insert := func(kind string, payout *string, seq *int64, detail string) int64 {
		t.Helper()
		var id int64
		if err := f.pool.QueryRow(ctx, `INSERT INTO reconciliation_exception (kind, payout_id, seq, detail) VALUES ($1, $2, $3, $4)
		  RETURNING exception_id`, kind, payout, seq, detail).Scan(&id); err != nil {
			t.Fatalf("fixture exception: %v", err)
		}
		return id
	}
	ptr := func(s string) *string { return &s }
	seq := func(n int64) *int64 { return &n }
	f.amount = insert(reconcile.KindAmountMismatch, ptr("p-amount"), seq(1), "line 1: acct-1 1501 EUR, payout: acct-1 1500 EUR")
	f.unknown = insert(reconcile.KindUnknownReference, nil, seq(2), "line 2: reference nobody is no payout")
	f.paidWithout = insert(reconcile.KindPaidWithoutLine, ptr("p-paid"), nil, "PAID, no ACCEPTED line")
	return f
}

// run is `reconciler exceptions args…` on the fixture's paydb (or url).
func (f *exceptionsFixture) run(t *testing.T, dbURL string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	if dbURL == "" {
		dbURL = f.url
	}
	var out, errOut bytes.Buffer
	getenv := func(k string) string {
		if k == "PAYDB_URL" {
			return dbURL
		}
		return ""
	}
	code = reconcile.Exceptions(context.Background(), args, getenv, &out, &errOut)
	return out.String(), errOut.String(), code
}

func (f *exceptionsFixture) list(t *testing.T, args ...string) []reconcile.Exception {
	t.Helper()
	out, errOut, code := f.run(t, "", append([]string{"list", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("list %v: exit %d, %s", args, code, errOut)
	}
	var list []reconcile.Exception
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("list --json: %v\n%s", err, out)
	}
	return list
}

func (f *exceptionsFixture) decisions(t *testing.T) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM reconciliation_decision`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func ids(list []reconcile.Exception) []int64 {
	var out []int64
	for _, e := range list {
		out = append(out, e.ExceptionID)
	}
	return out
}

func id(n int64) string { return strconv.FormatInt(n, 10) }

// The operator's round: list shows the open exceptions, show one with its
// context, resolve records who, what, why and when beside it — paydb's login
// and clock — and moves nothing; a second resolve is refused with the decision
// that stands, an unknown id and a resolution without --by or --note are
// refused (exit 2) with nothing written, and list hides the decided one
// unless --all.
func TestExceptionsListShowResolve(t *testing.T) {
	t.Parallel()
	f := newExceptionsFixture(t)
	ctx := context.Background()

	if got := ids(f.list(t)); fmt.Sprint(got) != fmt.Sprint([]int64{f.amount, f.unknown, f.paidWithout}) {
		t.Fatalf("open exceptions %v, want the three of the fixture", got)
	}
	out, _, code := f.run(t, "", "list")
	if code != 0 || !strings.Contains(out, "KIND") || !strings.Contains(out, reconcile.KindUnknownReference) || !strings.Contains(out, "3 open exceptions") {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	if got := f.list(t, "--kind", reconcile.KindPaidWithoutLine); len(got) != 1 || got[0].ExceptionID != f.paidWithout {
		t.Fatalf("list --kind PAID_WITHOUT_LINE: %v", ids(got))
	}

	out, errOut, code := f.run(t, "", "show", id(f.amount), "--json")
	var c reconcile.ExceptionContext
	if code != 0 || json.Unmarshal([]byte(out), &c) != nil {
		t.Fatalf("show --json: exit %d, %s\n%s", code, errOut, out)
	}
	if c.Kind != reconcile.KindAmountMismatch || c.Payout == nil || c.Payout.Status != "AMBIGUOUS" || len(c.History) != 3 ||
		len(c.Submissions) != 1 || len(c.Lines) != 1 || c.Lines[0].AmountMinor != 1501 || c.Decision != nil {
		t.Fatalf("show: %+v", c)
	}
	// An UNKNOWN_REFERENCE names no payout: its own line is its context.
	out, _, code = f.run(t, "", "show", id(f.unknown))
	if code != 0 || !strings.Contains(out, "nobody") || !strings.Contains(out, "never settles or unsettles") {
		t.Fatalf("show %d: exit %d\n%s", f.unknown, code, out)
	}

	// Refusals before anything is written: exit 2, one line, no row.
	for _, args := range [][]string{
		{"resolve", id(f.amount), "--decision", "written-off", "--note", "recalled"},               // no --by
		{"resolve", id(f.amount), "--decision", "written-off", "--by", "alice"},                    // no --note
		{"resolve", id(f.amount), "--decision", "written-off", "--by", "  ", "--note", "recalled"}, // a blank --by
		{"resolve", id(f.amount), "--decision", "written-off", "--by", "alice", "--note", " \n "},  // a blank --note
		{"resolve", id(f.amount), "--by", "alice", "--note", "recalled"},                           // no --decision
		{"resolve", id(f.amount), "--decision", "forgiven", "--by", "alice", "--note", "recalled"}, // not a decision
		{"resolve", "999999", "--decision", "written-off", "--by", "alice", "--note", "recalled"},  // no such exception
		{"resolve", "--decision", "written-off", "--by", "alice", "--note", "recalled"},            // no id
		{"resolve", "x1", "--decision", "written-off", "--by", "alice", "--note", "recalled"},      // not an id
		{"show", "999999"},
	} {
		_, errOut, code := f.run(t, "", args...)
		if code != 2 || errOut == "" || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line", args, code, errOut)
		}
		if n := f.decisions(t); n != 0 {
			t.Fatalf("%v wrote %d decisions", args, n)
		}
	}
	if _, errOut, _ := f.run(t, "", "resolve", "999999", "--decision", "refunded", "--by", "a", "--note", "n"); !strings.Contains(errOut, "no such exception") {
		t.Errorf("unknown id: %q, want it named", errOut)
	}
	if _, errOut, _ := f.run(t, "", "resolve", id(f.amount), "--decision", "refunded", "--note", "n"); !strings.Contains(errOut, "--by") {
		t.Errorf("no --by: %q, want it named", errOut)
	}

	var before time.Time
	if err := f.pool.QueryRow(ctx, `SELECT now()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	note := "rail recalled the 0.01 EUR overpayment (case 4411)\nledger untouched"
	out, errOut, code = f.run(t, "", "resolve", id(f.amount), "--decision", reconcile.DecisionRefunded, "--by", "alice@ops", "--note", note)
	if code != 0 || !strings.Contains(out, "refunded by alice@ops") || !strings.Contains(out, "Nothing was settled or unsettled") {
		t.Fatalf("resolve: exit %d, %s\n%s", code, errOut, out)
	}
	var d reconcile.Decision
	var at, after time.Time
	var login, currentUser string
	if err := f.pool.QueryRow(ctx, `SELECT decision, decided_by, note, decided_login, decided_at, now(), current_user
	  FROM reconciliation_decision WHERE exception_id = $1`, f.amount).Scan(&d.Decision, &d.DecidedBy, &d.Note, &login, &at, &after, &currentUser); err != nil {
		t.Fatalf("the decision row: %v", err)
	}
	if d.Decision != reconcile.DecisionRefunded || d.DecidedBy != "alice@ops" || d.Note != note || login != currentUser ||
		at.Before(before) || at.After(after) {
		t.Fatalf("decision %+v login %q at %s; want refunded by alice@ops, the note, login %q, between %s and %s",
			d, login, at, currentUser, before, after)
	}
	// Nothing moved: the payout is AMBIGUOUS, unbooked, and the exception as it was.
	var status string
	var entries, settlements int
	if err := f.pool.QueryRow(ctx, `SELECT status, (SELECT count(*) FROM ledger_entry), (SELECT count(*) FROM payout_settlement)
	  FROM payout WHERE payout_id = 'p-amount'`).Scan(&status, &entries, &settlements); err != nil || status != "AMBIGUOUS" || entries != 0 || settlements != 0 {
		t.Fatalf("after resolve: payout %s, %d ledger entries, %d settlements (%v); want it untouched", status, entries, settlements, err)
	}

	// Decided once: a second resolve is refused with the decision that stands.
	_, errOut, code = f.run(t, "", "resolve", id(f.amount), "--decision", reconcile.DecisionAcceptedAsIs, "--by", "bob", "--note", "fine")
	if code != 2 || !strings.Contains(errOut, "already decided") || !strings.Contains(errOut, "alice@ops") {
		t.Fatalf("second resolve: exit %d, %q; want 2 naming the decision that stands", code, errOut)
	}
	if n := f.decisions(t); n != 1 {
		t.Fatalf("%d decisions after the refused second resolve", n)
	}

	// The decided one leaves the open list; --all shows it with its decision.
	if got := ids(f.list(t)); fmt.Sprint(got) != fmt.Sprint([]int64{f.unknown, f.paidWithout}) {
		t.Fatalf("open exceptions after resolve: %v", got)
	}
	all := f.list(t, "--all")
	if len(all) != 3 || all[0].ExceptionID != f.amount || all[0].Decision == nil || all[0].Decision.DecidedBy != "alice@ops" || all[1].Decision != nil {
		t.Fatalf("list --all: %+v", all)
	}
	out, _, _ = f.run(t, "", "list", "--all")
	if !strings.Contains(out, "refunded by alice@ops") || !strings.Contains(out, "open") {
		t.Fatalf("list --all:\n%s", out)
	}
	out, _, _ = f.run(t, "", "show", id(f.amount))
	if !strings.Contains(out, "alice@ops") || !strings.Contains(out, "(case 4411) ledger untouched") {
		t.Fatalf("show after resolve:\n%s", out)
	}
}

// Two operators deciding one exception at once: exactly one decision is
// recorded; the other is refused, exit 2, naming it.
func TestExceptionsConcurrentResolve(t *testing.T) {
	t.Parallel()
	f := newExceptionsFixture(t)
	const n = 4
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, _, codes[i] = f.run(t, "", "resolve", id(f.unknown), "--decision", reconcile.DecisionAcceptedAsIs,
				"--by", "operator-"+strconv.Itoa(i), "--note", "another system's payment on acct-3")
		})
	}
	wg.Wait()
	ok := 0
	for _, c := range codes {
		switch c {
		case 0:
			ok++
		case 2:
		default:
			t.Errorf("exit %d", c)
		}
	}
	if ok != 1 || f.decisions(t) != 1 {
		t.Fatalf("exits %v, %d decisions; want exactly one recorded", codes, f.decisions(t))
	}
}

// The decisions the command offers are exactly those paydb's CHECK admits.
func TestDecisionsAreTheTablesCheck(t *testing.T) {
	t.Parallel()
	f := newExceptionsFixture(t)
	ctx := context.Background()
	try := func(decision string) error {
		tx, err := f.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `INSERT INTO reconciliation_decision (exception_id, decision, decided_by, note) VALUES ($1, $2, 'a', 'n')`,
			f.amount, decision)
		return err
	}
	for _, d := range reconcile.Decisions() {
		if err := try(d); err != nil {
			t.Errorf("%s refused by paydb: %v", d, err)
		}
	}
	var pgErr *pgconn.PgError
	if err := try("forgiven"); !errors.As(err, &pgErr) || pgErr.Code != "23514" {
		t.Errorf("a decision outside the set: %v, want a CHECK violation", err)
	}
}

// On the operators' own login (PAYDB_ROLE_OPERATOR, docs/contracts/database.md):
// list, show and resolve work with only what the grants file gives it, the
// decision records that login, and the login may not write the decision's
// login or time, rewrite or remove a decision, move a payout or record an
// exception.
func TestExceptionsOnTheOperatorsLogin(t *testing.T) {
	t.Parallel()
	f := newExceptionsFixture(t)
	ctx := context.Background()
	login := fmt.Sprintf("operator_%d", time.Now().UnixNano())
	if _, err := f.pool.Exec(ctx, `CREATE ROLE `+login+` LOGIN PASSWORD 'not-a-secret'`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = f.pool.Exec(context.Background(), `DROP OWNED BY `+login)
		_, _ = f.pool.Exec(context.Background(), `DROP ROLE `+login)
	})
	cfg := reconcile.DefaultConfig()
	cfg.PaydbURL, cfg.LogOutput = f.url, io.Discard
	cfg.DBRoles = service.Roles{"PAYDB_ROLE_OPERATOR": &login}
	if err := reconcile.Migrate(ctx, cfg); err != nil {
		t.Fatalf("migrate with the operators' login: %v", err)
	}
	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(login, "not-a-secret")
	as := u.String()

	for _, args := range [][]string{{"list", "--all"}, {"show", id(f.amount)}, {"show", id(f.unknown)}} {
		if out, errOut, code := f.run(t, as, args...); code != 0 {
			t.Fatalf("%v as the operators' login: exit %d, %s\n%s", args, code, errOut, out)
		}
	}
	if _, errOut, code := f.run(t, as, "resolve", id(f.paidWithout), "--decision", reconcile.DecisionCorrectedInLedger,
		"--by", "carol", "--note", "GL posting 2026-12-05/17 books the payment"); code != 0 {
		t.Fatalf("resolve as the operators' login: exit %d, %s", code, errOut)
	}
	var recorded string
	if err := f.pool.QueryRow(ctx, `SELECT decided_login FROM reconciliation_decision WHERE exception_id = $1`, f.paidWithout).Scan(&recorded); err != nil || recorded != login {
		t.Fatalf("decided_login %q (%v), want %q", recorded, err, login)
	}

	conn, err := pgx.Connect(ctx, as)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`INSERT INTO reconciliation_decision (exception_id, decision, decided_by, note, decided_at) VALUES (` + id(f.amount) + `, 'refunded', 'a', 'n', now() - interval '1 day')`,
		`INSERT INTO reconciliation_decision (exception_id, decision, decided_by, note, decided_login) VALUES (` + id(f.amount) + `, 'refunded', 'a', 'n', 'someone')`,
		`UPDATE reconciliation_decision SET decided_by = 'mallory'`,
		`DELETE FROM reconciliation_decision`,
		`UPDATE payout SET status = 'PAID' WHERE payout_id = 'p-amount'`,
		`INSERT INTO reconciliation_exception (kind, detail) VALUES ('UNKNOWN_REFERENCE', 'made up')`,
		`DELETE FROM reconciliation_exception`,
		`INSERT INTO ledger_entry (payout_id, account_id, amount_minor, currency, posted_token) VALUES ('p-amount', 'acct-1', -1500, 'EUR', 7)`,
	} {
		_, err := conn.Exec(ctx, q)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("as the operators' login %s: %v, want refused (42501)", q, err)
		}
	}
}

// A STATEMENT_FILE_CHANGED names a file version, not a payout: show lists every
// version of that file's name — the one imported and the one that changed.
func TestExceptionsShowAStatementFileChange(t *testing.T) {
	t.Parallel()
	f := newExceptionsFixture(t)
	ctx := context.Background()
	var changed, exc int64
	if err := f.pool.QueryRow(ctx, `WITH v AS (INSERT INTO statement_file (name, sha256, result, entries)
	    VALUES ('2026-12-05.xml', repeat('a', 64), 'imported', 2), ('2026-12-05.xml', repeat('b', 64), 'changed', NULL),
	           ('other.xml', repeat('c', 64), 'imported', 1)
	    RETURNING file_id, result, name)
	  SELECT file_id FROM v WHERE result = 'changed'`).Scan(&changed); err != nil {
		t.Fatal(err)
	}
	if err := f.pool.QueryRow(ctx, `INSERT INTO reconciliation_exception (kind, file_id, detail)
	  VALUES ('STATEMENT_FILE_CHANGED', $1, '2026-12-05.xml: aaaa… then bbbb…') RETURNING exception_id`, changed).Scan(&exc); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := f.run(t, "", "show", id(exc), "--json")
	var c reconcile.ExceptionContext
	if code != 0 || json.Unmarshal([]byte(out), &c) != nil {
		t.Fatalf("show: exit %d, %s\n%s", code, errOut, out)
	}
	if len(c.Files) != 2 || c.Files[0].Result != "imported" || c.Files[1].FileID != changed || c.Payout != nil || len(c.Lines) != 0 {
		t.Fatalf("show %d: files %+v, payout %v, lines %v", exc, c.Files, c.Payout, c.Lines)
	}
	if out, _, _ := f.run(t, "", "show", id(exc)); !strings.Contains(out, "statement file versions") || !strings.Contains(out, strings.Repeat("b", 64)) {
		t.Fatalf("show %d:\n%s", exc, out)
	}
}

// In the running system: a reconciler pass records an AMOUNT_MISMATCH and leaves
// its payout AMBIGUOUS; an operator decides it; the next passes neither settle
// the payout nor record the exception again, and the decision stands beside it.
func TestDecidingAnExceptionMovesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stack.Options{})
	ctx := context.Background()
	if got := e.drive(t, e.blackholeProxy(t), payoutReq("p-amount", "acct-3", 300)); got != lockapi.StatusAmbiguous {
		t.Fatalf("p-amount posted %s", got)
	}
	if reply, err := e.rail.Pay(ctx, railstub.PaymentRequest{Reference: "p-amount", AccountID: "acct-3", AmountMinor: 301,
		Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}); err != nil || reply.Status != railstub.ResultAccepted {
		t.Fatalf("direct call for p-amount: %+v %v", reply, err)
	}
	if rep := e.pass(t); rep.Exceptions[reconcile.KindAmountMismatch] != 1 {
		t.Fatalf("first pass: exceptions %v", rep.Exceptions)
	}
	getenv := func(k string) string {
		if k == "PAYDB_URL" {
			return e.st.PaydbURL
		}
		return ""
	}
	var out, errOut bytes.Buffer
	if code := reconcile.Exceptions(ctx, []string{"list", "--json"}, getenv, &out, &errOut); code != 0 {
		t.Fatalf("list: exit %d, %s", code, errOut.String())
	}
	var open []reconcile.Exception
	if err := json.Unmarshal(out.Bytes(), &open); err != nil || len(open) != 1 || open[0].Kind != reconcile.KindAmountMismatch {
		t.Fatalf("open exceptions %+v (%v)", open, err)
	}
	if code := reconcile.Exceptions(ctx, []string{"resolve", id(open[0].ExceptionID), "--decision", reconcile.DecisionCorrectedInLedger,
		"--by", "dana", "--note", "the rail paid 3.01; GL posting books the extra cent"}, getenv, &out, &errOut); code != 0 {
		t.Fatalf("resolve: exit %d, %s", code, errOut.String())
	}
	for range 2 {
		if rep := e.pass(t); len(rep.Settled) != 0 || rep.Exceptions[reconcile.KindAmountMismatch] != 0 {
			t.Fatalf("a pass after the decision: settled %v, exceptions %v", rep.Settled, rep.Exceptions)
		}
	}
	if st := e.status(t, "p-amount"); st != lockapi.StatusAmbiguous {
		t.Fatalf("p-amount is %s after its exception was decided; deciding must move nothing", st)
	}
	var exceptions, decisions int
	if err := e.st.Paydb.QueryRow(ctx, `SELECT (SELECT count(*) FROM reconciliation_exception), (SELECT count(*) FROM reconciliation_decision)`).
		Scan(&exceptions, &decisions); err != nil || exceptions != 1 || decisions != 1 {
		t.Fatalf("%d exceptions, %d decisions (%v); want the one and its decision", exceptions, decisions, err)
	}
}
