package railstub

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"lock.dev/internal/isomsg"
)

// Statement file names: camt053-{number, nine digits}-{To, UTC}.xml. The number
// grows by one per file and carries on after a restart, so the names sort in
// the order the files were written; the time says what the file covers up to.
const (
	statementPrefix = "camt053-"
	statementSuffix = ".xml"
	statementDigits = 9
	statementStamp  = "20060102T150405Z"
)

// statementName is the name of file number n, covering up to to.
func statementName(n int64, to time.Time) string {
	return fmt.Sprintf("%s%0*d-%s%s", statementPrefix, statementDigits, n, to.UTC().Format(statementStamp), statementSuffix)
}

// statementNumber is the number of a statement file's name; false for any other
// name (a temporary file, another program's file).
func statementNumber(name string) (int64, bool) {
	rest, ok := strings.CutPrefix(name, statementPrefix)
	if !ok || !strings.HasSuffix(rest, statementSuffix) || len(rest) < statementDigits+1 || rest[statementDigits] != '-' {
		return 0, false
	}
	n, err := strconv.ParseInt(rest[:statementDigits], 10, 64)
	return n, err == nil && n > 0
}

// statementFiles writes the rail's statements as a bank delivers them: one
// camt.053 file per period in a directory, listing the accepted calls booked
// since the previous file, one Stmt per account the stub has ever seen a call
// for (a bank sends every account's statement each period, so an account with
// only declines is still covered), balances carried from file to file.
//
// A file is written to .{name}.tmp in the same directory, fsynced, renamed and
// the directory fsynced, so a reader never sees part of a file under its name.
// A file that cannot be written is logged and its calls stay pending: the next
// period's file lists them.
type statementFiles struct {
	dir     string
	logger  *slog.Logger
	calls   *callLog
	metrics *metrics

	mu       sync.Mutex        // one file at a time: the period's and Close's
	next     int64             // number of the next file
	from     time.Time         // FrToDt From of the next file: the previous file's To
	balances map[stmtKey]int64 // closing balance of every account seen, as last filed
	pending  []Call            // calls taken from the call log, not yet in a written file

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// openStatementFiles prepares dir (created when missing) for a stub whose call
// log holds loaded. Numbering, balances and the start of the next period carry
// on from the files already there, and every loaded call that no file lists yet
// is pending, so a restart neither reuses a name nor loses a call. Leftover
// temporary files of a stub that died mid-write are removed.
func openStatementFiles(dir string, loaded []Call, start time.Time, l *callLog, m *metrics, logger *slog.Logger) (*statementFiles, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("statement directory: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("statement directory: %w", err)
	}
	f := &statementFiles{dir: dir, logger: logger, calls: l, metrics: m, next: 1, from: start,
		balances: map[stmtKey]int64{}, stop: make(chan struct{}), done: make(chan struct{})}
	var names []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, "."+statementPrefix) && strings.HasSuffix(name, ".tmp") {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return nil, fmt.Errorf("remove a torn statement file: %w", err)
			}
			logger.Warn("removed the temporary file of a statement never renamed", "event", "statement_file_torn", "file", name)
			continue
		}
		if n, ok := statementNumber(name); ok && e.Type().IsRegular() {
			names = append(names, name)
			f.next = max(f.next, n+1)
		}
	}
	slices.Sort(names)
	filed := map[string]bool{}
	var lastTo time.Time // the previous period's end: the next one starts there
	for i, name := range names {
		last := i == len(names)-1
		if !last && len(loaded) == 0 {
			continue // only the last file's balances matter when no call is to be matched
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("statement file %s: %w", name, err)
		}
		stmts, err := isomsg.ReadStatements(b)
		if err != nil {
			return nil, fmt.Errorf("statement file %s: %w", name, err)
		}
		for _, st := range stmts {
			for _, e := range st.Entries {
				filed[e.AcctSvcrRef] = true
			}
			if !last {
				continue
			}
			if st.To != nil && st.To.After(lastTo) {
				lastTo = st.To.UTC()
			}
			// The stub's own empty statement stands for "no account yet".
			if st.Account != StatementAccount || len(st.Entries) > 0 || st.ClosingMinor != 0 {
				f.balances[stmtKey{st.Account, st.Currency}] = st.ClosingMinor
			}
		}
	}
	if !lastTo.IsZero() {
		f.from = lastTo
	}
	for _, c := range loaded {
		if c.Result == ResultAccepted && filed[c.RailReference] {
			continue
		}
		f.add(c)
	}
	return f, nil
}

// run writes a file every period until stop.
func (f *statementFiles) run(every time.Duration) {
	defer close(f.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			_ = f.write()
		case <-f.stop:
			return
		}
	}
}

// close stops the period and writes the final file; the call log must take no
// more calls by then, so the final file lists every call.
func (f *statementFiles) close() error {
	f.closeOnce.Do(func() {
		close(f.stop)
		<-f.done
		f.closeErr = f.write()
	})
	return f.closeErr
}

// write takes the calls booked since the last take and writes one file of every
// call still pending. On failure nothing advances: the calls stay pending, the
// balances and the period's start are kept, and the next file covers both
// periods under the number this one would have had.
func (f *statementFiles) write() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	taken, to := f.calls.takeUnfiled()
	if to.Before(f.from) {
		to = f.from // a clock stepped back: never a period that ends before it starts
	}
	for _, c := range taken {
		f.add(c)
	}
	stmts, closing, entries := f.statements(to)
	name := statementName(f.next, to)
	doc, err := isomsg.WriteStatements(fmt.Sprintf("RS-STMT-%0*d", statementDigits, f.next), to, stmts)
	if err == nil {
		err = writeAtomically(f.dir, name, doc)
	}
	var renamed *errDirSync
	if err != nil && !errors.As(err, &renamed) {
		f.metrics.statementFiles.WithLabelValues(metricFailed).Inc()
		f.logger.Error("a statement file could not be written; its calls go into the next one",
			"event", "statement_file_failed", "file", name, "entries", entries, "error", err.Error())
		return err
	}
	if renamed != nil {
		// The file is in place under its name; only its directory entry may
		// not survive a crash. Counted as written: a second file with the
		// same calls would list them twice.
		f.logger.Error("a statement file was written but its directory could not be synced",
			"event", "statement_file_failed", "file", name, "error", err.Error())
	}
	f.metrics.statementFiles.WithLabelValues(metricWritten).Inc()
	f.logger.Info("statement file written", "event", "statement_file_written", "file", name,
		"statements", len(stmts), "entries", entries, "from", f.from, "to", to)
	for k, v := range closing {
		f.balances[k] = v
	}
	f.next++
	f.from = to
	f.pending = nil
	return nil
}

// statements builds the next file's statements: one per account ever seen,
// sorted, with this period's entries, opening at the last file's closing
// balance. With no account seen yet it is the stub's own empty statement, so
// every period still has its file.
func (f *statementFiles) statements(to time.Time) (stmts []isomsg.Statement, closing map[stmtKey]int64, entries int) {
	from := f.from
	byKey := map[stmtKey][]Call{}
	for _, c := range f.pending {
		k := stmtKey{c.AccountID, c.Currency}
		byKey[k] = append(byKey[k], c)
	}
	closing = map[stmtKey]int64{}
	if len(f.balances) == 0 {
		return []isomsg.Statement{{ID: fmt.Sprintf("RS-%0*d-1", statementDigits, f.next), Account: StatementAccount,
			Currency: statementCurrency, From: &from, To: &to}}, closing, 0
	}
	for i, k := range sortedKeys(f.balances) {
		st := isomsg.Statement{ID: fmt.Sprintf("RS-%0*d-%d", statementDigits, f.next, i+1), Account: k.account,
			Currency: k.currency, From: &from, To: &to, OpeningMinor: f.balances[k], ClosingMinor: f.balances[k]}
		for _, c := range byKey[k] {
			st.Entries = append(st.Entries, entryOf(c))
			st.ClosingMinor -= c.AmountMinor
			entries++
		}
		closing[k] = st.ClosingMinor
		stmts = append(stmts, st)
	}
	return stmts, closing, entries
}

// add takes one call into the files: its account gets a statement from now on,
// and an accepted call is pending until a file lists it. A call that cannot be
// expressed in camt.053 (docs/contracts/rail-stub.md) is logged once, here, and
// left out — with its account too when that is what does not fit, so that one
// call never makes every later file invalid.
func (f *statementFiles) add(c Call) {
	if err := representable(c); err != nil {
		f.logger.Error("a call cannot be listed in a camt.053 statement file", "event", "statement_call_skipped",
			"seq", c.Seq, "reference", c.Reference, "accountId", c.AccountID, "error", err.Error())
		if accountRepresentable(c) != nil {
			return
		}
	} else if c.Result == ResultAccepted {
		f.pending = append(f.pending, c)
	}
	if k := (stmtKey{c.AccountID, c.Currency}); !f.hasKey(k) {
		f.balances[k] = 0
	}
}

func (f *statementFiles) hasKey(k stmtKey) bool {
	_, ok := f.balances[k]
	return ok
}

// errDirSync is a file renamed into place whose directory could not be synced.
type errDirSync struct{ err error }

func (e *errDirSync) Error() string { return "sync statement directory: " + e.err.Error() }
func (e *errDirSync) Unwrap() error { return e.err }

// writeAtomically puts doc in dir under name so that no reader ever sees part
// of it there: written to .{name}.tmp, fsynced, renamed, the directory fsynced.
func writeAtomically(dir, name string, doc []byte) (err error) {
	tmp := filepath.Join(dir, "."+name+".tmp")
	t, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	_, err = t.Write(doc)
	if err == nil {
		err = t.Sync()
	}
	if cerr := t.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	d, err := os.Open(dir)
	if err == nil {
		err = d.Sync()
		if cerr := d.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return &errDirSync{err}
	}
	return nil
}
