package serve

import (
	"io"
	"sync"
)

// LogWriter batches log lines on their way to stdout: a line is appended to a
// buffer and one goroutine writes whatever has gathered, so under load many lines
// go out in one write(2) (one per submission was 3 % of rail-proxy's CPU), while a
// lone line is written as soon as that goroutine runs — no timer, no delay.
// Lines keep their order. A Write that would take the buffer past maxLogBatch
// writes it, and itself, at once (a stalled stdout holds the writers back rather
// than growing the buffer). Close writes what is left. A process killed outright
// loses only the lines of the last moment, which a per-line write would have lost
// too when they were still being formatted.
type LogWriter struct {
	out io.Writer

	wmu sync.Mutex // held while writing to out: batches go out in order

	mu      sync.Mutex // guards buf and closed
	buf     []byte
	spare   []byte
	closed  bool
	kick    chan struct{}
	stopped chan struct{}
}

// maxLogBatch bounds the bytes waiting to be written.
const maxLogBatch = 256 << 10

func NewLogWriter(out io.Writer) *LogWriter {
	w := &LogWriter{out: out, kick: make(chan struct{}, 1), stopped: make(chan struct{})}
	go w.run()
	return w
}

// Write queues p, which must be whole lines (slog writes one record per call).
func (w *LogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		w.wmu.Lock()
		defer w.wmu.Unlock()
		return w.out.Write(p)
	}
	if len(w.buf)+len(p) > maxLogBatch {
		w.mu.Unlock()
		w.wmu.Lock()
		defer w.wmu.Unlock()
		w.flushLocked()
		return w.out.Write(p)
	}
	w.buf = append(w.buf, p...)
	select {
	case w.kick <- struct{}{}:
	default:
	}
	w.mu.Unlock()
	return len(p), nil
}

// flushLocked writes what has gathered; wmu must be held.
func (w *LogWriter) flushLocked() {
	w.mu.Lock()
	b := w.buf
	w.buf = w.spare[:0]
	w.mu.Unlock()
	if len(b) > 0 {
		_, _ = w.out.Write(b)
	}
	w.mu.Lock()
	if cap(b) <= maxLogBatch*2 {
		w.spare = b[:0]
	}
	w.mu.Unlock()
}

func (w *LogWriter) run() {
	defer close(w.stopped)
	for range w.kick {
		w.wmu.Lock()
		w.flushLocked()
		w.wmu.Unlock()
	}
}

// Close writes every queued line and stops the writing goroutine; later lines
// are written directly.
func (w *LogWriter) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	close(w.kick) // under mu: no Write is sending on it
	w.mu.Unlock()
	<-w.stopped
	w.wmu.Lock()
	w.flushLocked()
	w.wmu.Unlock()
	return nil
}
