package railstub

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"time"

	"lock.dev/lockapi"
)

// Results of a call (docs/contracts/rail-stub.md). A dropped call is ACCEPTED: the
// money moved, only the reply was lost.
const (
	ResultAccepted = lockapi.ResultAccepted
	ResultDeclined = lockapi.ResultDeclined
)

// Call is one payment the rail was presented, as the call log keeps it. On the wire
// (GET /rail/v1/calls) and in the call-log file it is a lockapi.RailCall.
type Call struct {
	Seq           int64
	ReceivedAt    time.Time
	Reference     string
	AccountID     string
	AmountMinor   int64
	Currency      string
	Beneficiary   string
	Result        string // ACCEPTED or DECLINED
	RailReference string // null on the wire for a declined call
	Reason        string // the decline reason; null on the wire for an accepted call
	LatencyMs     int    // delay applied before the reply; 0 when dropped
	Dropped       bool   // accepted, then the connection was closed without a reply
}

// MarshalJSON writes c as a lockapi.RailCall: railReference is null when the call
// has none (a decline), and reason null when it has none (an accept): an empty
// string would look like a value.
func (c Call) MarshalJSON() ([]byte, error) {
	var ref, reason *string
	if c.RailReference != "" {
		ref = &c.RailReference
	}
	if c.Reason != "" {
		reason = &c.Reason
	}
	return json.Marshal(lockapi.RailCall{Seq: c.Seq, ReceivedAt: c.ReceivedAt, Reference: c.Reference,
		AccountID: c.AccountID, AmountMinor: c.AmountMinor, Currency: c.Currency, Beneficiary: c.Beneficiary,
		Result: c.Result, RailReference: ref, Reason: reason, LatencyMs: c.LatencyMs, Dropped: c.Dropped})
}

// UnmarshalJSON reads a lockapi.RailCall; a null railReference or reason is empty.
func (c *Call) UnmarshalJSON(b []byte) error {
	var w lockapi.RailCall
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*c = Call{Seq: w.Seq, ReceivedAt: w.ReceivedAt, Reference: w.Reference, AccountID: w.AccountID,
		AmountMinor: w.AmountMinor, Currency: w.Currency, Beneficiary: w.Beneficiary, Result: w.Result,
		RailReference: deref(w.RailReference), Reason: deref(w.Reason), LatencyMs: w.LatencyMs, Dropped: w.Dropped}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

var errClosed = errors.New("rail-stub is shutting down")

// errNotRecorded wraps a failure that left no trace: the call was not recorded and
// nothing was decided, so no payment was made.
type errNotRecorded struct{ err error }

func (e *errNotRecorded) Error() string { return "call not recorded: " + e.err.Error() }
func (e *errNotRecorded) Unwrap() error { return e.err }

// callLog is the rail's books: every call in arrival order, in memory and, when a
// file is configured, as one fsynced JSON line per call. It is the ground truth of
// what the rail was presented, so a call is written here before anything else
// happens to it.
//
// Lock order: syncMu before mu. mu is held only for the in-memory append and one
// write(2) of the line (so the file's order is seq order); the fsync happens
// outside it and is shared: whoever syncs covers every line written before it
// started, and callers whose line is already covered skip theirs (group commit).
type callLog struct {
	mu      sync.Mutex
	calls   []Call
	next    int64    // seq of the next call
	file    *os.File // nil: memory only (or closed)
	path    string
	size    int64 // bytes of committed lines in file, to cut back a failed write
	written int64 // lines ever written to file, across resets; what a sync covers
	broken  error // the file failed; no call is taken any more
	closed  bool
	// filing keeps every booked call in unfiled too, until the statement files
	// take them (takeUnfiled); a reset forgets calls, not what is yet to be filed.
	filing  bool
	unfiled []Call

	syncMu sync.Mutex
	synced int64 // written count covered by the last successful fsync
}

// openCallLog loads path when it is set: every complete line becomes a call again
// and seq continues after the last. A torn last line (no newline: the process died
// during the write, before that call was ever answered) is cut off; any other bad
// line is an error, since the stub must not start on books it cannot read.
func openCallLog(path string) (l *callLog, tornBytes int, err error) {
	l = &callLog{next: 1, path: path}
	if path == "" {
		return l, 0, nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("open call log: %w", err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
		}
	}()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, 0, fmt.Errorf("read call log %s: %w", path, err)
	}
	complete := data
	if i := bytes.LastIndexByte(data, '\n'); i+1 < len(data) {
		complete = data[:i+1]
		tornBytes = len(data) - len(complete)
		if err := f.Truncate(int64(len(complete))); err != nil {
			return nil, 0, fmt.Errorf("cut torn line off call log %s: %w", path, err)
		}
		if err := f.Sync(); err != nil {
			return nil, 0, fmt.Errorf("sync call log %s: %w", path, err)
		}
	}
	lineNo := 0
	for line := range bytes.Lines(complete) {
		lineNo++
		var c Call
		if err := json.Unmarshal(line, &c); err != nil {
			return nil, 0, fmt.Errorf("call log %s line %d: %w", path, lineNo, err)
		}
		if c.Seq < l.next {
			return nil, 0, fmt.Errorf("call log %s line %d: seq %d does not follow %d", path, lineNo, c.Seq, l.next-1)
		}
		if c.Result != ResultAccepted && c.Result != ResultDeclined {
			return nil, 0, fmt.Errorf("call log %s line %d: result %q is neither %s nor %s", path, lineNo, c.Result, ResultAccepted, ResultDeclined)
		}
		l.calls = append(l.calls, c)
		l.next = c.Seq + 1
	}
	l.file, l.size = f, int64(len(complete))
	return l, tornBytes, nil
}

// record books one call: it assigns the next seq, lets fill complete the call
// (drawing the chaos decisions, so draws happen in seq order), writes the line and
// appends the call, then waits until the line is on disk. A *errNotRecorded means
// nothing was booked; any other error means the call is booked in memory but its
// durability is unknown.
func (l *callLog) record(fill func(c *Call)) (Call, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return Call{}, &errNotRecorded{errClosed}
	}
	if l.broken != nil {
		l.mu.Unlock()
		return Call{}, &errNotRecorded{fmt.Errorf("call log failed earlier: %w", l.broken)}
	}
	c := Call{Seq: l.next, ReceivedAt: time.Now().UTC()}
	fill(&c)
	var mark int64
	if l.file != nil {
		line, err := json.Marshal(c)
		if err == nil {
			var n int
			n, err = l.file.Write(append(line, '\n'))
			if err != nil && n > 0 {
				// Leave no partial line behind for the next start to trip on.
				_ = l.file.Truncate(l.size)
			}
			if err == nil {
				l.size += int64(n)
			}
		}
		if err != nil {
			l.broken = err
			l.mu.Unlock()
			return Call{}, &errNotRecorded{fmt.Errorf("write call log %s: %w", l.path, err)}
		}
		l.written++
		mark = l.written
	}
	l.calls = append(l.calls, c)
	if l.filing {
		l.unfiled = append(l.unfiled, c)
	}
	l.next++
	l.mu.Unlock()

	if mark > 0 {
		if err := l.syncThrough(mark); err != nil {
			return c, err
		}
	}
	return c, nil
}

// syncThrough returns once the line numbered mark is on disk.
func (l *callLog) syncThrough(mark int64) error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	if l.synced >= mark {
		return nil
	}
	l.mu.Lock()
	f, written := l.file, l.written
	l.mu.Unlock()
	if f == nil {
		return errClosed
	}
	if err := f.Sync(); err != nil {
		l.mu.Lock()
		l.broken = err
		l.mu.Unlock()
		return fmt.Errorf("sync call log %s: %w", l.path, err)
	}
	l.synced = written
	return nil
}

// list returns up to limit calls with seq > after, in arrival order.
func (l *callLog) list(after int64, limit int) []Call {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := sort.Search(len(l.calls), func(i int) bool { return l.calls[i].Seq > after })
	end := min(len(l.calls), i+limit)
	return append(make([]Call, 0, end-i), l.calls[i:end]...) // never nil: the wire shows [] not null
}

// listAccepted returns up to limit accepted calls with seq > after, in arrival
// order: a page of a statement, which lists only what moved, still holds limit
// entries when there are that many, however many declines lie between them.
func (l *callLog) listAccepted(after int64, limit int) []Call {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Call
	for i := sort.Search(len(l.calls), func(i int) bool { return l.calls[i].Seq > after }); i < len(l.calls) && len(out) < limit; i++ {
		if l.calls[i].Result == ResultAccepted {
			out = append(out, l.calls[i])
		}
	}
	return out
}

// takeUnfiled hands over the calls booked since the last take, and the moment
// of the take: read under the lock that books calls, so every call booked before
// that moment is in this take or an earlier one.
func (l *callLog) takeUnfiled() ([]Call, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cs := l.unfiled
	l.unfiled = nil
	return cs, time.Now().UTC()
}

// reset forgets every call: the next is seq 1 and the file is empty.
func (l *callLog) reset() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls, l.next = nil, 1
	if l.file == nil {
		return nil
	}
	err := l.file.Truncate(0)
	if err == nil {
		err = l.file.Sync()
	}
	if err != nil {
		l.broken = err
		return fmt.Errorf("truncate call log %s: %w", l.path, err)
	}
	l.size = 0
	return nil
}

// health is nil while calls can be booked.
func (l *callLog) health() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.broken != nil {
		return fmt.Errorf("call log %s failed: %w", l.path, l.broken)
	}
	return nil
}

func (l *callLog) count() (calls int, next int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.calls), l.next
}

// close stops taking calls and closes the file after a last fsync.
func (l *callLog) close() error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.mu.Lock()
	l.closed = true
	f, written := l.file, l.written
	l.file = nil
	l.mu.Unlock()
	if f == nil {
		return nil
	}
	err := f.Sync()
	if err == nil {
		l.synced = written
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("close call log %s: %w", l.path, err)
	}
	return nil
}
