package reconcile

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"lock.dev/internal/isomsg"
	"lock.dev/lockapi"
)

// maxStatementFile bounds a statement file read into memory: a camt.053 entry
// is about 1.5 KiB, so this is room for some twenty thousand entries; a larger
// file is refused as invalid rather than read.
const maxStatementFile = 32 << 20

// maxFileNameLen bounds a statement file's name, in characters (a file system's
// usual bound): a longer one, or one that is not text paydb can store, is an
// invalid file.
const maxFileNameLen = 255

// The values of reconciler_statement_files_total{result}.
const (
	fileImported  = "imported"
	fileUnchanged = "unchanged"
	fileChanged   = "changed"
	fileInvalid   = "invalid"
)

var fileResults = []string{fileImported, fileUnchanged, fileChanged, fileInvalid}

// statementDir is where the rail's statement comes from in dir mode: the camt.053
// files that appear in a directory (docs/contracts/reconciliation.md, "Statements
// from files"). Its state is paydb's, except what it remembers of the files it
// found invalid: a file is read again only when its bytes change, and a restart
// reads each once more.
type statementDir struct {
	dir string
	// invalid is name → SHA-256 of the files found invalid, with when they
	// were seen as they are (size and modification time): not read again
	// while they are unchanged.
	invalid map[string]fileSeen
	// hashed remembers the SHA-256 of a file by its size and modification
	// time, so a pass does not read every imported file again.
	hashed map[string]fileSeen
}

// fileSeen is a file's SHA-256 as it was read, with the size and modification
// time it had.
type fileSeen struct {
	size    int64
	modTime time.Time
	sha256  string
}

func newStatementDir(dir string) *statementDir {
	return &statementDir{dir: dir, invalid: map[string]fileSeen{}, hashed: map[string]fileSeen{}}
}

// readable is the statementDir readiness check: the directory can be listed.
func (d *statementDir) readable(context.Context) error {
	f, err := os.Open(d.dir)
	if err != nil {
		return fmt.Errorf("statement directory: %w", err)
	}
	defer f.Close()
	if _, err := f.ReadDir(1); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("statement directory: %w", err)
	}
	return nil
}

// statementFileName reports whether name is one the reconciler reads: *.xml,
// and not starting with "." (a writer's temporary file, renamed once complete).
func statementFileName(name string) bool {
	return strings.HasSuffix(name, ".xml") && !strings.HasPrefix(name, ".")
}

// list returns the statement files of the directory in name order, with their
// size and modification time.
func (d *statementDir) list() ([]os.DirEntry, error) {
	entries, err := os.ReadDir(d.dir) // sorted by name
	if err != nil {
		return nil, fmt.Errorf("list the statement directory: %w", err)
	}
	out := entries[:0]
	for _, e := range entries {
		if statementFileName(e.Name()) && e.Type().IsRegular() {
			out = append(out, e)
		}
	}
	return out, nil
}

// read reads a file, bounded, and its SHA-256 (hex).
func (d *statementDir) read(name string) ([]byte, string, error) {
	f, err := os.Open(filepath.Join(d.dir, name))
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxStatementFile+1))
	if err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:]), nil
}

// parsedFile is a statement file that validated: its statements and their
// lines, in entry order.
type parsedFile struct {
	stmts []isomsg.Statement
	lines []lockapi.StatementLine
}

// parseStatementFile validates a camt.053 file: it decodes, every statement's
// balances agree with its entries, and every statement's lines are readable.
// The error says why not.
func parseStatementFile(b []byte) (parsedFile, error) {
	if len(b) > maxStatementFile {
		return parsedFile{}, fmt.Errorf("larger than %d bytes", maxStatementFile)
	}
	stmts, err := isomsg.ReadStatements(b)
	if err != nil {
		return parsedFile{}, fmt.Errorf("not a camt.053 statement: %w", err)
	}
	if len(stmts) == 0 {
		return parsedFile{}, errors.New("no statement in it")
	}
	var lines []lockapi.StatementLine
	for i, s := range stmts {
		if err := s.Balanced(); err != nil {
			return parsedFile{}, fmt.Errorf("statement %d (%s): unbalanced: %w", i+1, s.ID, err)
		}
		// The reconciler numbers a file's lines itself, in import order: a
		// bank's NtryRef is optional and need not be a number.
		ls, err := s.UnnumberedLines()
		if err != nil {
			return parsedFile{}, fmt.Errorf("statement %d (%s): its entries: %w", i+1, s.ID, err)
		}
		lines = append(lines, ls...)
	}
	return parsedFile{stmts: stmts, lines: lines}, nil
}

// importFiles is step 1 in dir mode: every statement file of the directory not
// yet imported, in name order, each in one transaction (importFile); a file
// whose name was imported with other bytes recorded once as
// STATEMENT_FILE_CHANGED; a file that does not validate skipped, logged and
// counted, and read again only when it changes.
func (r *reconciler) importFiles(ctx context.Context, ss *session, rep *PassReport) error {
	entries, err := r.files.list()
	if err != nil {
		return err
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	known, err := ss.knownFiles(ctx, names)
	if err != nil {
		return err
	}
	count := func(result string) {
		rep.Files[result]++
		r.metrics.statementFiles.WithLabelValues(result).Inc()
	}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := e.Name()
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since it was listed
		}
		if err != nil {
			return fmt.Errorf("statement file %s: %w", name, err)
		}
		k := known[name]
		if seen, ok := r.files.invalid[name]; ok && seen.size == info.Size() && seen.modTime.Equal(info.ModTime()) {
			continue // invalid as it is: read again only when it changes
		}
		if seen, ok := r.files.hashed[name]; ok && seen.size == info.Size() && seen.modTime.Equal(info.ModTime()) && k.imported != "" {
			if seen.sha256 == k.imported {
				count(fileUnchanged)
				continue
			}
			if k.changed[seen.sha256] {
				continue // this version was recorded already
			}
		}
		b, sum, err := r.files.read(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read statement file %s: %w", name, err)
		}
		seen := fileSeen{size: info.Size(), modTime: info.ModTime(), sha256: sum}
		switch {
		case k.imported == sum:
			r.files.hashed[name] = seen
			count(fileUnchanged)
			continue
		case k.imported != "":
			// The name was imported with other bytes: what was imported stands;
			// a person looks at the new version. Nothing of it is imported.
			r.files.hashed[name] = seen
			if k.changed[sum] {
				continue
			}
			recorded, err := ss.recordChangedFile(ctx, name, sum, k.imported)
			if err != nil {
				return err
			}
			count(fileChanged)
			r.noteExceptions(rep, recorded)
			continue
		}
		if prev, ok := r.files.invalid[name]; ok && prev.sha256 == sum {
			r.files.invalid[name] = seen // touched, not changed
			continue
		}
		pf, err := parseStatementFile(b)
		if p := lockapi.StorableTextProblem(name, maxFileNameLen); p != "" {
			// Its row could not be written: every pass would fail on it.
			err = fmt.Errorf("its name %s", p)
		}
		if err != nil {
			r.files.invalid[name] = seen
			count(fileInvalid)
			r.logger.Error("statement file invalid: skipped, and read again only when it changes", "event", "statement_file_invalid",
				"file", name, "sha256", sum, "error", err.Error())
			continue
		}
		delete(r.files.invalid, name)
		res, err := ss.importFile(ctx, name, sum, pf)
		if err != nil {
			return fmt.Errorf("import statement file %s: %w", name, err)
		}
		r.files.hashed[name] = seen
		if !res.done {
			continue // imported meanwhile by a pass that lost its lock
		}
		count(fileImported)
		rep.Imported += res.imported
		rep.LastSeq = max(rep.LastSeq, res.lastSeq)
		r.metrics.linesImported.Add(float64(res.imported))
		r.metrics.statementSeq.Set(float64(rep.LastSeq))
		r.noteExceptions(rep, res.recorded)
		r.noteRepeated(res.repeated, name)
		r.logger.Info("statement file imported", "event", "statement_file_imported", "file", name, "sha256", sum,
			"statements", len(pf.stmts), "entries", len(pf.lines), "imported", res.imported, "lastSeq", res.lastSeq)
	}
	// Forget what is no longer in the directory.
	for name := range r.files.invalid {
		if _, ok := slices.BinarySearch(names, name); !ok {
			delete(r.files.invalid, name)
		}
	}
	for name := range r.files.hashed {
		if _, ok := slices.BinarySearch(names, name); !ok {
			delete(r.files.hashed, name)
		}
	}
	return nil
}
