package demo

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// status is one progress sample.
type status struct {
	fencing          bool
	elapsed          time.Duration
	settled, total   int
	calls            int
	fenced, admitted int
	pauses, crashes  int64
}

func (st status) String() string {
	mode := "fencing on "
	if !st.fencing {
		mode = "fencing off"
	}
	return fmt.Sprintf("[%s] %5.1fs  payouts settled %d/%d  rail calls %d  admitted %d  fenced %d  pauses %d  proxy crashes %d",
		mode, st.elapsed.Seconds(), st.settled, st.total, st.calls, st.admitted, st.fenced, st.pauses, st.crashes)
}

// progress writes the live status line to stderr: rewritten in place on a
// terminal (about twice a second), one line every few seconds otherwise.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	last  time.Time
	width int
	cur   status
	shown bool
	said  string // the last line printed when not on a terminal
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

func (p *progress) update(st status) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cur, p.shown = st, true
	line := st.String()
	if p.tty {
		pad := max(p.width-len(line), 0)
		fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", pad))
		p.width = len(line)
		return
	}
	if time.Since(p.last) >= 5*time.Second {
		fmt.Fprintln(p.w, line)
		p.last, p.said = time.Now(), line
	}
}

// done ends the run's status with its last sample on a line of its own.
func (p *progress) done() {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.shown {
		return
	}
	if p.tty {
		fmt.Fprintln(p.w)
	} else if line := p.cur.String(); line != p.said {
		fmt.Fprintln(p.w, line)
	}
	p.shown, p.width, p.last, p.said = false, 0, time.Time{}, ""
}

// say writes a line of narration (start-up, phases) outside the status line.
func (p *progress) say(format string, args ...any) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.width > 0 {
		fmt.Fprint(p.w, "\r"+strings.Repeat(" ", p.width)+"\r")
		p.width = 0
	}
	fmt.Fprintf(p.w, format+"\n", args...)
}
