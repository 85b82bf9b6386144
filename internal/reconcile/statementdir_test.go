package reconcile_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/isomsg"
	"lock.dev/internal/reconcile"
	"lock.dev/internal/service"
	"lock.dev/internal/stack"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// benef is the beneficiary of payoutReq's payouts.
const benef = "NL91ABNA0417164300"

// dirEnv is the system with the reconciler's statement from files in a
// directory of its own.
func dirEnv(t *testing.T) (*env, string) {
	t.Helper()
	e := newEnv(t, stack.Options{Env: fastProxy, Log: testLog(t)})
	dir := t.TempDir()
	e.cfg.StatementSource, e.cfg.StatementDir = reconcile.SourceDir, dir
	// Not called in dir mode: a rail-proxy URL nothing answers on proves it.
	e.cfg.RailProxyURL = "http://127.0.0.1:1"
	return e, dir
}

// debit is a booked debit entry paying benef amount EUR for reference ref,
// booked by the rail as acctSvcrRef.
func debit(ref, acctSvcrRef string, amount int64) isomsg.Entry {
	return isomsg.Entry{Ref: "1", AcctSvcrRef: acctSvcrRef, EndToEndID: ref, CreditorAccount: benef, Currency: "EUR",
		AmountMinor: amount, Debit: true, Status: isomsg.Booked, BookedAt: time.Now().UTC().Truncate(time.Second)}
}

// stmt is a balanced statement of account in EUR over [to-1h, to] (no period
// when to is nil), its entries numbered 1, 2, … as NtryRef.
func stmt(id, account string, to *time.Time, entries ...isomsg.Entry) isomsg.Statement {
	s := isomsg.Statement{ID: id, Account: account, Currency: "EUR", OpeningMinor: 1_000_000, Entries: entries}
	if to != nil {
		from := to.Add(-time.Hour)
		s.From, s.To = &from, to
	}
	s.ClosingMinor = s.OpeningMinor
	for i := range s.Entries {
		s.Entries[i].Ref = fmt.Sprint(i + 1)
		s.ClosingMinor -= s.Entries[i].AmountMinor
	}
	return s
}

// writeStatements writes stmts as a camt.053 file name in dir, validated against
// the official schema, through a temporary name as a bank's transfer does.
func writeStatements(t *testing.T, dir, name string, stmts ...isomsg.Statement) []byte {
	t.Helper()
	b, err := isomsg.WriteStatements("MSG-"+strings.TrimSuffix(name, ".xml"), time.Now(), stmts)
	if err != nil {
		t.Fatalf("write %s: %v", name, err)
	}
	testkit.ValidateISO20022(t, b)
	writeFile(t, dir, name, b)
	return b
}

func writeFile(t *testing.T, dir, name string, b []byte) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// lines lists the copy as "seq reference account railReference".
func (e *env) lines(t *testing.T) []string {
	t.Helper()
	return e.texts(t, `SELECT seq || ' ' || reference || ' ' || account_id || ' ' || coalesce(rail_reference, '-') FROM rail_statement_line ORDER BY seq`)
}

func sha256hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func hour() *time.Time {
	h := time.Now().Add(time.Hour)
	return &h
}

// Files are imported once each, in name order and their entries in order, the
// files a writer has not finished (".") and other names ignored; a second pass
// finds them unchanged; a name that comes back with other bytes is one
// STATEMENT_FILE_CHANGED, recorded once, and nothing of it is imported.
func TestStatementFilesImportedOnceInNameOrder(t *testing.T) {
	t.Parallel()
	e, dir := dirEnv(t)
	writeStatements(t, dir, "b.xml",
		stmt("B-1", "acct-1", hour(), debit("x-2", "R-2", 200), debit("x-3", "R-3", 300)),
		stmt("B-2", "acct-2", hour(), debit("x-4", "R-4", 400)))
	writeStatements(t, dir, "a.xml", stmt("A-1", "acct-1", hour(), debit("x-1", "R-1", 100)))
	writeStatements(t, dir, ".c.xml", stmt("C-1", "acct-1", hour(), debit("x-9", "R-9", 900)))
	writeStatements(t, dir, "d.xml.part", stmt("D-1", "acct-1", hour(), debit("x-8", "R-8", 800)))

	rep := e.pass(t)
	if rep.Files["imported"] != 2 || rep.Imported != 4 {
		t.Fatalf("first pass: files %v, %d lines imported; want 2 files, 4 lines", rep.Files, rep.Imported)
	}
	want := []string{"1 x-1 acct-1 R-1", "2 x-2 acct-1 R-2", "3 x-3 acct-1 R-3", "4 x-4 acct-2 R-4"}
	if got := e.lines(t); !slices.Equal(got, want) {
		t.Fatalf("the copy is %q, want %q", got, want)
	}
	if n := e.count(t, `SELECT count(*) FROM statement_file WHERE result = 'imported'
		AND ((name = 'a.xml' AND entries = 1) OR (name = 'b.xml' AND entries = 3))`); n != 2 {
		t.Fatalf("%d statement_file rows as imported, want a.xml and b.xml", n)
	}

	rep = e.pass(t)
	if rep.Files["unchanged"] != 2 || rep.Files["imported"] != 0 || rep.Imported != 0 {
		t.Fatalf("second pass: files %v, %d lines; want 2 unchanged, nothing imported", rep.Files, rep.Imported)
	}

	changed := writeStatements(t, dir, "a.xml", stmt("A-1", "acct-1", hour(), debit("x-1", "R-1", 100), debit("x-5", "R-5", 500)))
	for i := range 2 {
		rep = e.pass(t)
		wantChanged := 1 - i
		if rep.Files["changed"] != wantChanged || rep.Exceptions[reconcile.KindStatementFileChanged] != wantChanged || rep.Imported != 0 {
			t.Fatalf("pass %d after a.xml changed: files %v, exceptions %v, %d lines; want %d changed", i+1, rep.Files, rep.Exceptions, rep.Imported, wantChanged)
		}
	}
	if got := e.lines(t); !slices.Equal(got, want) {
		t.Fatalf("after a.xml changed the copy is %q, want %q", got, want)
	}
	if n := e.count(t, `SELECT count(*) FROM reconciliation_exception x JOIN statement_file f USING (file_id)
		WHERE x.kind = 'STATEMENT_FILE_CHANGED' AND f.name = 'a.xml' AND f.result = 'changed' AND f.sha256 = $1`, sha256hex(changed)); n != 1 {
		t.Fatalf("%d STATEMENT_FILE_CHANGED exceptions naming a.xml's new version, want 1 (all: %v)", n, e.exceptions(t))
	}
	if !strings.Contains(e.logs.String(), `"kind":"STATEMENT_FILE_CHANGED"`) {
		t.Fatal("the exception was not logged")
	}
}

// A bank's NtryRef is optional and need not be a number: entries without one,
// or with the bank's own text, are imported all the same, numbered by the
// reconciler in the file's order.
func TestStatementEntriesWithoutNumericNtryRefImported(t *testing.T) {
	t.Parallel()
	e, dir := dirEnv(t)
	s := stmt("A-1", "acct-1", hour(), debit("x-1", "R-1", 100), debit("x-2", "R-2", 200))
	s.Entries[0].Ref = "20261206-BK-0001"
	s.Entries[1].Ref = ""
	writeStatements(t, dir, "a.xml", s)

	rep := e.pass(t)
	if rep.Files["imported"] != 1 || rep.Imported != 2 {
		t.Fatalf("files %v, %d lines imported; want the file imported with its 2 lines", rep.Files, rep.Imported)
	}
	want := []string{"1 x-1 acct-1 R-1", "2 x-2 acct-1 R-2"}
	if got := e.lines(t); !slices.Equal(got, want) {
		t.Fatalf("the copy is %q, want %q", got, want)
	}
}

// A file that does not validate — not camt.053, or a statement whose balances
// disagree with its entries — is skipped, logged at ERROR and counted, and
// nothing of it is imported, not even the valid statement beside it; replaced by
// a valid file it is imported, with no exception.
func TestInvalidStatementFileSkippedUntilReplaced(t *testing.T) {
	t.Parallel()
	e, dir := dirEnv(t)
	unbalanced := stmt("A-2", "acct-1", hour(), debit("x-2", "R-2", 200))
	unbalanced.ClosingMinor++
	writeStatements(t, dir, "a.xml", stmt("A-1", "acct-1", hour(), debit("x-1", "R-1", 100)), unbalanced)
	writeFile(t, dir, "b.xml", []byte("<Document>not a statement</Document>"))

	rep := e.pass(t)
	if rep.Files["invalid"] != 2 || rep.Imported != 0 || len(rep.Exceptions) != 0 {
		t.Fatalf("files %v, %d lines, exceptions %v; want 2 invalid, nothing imported or recorded", rep.Files, rep.Imported, rep.Exceptions)
	}
	if n := e.count(t, `SELECT count(*) FROM rail_statement_line`) + e.count(t, `SELECT count(*) FROM statement_file`) +
		e.count(t, `SELECT count(*) FROM statement_coverage`); n != 0 {
		t.Fatalf("an invalid file left %d rows", n)
	}
	logs := e.logs.String()
	for _, f := range []string{"a.xml", "b.xml"} {
		if !strings.Contains(logs, `"level":"ERROR","msg":"statement file invalid`) || !strings.Contains(logs, `"file":"`+f+`"`) {
			t.Fatalf("no statement_file_invalid at ERROR for %s:\n%s", f, logs)
		}
	}
	if !strings.Contains(logs, "does not balance") {
		t.Fatalf("the log does not say a.xml is unbalanced:\n%s", logs)
	}

	writeStatements(t, dir, "a.xml", stmt("A-1", "acct-1", hour(), debit("x-1", "R-1", 100)), stmt("A-2", "acct-1", hour(), debit("x-2", "R-2", 200)))
	rep = e.pass(t)
	// x-1 and x-2 are no payouts: UNKNOWN_REFERENCE each, and nothing else.
	// (b.xml, still invalid, is counted again: a pass of its own starts
	// without the reconciler's memory of invalid files.)
	if rep.Files["imported"] != 1 || rep.Imported != 2 || len(rep.Exceptions) != 1 || rep.Exceptions[reconcile.KindUnknownReference] != 2 {
		t.Fatalf("after a.xml was replaced: files %v, %d lines, exceptions %v; want it imported, 2 lines", rep.Files, rep.Imported, rep.Exceptions)
	}
	if n := e.count(t, `SELECT count(*) FROM reconciliation_exception WHERE kind = 'STATEMENT_FILE_CHANGED'`); n != 0 {
		t.Fatalf("%d STATEMENT_FILE_CHANGED for a file replaced before any of it was imported", n)
	}
}

// A payout is settled NOT_PRESENTED only once its own account's coverage has
// passed its window: another account's coverage, or a statement of its own
// account without a period, does not settle it. A line in a file settles its
// payout PAID, as the statement read through rail-proxy would.
func TestCoveragePerAccountSettles(t *testing.T) {
	t.Parallel()
	e, dir := dirEnv(t)
	void := e.blackholeProxy(t)
	for _, p := range []lockapi.SubmissionRequest{payoutReq("p-a", "acct-A", 100), payoutReq("p-b", "acct-B", 200), payoutReq("p-c", "acct-C", 300)} {
		if got := e.drive(t, void, p); got != lockapi.StatusAmbiguous {
			t.Fatalf("%s posted %s", p.PayoutID, got)
		}
	}
	e.waitWindow(t)
	// Before any file, nothing is covered: nothing settles NOT_PRESENTED.
	if rep := e.pass(t); len(rep.Settled) != 0 {
		t.Fatalf("settled %v with nothing covered", rep.Settled)
	}
	// acct-B covered to now (a period ending in an hour covers only up to
	// paydb's now()); acct-A's statement has no period; acct-C's books p-c.
	writeStatements(t, dir, "1.xml", stmt("B", "acct-B", hour()), stmt("A", "acct-A", nil), stmt("C", "acct-C", nil, debit("p-c", "R-C", 300)))
	rep := e.pass(t)
	if want := map[string]string{"p-b": lockapi.StatusNotPresented, "p-c": lockapi.StatusPaid}; !maps.Equal(rep.Settled, want) {
		t.Fatalf("settled %v, want %v", rep.Settled, want)
	}
	if st := e.status(t, "p-a"); st != lockapi.StatusAmbiguous || rep.Refused != 0 {
		// payment-resource judges a settle against the account's coverage too:
		// a reconciler that asked for it would be refused.
		t.Fatalf("p-a is %s with acct-A not covered, %d settles refused", st, rep.Refused)
	}
	if n := e.count(t, `SELECT count(*) FROM statement_coverage WHERE account_id = 'acct-A'`); n != 0 {
		t.Fatal("a statement without a period advanced its account's coverage")
	}
	if n := e.count(t, `SELECT count(*) FROM statement_coverage WHERE account_id = 'acct-B' AND covered_to <= now()`); n != 1 {
		t.Fatal("acct-B is not covered up to the import, and not beyond paydb's clock")
	}
	// A period that ended before p-a's attempt does not cover it either.
	past := time.Now().Add(-time.Hour)
	writeStatements(t, dir, "2.xml", stmt("A", "acct-A", &past))
	if rep := e.pass(t); len(rep.Settled) != 0 || rep.Refused != 0 {
		t.Fatalf("settled %v (%d refused) with acct-A covered only to an hour ago", rep.Settled, rep.Refused)
	}
	writeStatements(t, dir, "3.xml", stmt("A", "acct-A", hour()))
	if rep := e.pass(t); !maps.Equal(rep.Settled, map[string]string{"p-a": lockapi.StatusNotPresented}) {
		t.Fatalf("settled %v once acct-A is covered, want p-a NOT_PRESENTED", rep.Settled)
	}
	if got := e.exceptions(t); len(got) != 0 {
		t.Fatalf("exceptions: %v", got)
	}
}

// Overlapping statements show a booking again: an ACCEPTED line whose account
// and rail reference are already in the copy — from an earlier file, or earlier
// in the same file — is not imported again and raises no PRESENTED_TWICE; a
// second booking of the payout under another rail reference is a double
// payment, and is one.
func TestOverlappingStatementsImportOnce(t *testing.T) {
	t.Parallel()
	e, dir := dirEnv(t)
	if got := e.drive(t, e.blackholeProxy(t), payoutReq("p-1", "acct-1", 100)); got != lockapi.StatusAmbiguous {
		t.Fatalf("p-1 posted %s", got)
	}
	writeStatements(t, dir, "1.xml", stmt("S-1", "acct-1", nil, debit("p-1", "R-1", 100)))
	writeStatements(t, dir, "2.xml", stmt("S-2", "acct-1", nil, debit("p-1", "R-1", 100), debit("p-1", "R-1", 100)),
		stmt("S-3", "acct-1", nil, debit("p-1", "R-1", 100)))
	rep := e.pass(t)
	if rep.Files["imported"] != 2 || rep.Imported != 1 || len(rep.Exceptions) != 0 || rep.Settled["p-1"] != lockapi.StatusPaid {
		t.Fatalf("files %v, %d lines, exceptions %v, settled %v; want 1 line, p-1 PAID, no exception",
			rep.Files, rep.Imported, rep.Exceptions, rep.Settled)
	}
	writeStatements(t, dir, "3.xml", stmt("S-4", "acct-1", nil, debit("p-1", "R-1", 100), debit("p-1", "R-2", 100)))
	rep = e.pass(t)
	if rep.Imported != 1 || rep.Exceptions[reconcile.KindPresentedTwice] != 1 || len(rep.Exceptions) != 1 {
		t.Fatalf("a second booking under another reference: %d lines, exceptions %v; want 1 line, PRESENTED_TWICE", rep.Imported, rep.Exceptions)
	}
	if got, want := e.lines(t), []string{"1 p-1 acct-1 R-1", "2 p-1 acct-1 R-2"}; !slices.Equal(got, want) {
		t.Fatalf("the copy is %q, want %q", got, want)
	}
	if n := len(e.logs.Events("statement_line_repeated")); n != 4 {
		t.Fatalf("%d statement_line_repeated log lines, want 4 (R-1 three times in 2.xml, once in 3.xml)", n)
	}
}

// A file whose import fails part-way — here paydb refuses the file's row, after
// its lines were written in the same transaction — imports nothing of it: no
// line, no exception, no coverage, the cursor where it was. The files before it
// stand, and the next pass imports it whole.
func TestStatementFileFailingMidImportLeavesNothing(t *testing.T) {
	t.Parallel()
	e, dir := dirEnv(t)
	ctx := context.Background()
	if _, err := e.st.Paydb.Exec(ctx, `
CREATE FUNCTION refuse_b() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF NEW.name = 'b.xml' THEN RAISE EXCEPTION 'refused for the test'; END IF; RETURN NEW; END $$;
CREATE TRIGGER refuse_b BEFORE INSERT ON statement_file FOR EACH ROW EXECUTE FUNCTION refuse_b();`); err != nil {
		t.Fatal(err)
	}
	writeStatements(t, dir, "a.xml", stmt("A", "acct-1", hour(), debit("x-1", "R-1", 100)))
	writeStatements(t, dir, "b.xml", stmt("B", "acct-2", hour(), debit("x-2", "R-2", 200), debit("x-3", "R-3", 300)))
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := reconcile.Pass(pctx, e.cfg); err == nil || !strings.Contains(err.Error(), "refused for the test") {
		t.Fatalf("pass = %v, want b.xml's import refused", err)
	}
	if got, want := e.lines(t), []string{"1 x-1 acct-1 R-1"}; !slices.Equal(got, want) {
		t.Fatalf("the copy is %q, want a.xml's line only", got)
	}
	if n := e.count(t, `SELECT count(*) FROM statement_coverage WHERE account_id = 'acct-2'`) +
		e.count(t, `SELECT count(*) FROM reconciliation_exception WHERE seq > 1`); n != 0 {
		t.Fatal("b.xml's failed import left its coverage or exceptions")
	}
	if n := e.count(t, `SELECT last_seq FROM reconciler_cursor`); n != 1 {
		t.Fatalf("the cursor is at %d, want 1", n)
	}
	if _, err := e.st.Paydb.Exec(ctx, `DROP TRIGGER refuse_b ON statement_file`); err != nil {
		t.Fatal(err)
	}
	if rep := e.pass(t); rep.Files["imported"] != 1 || rep.Imported != 2 {
		t.Fatalf("next pass: files %v, %d lines; want b.xml imported whole", rep.Files, rep.Imported)
	}
	if n := e.count(t, `SELECT count(*) FROM statement_coverage WHERE account_id = 'acct-2'`); n != 1 {
		t.Fatal("b.xml's coverage missing after its import")
	}
}

// A reconciler serving in dir mode needs no rail-proxy: it is ready with the
// directory readable (component statementDir), its file counter is
// zero-initialised, and a file it found invalid is counted once, however many
// passes go by, until its bytes change.
func TestDirModeReconcilerReadinessAndFileMetric(t *testing.T) {
	t.Parallel()
	e, dir := dirEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rec, err := e.st.StartReconciler(ctx, map[string]string{"RECONCILER_STATEMENT_SOURCE": "dir", "RECONCILER_STATEMENT_DIR": dir,
		"RAIL_PROXY_URL": "http://127.0.0.1:1", "RECONCILER_INTERVAL": "50ms"})
	if err != nil {
		t.Fatal(err)
	}
	metric := func(result string) float64 {
		t.Helper()
		v, err := rec.Metric(ctx, `reconciler_statement_files_total{result="`+result+`"}`)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, r := range []string{"imported", "unchanged", "changed", "invalid"} {
		if v := metric(r); v != 0 {
			t.Fatalf("reconciler_statement_files_total{result=%q} = %v at start", r, v)
		}
	}
	resp, err := rec.Client.Get(rec.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 4096)
	n, _ := resp.Body.Read(body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body[:n]), "statementDir") || strings.Contains(string(body[:n]), "railProxy") {
		t.Fatalf("/readyz = %d %s, want 200 with statementDir and no railProxy", resp.StatusCode, body[:n])
	}

	writeFile(t, dir, "a.xml", []byte("<Document/>"))
	testkit.Eventually(t, time.Minute, "the invalid file counted", func() bool { return metric("invalid") == 1 })
	passes := func() float64 {
		v, err := rec.Metric(ctx, `reconciler_pass_total{result="completed"}`)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	after := passes() + 3
	testkit.Eventually(t, time.Minute, "three more passes", func() bool { return passes() >= after })
	if v := metric("invalid"); v != 1 {
		t.Fatalf("the unchanged invalid file was counted %v times", v)
	}
	writeStatements(t, dir, "a.xml", stmt("A", "acct-1", hour(), debit("x-1", "R-1", 100)))
	testkit.Eventually(t, time.Minute, "the replaced file imported", func() bool { return metric("imported") == 1 })
	testkit.Eventually(t, time.Minute, "the imported file found unchanged", func() bool { return metric("unchanged") >= 1 })
	if v := metric("invalid"); v != 1 {
		t.Fatalf("invalid = %v after the file was replaced, want 1", v)
	}
	if err := os.Chmod(dir, 0); err == nil && os.Geteuid() != 0 {
		defer os.Chmod(dir, 0o700) //nolint:errcheck // restored for the cleanup
		testkit.Eventually(t, time.Minute, "not ready with the directory unreadable", func() bool {
			resp, err := rec.Client.Get(rec.URL + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 503
		})
	}
}

// RECONCILER_STATEMENT_SOURCE=dir needs RECONCILER_STATEMENT_DIR, and not
// rail-proxy's URL or identity; any other source is refused.
func TestStatementSourceSettings(t *testing.T) {
	t.Parallel()
	base := map[string]string{"PAYMENT_SETTLE_TOKEN": "a-settle-token-long-enough-for-the-check-0123456789", "UNSAFE_NO_AUTH": "true"}
	parse := func(extra map[string]string) error {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		for k, v := range extra {
			env[k] = v
		}
		_, _, err := reconcile.ParseConfig(nil, func(k string) string { return env[k] })
		return err
	}
	if err := parse(nil); err != nil {
		t.Fatalf("defaults (proxy): %v", err)
	}
	if err := parse(map[string]string{"RECONCILER_STATEMENT_SOURCE": "dir"}); err == nil || !strings.Contains(err.Error(), "RECONCILER_STATEMENT_DIR") {
		t.Fatalf("dir without a directory = %v, want RECONCILER_STATEMENT_DIR named", err)
	}
	if err := parse(map[string]string{"RECONCILER_STATEMENT_SOURCE": "dir", "RECONCILER_STATEMENT_DIR": "/srv/statements",
		"RAIL_PROXY_URL": "not a url", "RAIL_PROXY_ID": "not an id"}); err != nil {
		t.Fatalf("dir mode with rail-proxy's settings unusable: %v", err)
	}
	if err := parse(map[string]string{"RAIL_PROXY_URL": "not a url"}); err == nil || !strings.Contains(err.Error(), "RAIL_PROXY_URL") {
		t.Fatalf("proxy mode with an unusable RAIL_PROXY_URL = %v", err)
	}
	if err := parse(map[string]string{"RECONCILER_STATEMENT_SOURCE": "sftp"}); err == nil || !strings.Contains(err.Error(), "RECONCILER_STATEMENT_SOURCE") {
		t.Fatalf("an unknown source = %v, want RECONCILER_STATEMENT_SOURCE named", err)
	}
}

// PAID_WITHOUT_LINE is judged per account too: a PAID payout the statements show
// no line of is an exception only once its own account is covered past its
// window.
func TestPaidWithoutLineJudgedPerAccount(t *testing.T) {
	t.Parallel()
	e, dir := dirEnv(t)
	if got := e.drive(t, e.liarProxy(t, "RS-GHOST"), payoutReq("p-ghost", "acct-G", 400)); got != lockapi.StatusPaid {
		t.Fatalf("p-ghost posted %s", got)
	}
	e.waitWindow(t)
	writeStatements(t, dir, "1.xml", stmt("H", "acct-H", hour()))
	if rep := e.pass(t); len(rep.Exceptions) != 0 {
		t.Fatalf("exceptions %v with only another account covered", rep.Exceptions)
	}
	writeStatements(t, dir, "2.xml", stmt("G", "acct-G", hour()))
	if rep := e.pass(t); rep.Exceptions[reconcile.KindPaidWithoutLine] != 1 || len(rep.Exceptions) != 1 {
		t.Fatalf("exceptions %v once acct-G is covered, want PAID_WITHOUT_LINE", rep.Exceptions)
	}
	if got := e.exceptions(t); !slices.Equal(got, []string{"PAID_WITHOUT_LINE p-ghost -"}) {
		t.Fatalf("exceptions = %v", got)
	}
}

// The stack's final pass with a reconciler in dir mode waits for the coverage of
// each account with an AMBIGUOUS payout to pass its window — not for the
// cursor's read_at, which dir mode never sets — and then for a pass.
func TestFinalPassWaitsForEachAccountsCoverage(t *testing.T) {
	t.Parallel()
	e, dir := dirEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if got := e.drive(t, e.blackholeProxy(t), payoutReq("p-a", "acct-A", 100)); got != lockapi.StatusAmbiguous {
		t.Fatalf("p-a posted %s", got)
	}
	rec, err := e.st.StartReconciler(ctx, map[string]string{"RECONCILER_STATEMENT_SOURCE": "dir", "RECONCILER_STATEMENT_DIR": dir,
		"RECONCILER_INTERVAL": "50ms", "RECONCILER_SETTLE_AFTER": "1s"})
	if err != nil {
		t.Fatal(err)
	}
	writeStatements(t, dir, "1.xml", stmt("B", "acct-B", hour()))
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	defer cancelShort()
	if _, err := e.st.FinalPass(short, rec, time.Second); err == nil || !strings.Contains(err.Error(), "acct-A") {
		t.Fatalf("final pass with acct-A never covered = %v, want it waiting for acct-A", err)
	}
	writeStatements(t, dir, "2.xml", stmt("A", "acct-A", hour()))
	if _, err := e.st.FinalPass(ctx, rec, time.Second); err != nil {
		t.Fatal(err)
	}
	if st := e.status(t, "p-a"); st != lockapi.StatusNotPresented {
		t.Fatalf("p-a is %s after the final pass", st)
	}
}

// Dir mode on the reconciler's own login (docs/contracts/database.md, least
// privilege): a file imported with its coverage, a changed version recorded and
// a payout settled, with only what the grants file gives the login.
func TestDirModeOnTheReconcilersOwnLogin(t *testing.T) {
	t.Parallel()
	e, dir := dirEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	login := fmt.Sprintf("reconciler_%d", time.Now().UnixNano())
	if _, err := e.st.Paydb.Exec(ctx, `CREATE ROLE `+login+` LOGIN PASSWORD 'not-a-secret'`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = e.st.Paydb.Exec(context.Background(), `DROP OWNED BY `+login)
		_, _ = e.st.Paydb.Exec(context.Background(), `DROP ROLE `+login)
	})
	mcfg := e.cfg
	mcfg.DBRoles = service.Roles{"PAYDB_ROLE_RECONCILER": &login}
	if err := reconcile.Migrate(ctx, mcfg); err != nil {
		t.Fatalf("migrate with the reconciler's login: %v", err)
	}
	u, err := url.Parse(e.st.PaydbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(login, "not-a-secret")
	e.cfg.PaydbURL = u.String()

	if got := e.drive(t, e.blackholeProxy(t), payoutReq("p-a", "acct-A", 100)); got != lockapi.StatusAmbiguous {
		t.Fatalf("p-a posted %s", got)
	}
	e.waitWindow(t)
	writeStatements(t, dir, "1.xml", stmt("A", "acct-A", hour()), stmt("B", "acct-B", nil, debit("nobody", "R-1", 100)))
	rep := e.pass(t)
	if rep.Files["imported"] != 1 || rep.Settled["p-a"] != lockapi.StatusNotPresented || rep.Exceptions[reconcile.KindUnknownReference] != 1 {
		t.Fatalf("files %v, settled %v, exceptions %v", rep.Files, rep.Settled, rep.Exceptions)
	}
	writeStatements(t, dir, "1.xml", stmt("A", "acct-A", hour()))
	if rep := e.pass(t); rep.Exceptions[reconcile.KindStatementFileChanged] != 1 {
		t.Fatalf("exceptions %v after 1.xml changed", rep.Exceptions)
	}
}
