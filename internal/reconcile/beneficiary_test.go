package reconcile_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"lock.dev/internal/identity"
	"lock.dev/internal/paydb"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/railstub"
	"lock.dev/internal/reconcile"
	"lock.dev/internal/stack"
	"lock.dev/lockapi"
)

const (
	alice   = "NL91ABNA0417164300" // every payout's beneficiary in these tests
	mallory = "GB29NWBK60161331926819"
)

// payDirect presents a payment to the rail-stub itself, as someone with the
// rail's credentials could: the rail books it, and its statement shows it.
func (e *env) payDirect(t testing.TB, ref, account string, amount int64, beneficiary string) {
	t.Helper()
	reply, err := e.rail.Pay(context.Background(), railstub.PaymentRequest{Reference: ref, AccountID: account,
		AmountMinor: amount, Currency: "EUR", Beneficiary: beneficiary})
	if err != nil || reply.Status != railstub.ResultAccepted {
		t.Fatalf("direct call for %s: %+v %v", ref, reply, err)
	}
}

// The beneficiary travels from the rail's books through rail-proxy's statement
// into the copy, exactly as the rail was presented it; a line whose beneficiary
// is not its payout's (its account, amount and currency are) is
// BENEFICIARY_MISMATCH, once, and its AMBIGUOUS payout is never settled — the
// reconciler does not even ask — so it stays AMBIGUOUS for a person; a line whose
// amount differs too is AMOUNT_MISMATCH only; the same IBAN written in groups and
// in lower case is no mismatch, and its payout is settled PAID; a line of a payout
// that is not AMBIGUOUS is checked at its import all the same. The details, which
// are logged, carry the beneficiaries masked.
func TestBeneficiaryMismatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stack.Options{})
	ctx := context.Background()
	blackhole := e.blackholeProxy(t)
	for _, p := range []lockapi.SubmissionRequest{
		payoutReq("p-benef", "acct-1", 100), payoutReq("p-both", "acct-2", 200), payoutReq("p-spaced", "acct-3", 300),
	} {
		if got := e.drive(t, blackhole, p); got != lockapi.StatusAmbiguous {
			t.Fatalf("%s posted %s", p.PayoutID, got)
		}
	}
	// PENDING: created, never claimed or presented by us.
	if _, err := e.creator.Create(ctx, payoutReq("p-pending", "acct-4", 400)); err != nil {
		t.Fatal(err)
	}
	e.payDirect(t, "p-benef", "acct-1", 100, mallory)                   // seq 1: the rail paid someone else
	e.payDirect(t, "p-both", "acct-2", 201, mallory)                    // seq 2: another amount and someone else
	e.payDirect(t, "p-spaced", "acct-3", 300, "nl91 abna 0417 1643 00") // seq 3: the same IBAN, written for people
	e.payDirect(t, "p-pending", "acct-4", 400, mallory)                 // seq 4
	// seq 5: paid as booked, through rail-proxy.
	if got := e.drive(t, e.st.ProxyURL, payoutReq("p-paid", "acct-5", 500)); got != lockapi.StatusPaid {
		t.Fatalf("p-paid posted %s", got)
	}

	total := map[string]int{}
	passes := func(n int) {
		t.Helper()
		for range n {
			rep := e.pass(t)
			for k, n := range rep.Exceptions {
				total[k] += n
			}
			if rep.Refused != 0 {
				t.Fatalf("payment-resource refused %d settles: the reconciler asked to settle from a mismatching line\nlog:\n%s", rep.Refused, e.logs.String())
			}
			for id, to := range rep.Settled {
				if id != "p-spaced" || to != lockapi.StatusPaid {
					t.Fatalf("a pass settled %s %s; only p-spaced may be settled (PAID)", id, to)
				}
			}
		}
	}
	passes(1)
	if s := e.status(t, "p-spaced"); s != lockapi.StatusPaid {
		t.Fatalf("p-spaced is %s after a pass, want PAID: its line names the same IBAN", s)
	}
	e.waitWindow(t)
	passes(2)

	want := []string{"AMOUNT_MISMATCH p-both 2", "BENEFICIARY_MISMATCH p-benef 1", "BENEFICIARY_MISMATCH p-pending 4"}
	got := e.exceptions(t)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("exceptions = %v\nwant        %v", got, want)
	}
	if total[reconcile.KindBeneficiaryMismatch] != 2 || total[reconcile.KindAmountMismatch] != 1 || len(total) != 2 {
		t.Errorf("passes reported %v new exceptions, want 2 BENEFICIARY_MISMATCH and 1 AMOUNT_MISMATCH over all passes", total)
	}
	for id, want := range map[string]string{"p-benef": lockapi.StatusAmbiguous, "p-both": lockapi.StatusAmbiguous,
		"p-pending": lockapi.StatusPending, "p-paid": lockapi.StatusPaid} {
		if s := e.status(t, id); s != want {
			t.Errorf("%s is %s, want %s", id, s, want)
		}
	}
	if n := e.count(t, `SELECT count(*) FROM ledger_entry WHERE payout_id = 'p-benef'`); n != 0 {
		t.Errorf("p-benef has %d ledger entries: booked as paid to the beneficiary the rail did not pay", n)
	}

	// The copy holds each call's beneficiary exactly as the rail was presented it.
	calls := e.calls(t)
	if len(calls) != 5 {
		t.Fatalf("%d rail calls, want 5", len(calls))
	}
	for _, c := range calls {
		if n := e.count(t, `SELECT count(*) FROM rail_statement_line WHERE seq = $1 AND beneficiary = $2`, c.Seq, c.Beneficiary); n != 1 {
			t.Errorf("call %d's beneficiary %q is not in the copy as it is", c.Seq, c.Beneficiary)
		}
	}

	// Logged once each, masked: the last four characters, never the whole.
	if n := len(e.logs.Events("reconciliation_exception")); n != len(want) {
		t.Errorf("%d reconciliation_exception log lines, want %d", n, len(want))
	}
	var detail string
	if err := e.st.Paydb.QueryRow(ctx, `SELECT detail FROM reconciliation_exception WHERE kind = 'BENEFICIARY_MISMATCH' AND payout_id = 'p-benef'`).Scan(&detail); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(detail, "****6819") || !strings.Contains(detail, "****4300") {
		t.Errorf("detail %q does not name both beneficiaries masked", detail)
	}
	for _, b := range []string{alice, mallory, "0417 1643 00"} {
		if strings.Contains(e.logs.String(), b) {
			t.Errorf("the reconciler's log carries the beneficiary %q in full", b)
		}
	}
}

// A line copied before statement lines carried a beneficiary has none (NULL) and
// its beneficiary is not compared: its AMBIGUOUS payout is settled PAID from it,
// with no exception. The line is made as it was: on a paydb at the last version
// before the column, then migrated forward by the services.
func TestOldLineWithoutBeneficiaryNotCompared(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.EmptyURL(t)
	pool := pgtest.Pool(t, url)
	tree := paydb.Tree()
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, tree.FS, goose.WithTableName(tree.Table))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 8); err != nil {
		t.Fatalf("migrate to version 8: %v", err)
	}
	// An AMBIGUOUS payout whose ACCEPTED line an earlier reconciler copied (the
	// cursor past it) before it settled it; and one with no line at all.
	for _, sql := range []string{
		`INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary, status, fence_token, claimed_by)
		 VALUES ('p-old', 'acct-1', 100, 'EUR', '` + alice + `', 'AMBIGUOUS', 1, 'old-executor')`,
		`INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency,
		     beneficiary, outcome, resolved_at)
		 VALUES ('p-old', 'acct-1', 1, 'old-executor', 'p-old:1', 100, 'EUR', '` + alice + `', 'TIMEOUT', now())`,
		`INSERT INTO rail_statement_line (seq, received_at, reference, account_id, amount_minor, currency, result, rail_reference)
		 VALUES (1, now(), 'p-old', 'acct-1', 100, 'EUR', 'ACCEPTED', 'RS-OLD-1')`,
		`INSERT INTO reconciler_cursor (id, last_seq, read_at) VALUES (true, 1, now())`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	pool.Close()

	e := newEnv(t, stack.Options{PaydbURL: url})
	if n := e.count(t, `SELECT count(*) FROM rail_statement_line WHERE seq = 1 AND beneficiary IS NULL`); n != 1 {
		t.Fatalf("the old line is not there without a beneficiary after the migration")
	}
	rep := e.pass(t)
	if rep.Settled["p-old"] != lockapi.StatusPaid || rep.Refused != 0 {
		t.Fatalf("pass settled %v, refused %d; want p-old PAID from its old line\nlog:\n%s", rep.Settled, rep.Refused, e.logs.String())
	}
	if got := e.exceptions(t); len(got) != 0 {
		t.Fatalf("exceptions %v for an old line: its beneficiary is not compared", got)
	}
	var ref string
	if err := e.st.Paydb.QueryRow(ctx, `SELECT rail_reference FROM payout WHERE payout_id = 'p-old'`).Scan(&ref); err != nil || ref != "RS-OLD-1" {
		t.Fatalf("p-old's rail reference %q (%v), want RS-OLD-1", ref, err)
	}
	// A new line cannot be copied without one.
	if _, err := e.st.Paydb.Exec(ctx, `INSERT INTO rail_statement_line (seq, received_at, reference, account_id, amount_minor, currency, result, rail_reference)
		VALUES (2, now(), 'p-x', 'acct-1', 100, 'EUR', 'ACCEPTED', 'RS-2')`); err == nil || !strings.Contains(err.Error(), "rail_statement_line_beneficiary_present") {
		t.Fatalf("a new line without a beneficiary: %v, want the CHECK's refusal", err)
	}
}

// paydb compares beneficiaries exactly as the Go code does: the reconciler's
// import (SQL) and its settle rules (Go) must never disagree about a line.
func TestBeneficiaryKeySQLAgreesWithGo(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.PaydbURL(t))
	for _, s := range []string{
		alice, "nl91 abna 0417 1643 00", " N L 9 1 ", "école", "ÉCOLE", "straße", "STRASSE", "ǅ", "ﬃ", "İstanbul",
		"ıi", "a\u00a0b", "a\u2003b", "ＡＢＣ", "ａｂｃ", "x-y_z.0", "",
	} {
		var got string
		if err := pool.QueryRow(context.Background(), `SELECT `+lockapi.BeneficiaryKeySQL("$1::text"), s).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if want := lockapi.BeneficiaryKey(s); got != want {
			t.Errorf("paydb's key of %q is %q, Go's %q", s, got, want)
		}
	}
}

// A statement page whose line has no beneficiary — what a rail-proxy older than
// the statement's beneficiary serves — is not imported: the pass fails, nothing
// is copied, the cursor stays, and the next pass through a rail-proxy that serves
// it imports the line whole. (The old rail-proxy is played by a server answering
// its statement page as it did; rail-proxy itself now refuses such a rail page.)
func TestLineWithoutBeneficiaryIsNotImported(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stack.Options{})
	if got := e.drive(t, e.st.ProxyURL, payoutReq("p-1", "acct-1", 100)); got != lockapi.StatusPaid {
		t.Fatalf("p-1 posted %s", got)
	}
	c := e.calls(t)[0]
	old := e.serveAs(t, identity.NameRailProxy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lockapi.WriteJSON(w, http.StatusOK, map[string]any{"lines": []map[string]any{{"seq": c.Seq, "receivedAt": c.ReceivedAt,
			"reference": c.Reference, "accountId": c.AccountID, "amountMinor": c.AmountMinor, "currency": c.Currency,
			"result": c.Result, "railReference": c.RailReference, "declineReason": nil}}, "next": nil})
	}))
	cfg := e.cfg
	cfg.RailProxyURL = old
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := reconcile.Pass(ctx, cfg); err == nil || !strings.Contains(err.Error(), "no beneficiary") {
		t.Fatalf("pass through an old rail-proxy: %v, want the read refused for want of a beneficiary", err)
	}
	if n := e.count(t, `SELECT count(*) FROM rail_statement_line`); n != 0 {
		t.Fatalf("%d lines copied from a page without beneficiaries", n)
	}
	if n := e.count(t, `SELECT coalesce((SELECT last_seq FROM reconciler_cursor), 0)`); n != 0 {
		t.Fatalf("the cursor moved to %d past a line not copied", n)
	}
	if rep := e.pass(t); rep.Imported != 1 {
		t.Fatalf("the next pass imported %d lines, want 1", rep.Imported)
	}
	if n := e.count(t, `SELECT count(*) FROM rail_statement_line WHERE seq = $1 AND beneficiary = $2`, c.Seq, c.Beneficiary); n != 1 {
		t.Fatal("the line is not copied with its beneficiary")
	}
}
