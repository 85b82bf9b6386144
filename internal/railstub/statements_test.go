package railstub

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/isomsg"
	"lock.dev/internal/testkit"
)

// fileStub is a stub writing statement files, served over real HTTP, that the
// test closes itself (the final file is written by Close).
type fileStub struct {
	*testStub
	shutdown func() error
	closed   bool
}

func startFileStub(t *testing.T, dir string, mutate func(*Config)) *fileStub {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Identity = unsafeNoAuth()
	seed := int64(1)
	cfg.Seed = &seed
	logs := &syncBuffer{}
	cfg.LogOutput = logs
	cfg.StatementDir = dir
	cfg.StatementEvery = time.Hour // a test that wants periods sets its own
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	url, shutdown := serveFast(t, s.Handler(), s)
	fs := &fileStub{testStub: &testStub{Stub: s, URL: url, Client: NewClient(url), logs: logs}, shutdown: shutdown}
	t.Cleanup(func() { fs.close(t) })
	return fs
}

// close stops serving and closes the stub, which writes the final file.
func (fs *fileStub) close(t *testing.T) {
	t.Helper()
	if fs.closed {
		return
	}
	fs.closed = true
	if err := fs.shutdown(); err != nil {
		t.Error(err)
	}
	if err := fs.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// statementFile is one file of the directory, read and checked: named as the
// stub names them, valid against the official schema, every statement balanced.
type statementFile struct {
	name  string
	stmts []isomsg.Statement
}

func statementFilesIn(t *testing.T, dir string) []statementFile {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []statementFile
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Fatalf("%s left in the directory", e.Name())
		}
		if _, ok := statementNumber(e.Name()); !ok {
			t.Fatalf("%s is not a statement file's name", e.Name())
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, statementFile{e.Name(), readStatements(t, b)})
	}
	return out // os.ReadDir sorts by name
}

// checkStatementFiles checks the files as a reader of the directory in name
// order sees them: numbered 1, 2, … in that order, each period starting where
// the last ended, every account's balance carried from file to file, and every
// accepted call of cs listed exactly once, in the period it was booked in; no
// decline listed.
func checkStatementFiles(t *testing.T, files []statementFile, cs []Call) {
	t.Helper()
	byRef := map[string]Call{}
	for _, c := range cs {
		if c.Result == ResultAccepted {
			byRef[c.RailReference] = c
		}
	}
	listed := map[string]int{}
	balances := map[stmtKey]int64{}
	var prevTo time.Time
	for i, f := range files {
		if n, _ := statementNumber(f.name); n != int64(i+1) {
			t.Fatalf("file %d in name order is %s", i+1, f.name)
		}
		for _, st := range f.stmts {
			if st.From == nil || st.To == nil || st.To.Before(*st.From) || (i > 0 && !st.From.Equal(prevTo)) {
				t.Fatalf("%s: statement of %s covers %v–%v, want from the previous file's end %v", f.name, st.Account, st.From, st.To, prevTo)
			}
			k := stmtKey{st.Account, st.Currency}
			if st.OpeningMinor != balances[k] {
				t.Fatalf("%s: %s opens at %d, the previous file closed at %d", f.name, st.Account, st.OpeningMinor, balances[k])
			}
			balances[k] = st.ClosingMinor
			for _, e := range st.Entries {
				c, ok := byRef[e.AcctSvcrRef]
				if !ok {
					t.Fatalf("%s: entry %+v is no accepted call", f.name, e)
				}
				listed[e.AcctSvcrRef]++
				if c.AccountID != st.Account || e.EndToEndID != c.Reference || e.AmountMinor != c.AmountMinor ||
					e.Ref != fmt.Sprint(c.Seq) || !e.BookedAt.Equal(c.ReceivedAt) || e.BookedAt.Before(*st.From) || e.BookedAt.After(*st.To) {
					t.Fatalf("%s: entry %+v of %s (%v–%v) is not call %+v in its period", f.name, e, st.Account, st.From, st.To, c)
				}
			}
		}
		prevTo = *files[i].stmts[0].To
	}
	for ref, c := range byRef {
		if listed[ref] != 1 {
			t.Fatalf("accepted call %d (%s) is listed %d times, want once", c.Seq, ref, listed[ref])
		}
	}
}

// The files as a bank delivers them: while a reader polls the directory the
// whole time, no file it sees under a *.xml name is partial or changes later;
// every accepted call is in exactly one file, the balances add up from file to
// file, an account with only declines has a statement in every file from its
// first call on, and the names sort in the order written, the final one
// written by Close.
func TestStatementFilesAreAtomicCompleteAndBalanced(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ts := startFileStub(t, dir, func(c *Config) { c.StatementEvery = 5 * time.Millisecond })

	var mu sync.Mutex
	var faults []string
	seen := map[string][]byte{}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				mu.Lock()
				faults = append(faults, err.Error())
				mu.Unlock()
				return
			}
			for _, e := range entries {
				name := e.Name()
				if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".xml") {
					continue
				}
				b, err := os.ReadFile(filepath.Join(dir, name))
				mu.Lock()
				switch prev, ok := seen[name]; {
				case err != nil:
					faults = append(faults, err.Error())
				case ok && !bytes.Equal(prev, b):
					faults = append(faults, name+" changed after it appeared")
					seen[name] = b
				case !ok:
					if _, err := isomsg.ReadStatements(b); err != nil {
						faults = append(faults, name+" is not a whole statement: "+err.Error())
					}
					seen[name] = b
				}
				mu.Unlock()
			}
		}
	}()

	files := func() int {
		n := 0
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if _, ok := statementNumber(e.Name()); ok {
				n++
			}
		}
		return n
	}
	payBatch := func(round int) {
		for i := range 4 {
			p := payment(fmt.Sprintf("p-%d-%d", round, i))
			p.AccountID = []string{"acct-2", "acct-1"}[i%2]
			p.AmountMinor = int64(100*round + i + 1)
			if r := pay(t, ts.testStub, p); r.status != http.StatusOK {
				t.Fatalf("pay: %d %s", r.status, r.body)
			}
		}
	}
	payBatch(1)
	testkit.Eventually(t, 10*time.Second, "a file after the first batch", func() bool { return files() >= 1 })
	if _, err := ts.Client.SetChaos(t.Context(), 0, 1, 0, nil); err != nil {
		t.Fatal(err)
	}
	declined := payment("p-declined")
	declined.AccountID = "acct-only-declines"
	if r := pay(t, ts.testStub, declined); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("decline: %d %s", r.status, r.body)
	}
	if _, err := ts.Client.SetChaos(t.Context(), 0, 0, 0, nil); err != nil {
		t.Fatal(err)
	}
	before := files()
	testkit.Eventually(t, 10*time.Second, "two more files", func() bool { return files() >= before+2 })
	payBatch(2)
	payBatch(3)
	cs := calls(t, ts.testStub)
	ts.close(t)
	close(stop)
	<-done
	mu.Lock()
	if len(faults) > 0 {
		t.Fatalf("the reader saw: %s", strings.Join(faults, "; "))
	}
	mu.Unlock()

	got := statementFilesIn(t, dir)
	if len(got) < 3 {
		t.Fatalf("%d files, want at least 3", len(got))
	}
	checkStatementFiles(t, got, cs)
	var declinedAt time.Time
	for _, c := range cs {
		if c.Result == ResultDeclined {
			declinedAt = c.ReceivedAt
		}
	}
	for _, f := range got {
		has := slices.ContainsFunc(f.stmts, func(st isomsg.Statement) bool {
			return st.Account == "acct-only-declines" && len(st.Entries) == 0 && st.ClosingMinor == 0
		})
		if to := *f.stmts[0].To; !to.Before(declinedAt) && !has {
			t.Fatalf("%s (to %v) has no statement of the account with only a decline (booked %v)", f.name, to, declinedAt)
		}
	}
	if ev := ts.logs.events(t, "statement_file_written"); len(ev) != len(got) {
		t.Fatalf("%d statement_file_written events for %d files", len(ev), len(got))
	}
}

// A file that cannot be written is logged, counted and written nothing of; its
// calls go into the next file, under the number it would have had.
func TestStatementFileFailureIsRetriedNextPeriod(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ts := startFileStub(t, dir, nil)
	for i := range 2 {
		if r := pay(t, ts.testStub, payment(fmt.Sprintf("p-%d", i))); r.status != http.StatusOK {
			t.Fatalf("pay: %d", r.status)
		}
	}
	f := ts.statements
	f.mu.Lock()
	f.dir = filepath.Join(dir, "missing")
	f.mu.Unlock()
	if err := f.write(); err == nil {
		t.Fatal("a file was written to a missing directory")
	}
	if ev := ts.logs.events(t, "statement_file_failed"); len(ev) != 1 || ev[0]["level"] != "ERROR" {
		t.Fatalf("statement_file_failed events = %v", ev)
	}
	if n := testkit.Metric(t, ts.URL, `rail_stub_statement_files_total{result="failed"}`); n != 1 {
		t.Fatalf("failed files counted %v, want 1", n)
	}
	f.mu.Lock()
	f.dir = dir
	f.mu.Unlock()
	if r := pay(t, ts.testStub, payment("p-3")); r.status != http.StatusOK {
		t.Fatalf("pay: %d", r.status)
	}
	if err := f.write(); err != nil {
		t.Fatal(err)
	}
	got := statementFilesIn(t, dir)
	if len(got) != 1 || len(got[0].stmts) != 1 || len(got[0].stmts[0].Entries) != 3 {
		t.Fatalf("files = %+v, want one file with the three calls", got)
	}
	cs := calls(t, ts.testStub)
	ts.close(t)
	got = statementFilesIn(t, dir)
	if len(got) != 2 || len(got[1].stmts[0].Entries) != 0 {
		t.Fatalf("files = %+v, want the final one without entries", got)
	}
	checkStatementFiles(t, got, cs)
}

// A restarted stub carries on: numbering, balances and periods continue from the
// files in the directory, a call in the call log that no file lists (the last
// file lost) is listed again, and a temporary file left by a stub that died
// mid-write is removed. In ISO 20022 mode, as in the JSON mode: a file is how a
// bank delivers, whatever the payments came in.
func TestStatementFilesCarryOnAfterARestart(t *testing.T) {
	t.Parallel()
	dir, callLog := t.TempDir(), filepath.Join(t.TempDir(), "calls.jsonl")
	iso := func(c *Config) { c.Protocol, c.CallLogPath = ProtocolISO20022, callLog }
	payISO := func(ts *fileStub, refs ...string) {
		for _, ref := range refs {
			r, err := postPain001(t, ts.testStub, pain001(t, initiation(ref)))
			if err != nil {
				t.Fatal(err)
			}
			statusReport(t, r)
		}
	}
	a := startFileStub(t, dir, iso)
	payISO(a, "p-1", "p-2", "p-3")
	a.close(t)
	b := startFileStub(t, dir, iso)
	payISO(b, "p-4", "p-5")
	b.close(t)
	got := statementFilesIn(t, dir)
	cs := b.calls.list(0, MaxPageLimit)
	if len(got) != 2 || len(got[0].stmts[0].Entries) != 3 || len(got[1].stmts[0].Entries) != 2 {
		t.Fatalf("files = %+v, want 3 then 2 entries", got)
	}
	checkStatementFiles(t, got, cs)

	// The second file is lost; a leftover temporary file lies about.
	if err := os.Remove(filepath.Join(dir, got[1].name)); err != nil {
		t.Fatal(err)
	}
	torn := filepath.Join(dir, ".camt053-000000007-20261203T000000Z.xml.tmp")
	if err := os.WriteFile(torn, []byte("<Doc"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startFileStub(t, dir, iso)
	if _, err := os.Stat(torn); !os.IsNotExist(err) {
		t.Fatalf("the temporary file is still there: %v", err)
	}
	payISO(c, "p-6")
	c.close(t)
	got = statementFilesIn(t, dir)
	cs = c.calls.list(0, MaxPageLimit)
	if len(got) != 2 || len(got[1].stmts[0].Entries) != 3 {
		t.Fatalf("files = %+v, want the second listing the two unlisted calls and the new one", got)
	}
	checkStatementFiles(t, got, cs)
}

// A call the JSON route took but camt.053 cannot hold (a reference over 35
// characters, an account or beneficiary over 34) is logged and left out; the
// files stay valid and list every other call, and an account too long for a
// statement gets none.
func TestStatementFilesLeaveOutCallsCamt053CannotHold(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ts := startFileStub(t, dir, nil)
	long := strings.Repeat("x", 40)
	ok, longAccount, longRef, longBenef := payment("p-ok"), payment("p-acct"), payment("p-"+long), payment("p-benef")
	longAccount.AccountID, longBenef.Beneficiary = long, long
	for _, p := range []PaymentRequest{ok, longAccount, longRef, longBenef} {
		if r := pay(t, ts.testStub, p); r.status != http.StatusOK {
			t.Fatalf("pay %s: %d %s", p.Reference, r.status, r.body)
		}
	}
	if err := ts.statements.write(); err != nil {
		t.Fatal(err)
	}
	cs := calls(t, ts.testStub)
	ts.close(t)
	got := statementFilesIn(t, dir)
	if len(got) != 2 {
		t.Fatalf("%d files, want 2", len(got))
	}
	for _, f := range got {
		if len(f.stmts) != 1 || f.stmts[0].Account != "acct-7" {
			t.Fatalf("%s: statements %+v, want acct-7's only", f.name, f.stmts)
		}
	}
	if e := got[0].stmts[0].Entries; len(e) != 1 || e[0].EndToEndID != "p-ok" {
		t.Fatalf("entries %+v, want p-ok's only", e)
	}
	checkStatementFiles(t, got, cs[:1])
	if ev := ts.logs.events(t, "statement_call_skipped"); len(ev) != 3 || ev[0]["level"] != "ERROR" {
		t.Fatalf("statement_call_skipped events = %v, want one per call left out", ev)
	}
}
