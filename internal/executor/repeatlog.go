package executor

import (
	"log/slog"
	"sync"
	"time"
)

// repeatEvery is how often a failure that keeps repeating is summarised.
const repeatEvery = 30 * time.Second

// repeatLog keeps a failure that repeats from flooding the log. With a service
// down every worker's look for work fails each poll interval — four workers at
// 500 ms log eight identical lines a second — and the one line that matters,
// when it started and when it ended, drowns. So a failure is logged the first
// time it is seen; the same failure again (same event, same error text) only
// counts, and a summary line with the count goes out at most every repeatEvery;
// a different error for the event is logged at once; and the first success after
// a failure logs that it is over (event failure_recovered), with how many times
// it failed and for how long. Failures no one repeats — a claim refused, a lost
// lease — do not go through here.
type repeatLog struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	failing map[string]*repeating // by event
}

// repeating is one event's failure in progress.
type repeating struct {
	err      string    // the error text of the failure logged last
	msg      string    // its message
	since    time.Time // when the event started failing
	lastLine time.Time // when a line was last written for it
	unlogged int       // failures since that line
	total    int       // failures since the event started failing
}

func newRepeatLog(log *slog.Logger, every time.Duration, now func() time.Time) *repeatLog {
	return &repeatLog{log: log, every: every, now: now, failing: map[string]*repeating{}}
}

// failed records a failure of event: logged at WARN with msg, attrs and the
// error when it is new, counted when it repeats (with a summary line, field
// repeated, at most every r.every).
func (r *repeatLog) failed(event, msg string, err error, attrs ...any) {
	now := r.now()
	text := errText(err)
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.failing[event]
	switch {
	case f == nil:
		r.failing[event] = &repeating{err: text, since: now, lastLine: now, total: 1, msg: msg}
		r.log.Warn(msg, r.fields(event, text, attrs)...)
	case f.err != text:
		// Another failure of the same step: the operator needs to see it now.
		// What the old one repeated since its last line is said with it.
		f.total++
		line := append(r.fields(event, text, attrs), "repeatedBefore", f.unlogged, "failingFor", now.Sub(f.since).Round(time.Millisecond).String())
		f.err, f.msg, f.lastLine, f.unlogged = text, msg, now, 0
		r.log.Warn(msg, line...)
	default:
		f.total++
		f.unlogged++
		if now.Sub(f.lastLine) < r.every {
			return
		}
		line := append(r.fields(event, text, attrs), "repeated", f.unlogged, "failingFor", now.Sub(f.since).Round(time.Millisecond).String())
		f.lastLine, f.unlogged = now, 0
		r.log.Warn(msg, line...)
	}
}

// recovered ends event's failure, if it was failing: one INFO line, event
// failure_recovered, naming the event, how many times it failed and for how
// long.
func (r *repeatLog) recovered(event string) {
	r.mu.Lock()
	f := r.failing[event]
	delete(r.failing, event)
	r.mu.Unlock()
	if f == nil {
		return
	}
	r.log.Info("recovered: "+f.msg, "event", "failure_recovered", "failedEvent", event,
		"failures", f.total, "failingFor", r.now().Sub(f.since).Round(time.Millisecond).String(), "lastError", f.err)
}

func (r *repeatLog) fields(event, text string, attrs []any) []any {
	fields := make([]any, 0, len(attrs)+4)
	fields = append(fields, "event", event)
	fields = append(fields, attrs...)
	return append(fields, "error", text)
}
