package railproxy

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"
)

// A panic in the admission or resolution worker (group.go) must not take the
// queue down with it: the members in the worker's hands are answered as their
// facts say, the worker carries on (or is replaced), and the death is logged at
// ERROR (worker_panicked) and counted (rail_proxy_worker_panic_total{worker}).
// docs/contracts/rail-proxy.md, "A worker that panics".

// The values of rail_proxy_worker_panic_total{worker}: a closed set.
const (
	workerAdmission  = "admission"
	workerResolution = "resolution"
)

var workerNames = []string{workerAdmission, workerResolution}

// errWorkerPanicked is what a member whose worker panicked is answered with.
var errWorkerPanicked = errors.New("the worker carrying it panicked")

// hooks are seams for this package's tests, set through Config.hooks and nil in
// production: each runs at one point of the resolution and worker paths so that
// a test can make something happen exactly there (a COMMIT land, a panic).
type hooks struct {
	// afterNoRow runs when a resolving write's lookup found no row for res.
	afterNoRow func(res resolution)
	// admitGroup runs in the admission worker before a group's transaction;
	// admitted after it, with its results.
	admitGroup func(subs []Submission)
	admitted   func(subs []Submission, res []MemberResult)
	// resolveGroup runs in the resolution worker before a group's statement.
	resolveGroup func(res []resolution)
	// unsentAnswerBound, when not zero, replaces unsentAnswerBound, so that a
	// test of the lost COMMIT answer does not depend on how loaded the machine
	// running it is.
	unsentAnswerBound time.Duration
}

// panicked logs and counts a worker's panic; it returns the error its members
// are answered with.
func (a *admitter) panicked(worker string, p any, members int, more ...any) error {
	a.metrics.workerPanics.WithLabelValues(worker).Inc()
	a.logger.Error("a rail-proxy worker panicked; its members are answered as their facts say and the worker carries on",
		append([]any{"event", "worker_panicked", "worker", worker, "members", members, "panic", fmt.Sprint(p),
			"stack", string(debug.Stack())}, more...)...)
	return fmt.Errorf("%w: %v", errWorkerPanicked, p)
}

// admitGroupGuarded runs one group's admission transaction for the admission
// worker. A panic is answered member by member from what is known:
//
//   - the transaction had returned its results (the panic came after): each
//     member gets its own, committed or not — its facts;
//   - nothing was sent yet, or the connection is still inside the
//     transaction, not committed (it is then destroyed on release, so the
//     server rolls the transaction back): every member is answered 503 stage
//     intent_commit, nothing written;
//   - anything else (the connection idle or mid-message): a COMMIT may have
//     been sent, so every member is answered 503 as for a COMMIT whose answer
//     was lost (nothing presented; the rows, if any, are the janitor's).
func (a *admitter) admitGroupGuarded(ctx context.Context, conn dbConn, subs []Submission) (res []MemberResult, fellBack error) {
	sent := false // whether anything of the transaction may have been sent
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		if len(res) == len(subs) {
			_ = a.panicked(workerAdmission, p, len(subs), "committed", "answered")
			return
		}
		fellBack = nil
		pc := conn.c.Conn().PgConn()
		var ce CommitError
		if st := pc.TxStatus(); sent && (pc.IsBusy() || pc.IsClosed() || st != 'T' && st != 'E') {
			payouts := make([]string, len(subs))
			for i, s := range subs {
				payouts[i] = s.PayoutID
			}
			ce = CommitError{Err: a.panicked(workerAdmission, p, len(subs), "committed", "unknown", "payoutIds", payouts),
				Unsure: true, Intent: true, BackendPID: pc.PID()}
		} else {
			ce = CommitError{Err: a.panicked(workerAdmission, p, len(subs), "committed", "no")}
		}
		res = make([]MemberResult, len(subs))
		for i := range res {
			e := ce
			res[i] = MemberResult{Err: &e}
		}
	}()
	if a.hooks != nil && a.hooks.admitGroup != nil {
		a.hooks.admitGroup(subs)
	}
	sent = true
	res, fellBack = a.store.admitGroupConn(ctx, conn, subs, a.fencing, a.books, a.interruptAfter)
	if a.hooks != nil && a.hooks.admitted != nil {
		a.hooks.admitted(subs, res)
	}
	return res, fellBack
}

// resolveGroupGuarded makes one group's resolving writes for the resolution
// worker. After a panic nothing is known of the statement: every member is
// answered with an error, so that its writer tries again (resolveLater), and
// finds the row as it is — resolved by this very statement if it committed
// (resolvedByUs), else still to be written.
func (a *admitter) resolveGroupGuarded(ctx context.Context, res []resolution) (wrote []bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = a.panicked(workerResolution, p, len(res))
			wrote = make([]bool, len(res))
		}
	}()
	if a.hooks != nil && a.hooks.resolveGroup != nil {
		a.hooks.resolveGroup(res)
	}
	return a.store.ResolveGroup(ctx, res)
}

// replaceWorker, deferred by the admission and the resolution worker, replaces
// a worker that a panic outside admitGroupGuarded or resolveGroupGuarded ends:
// it is logged and counted, and another worker is started when work is queued,
// so that no later admission or resolving write waits for a worker that is gone.
func (a *admitter) replaceWorker(worker string) {
	p := recover()
	if p == nil {
		return
	}
	_ = a.panicked(worker, p, 0)
	g := a.groups
	g.mu.Lock()
	defer g.mu.Unlock()
	running, queued, workers, start := &g.admitRunning, len(g.admits), admitWorkers, a.admitWorker
	if worker == workerResolution {
		running, queued, workers, start = &g.resolveRunning, len(g.resolves), resolveWorkers, a.resolveWorker
	}
	*running--
	if queued > 0 && *running < workers {
		*running++
		go start()
	}
}
