package railproxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Group admission and group resolution (docs/contracts/rail-proxy.md, "Group
// admission"; admission.go lists the steps and both places the fence is compared).
// Submissions waiting at the same moment share one admission transaction — one
// round trip, one commit, one WAL flush — and resolving writes ready at the same
// moment share one statement. First come, first served, and no timer: a worker that
// gets a paydb connection takes whatever is queued (at most RAIL_PROXY_MAX_GROUP),
// so at low load a group is one submission and nothing waits for company. Groups
// only grow while every worker is busy, which is when sharing pays.
//
// Workers are goroutines started when work is queued and fewer than the bound
// run; each ends when it finds the queue empty. So there is nothing to start or
// stop with the process, and the drain's wait for submissions in flight covers
// them: every queued submission is answered by a worker.

// DefaultMaxGroup is RAIL_PROXY_MAX_GROUP's default (docs/contracts/configuration.md).
const DefaultMaxGroup = 64

// MaxMaxGroup is a sanity bound on RAIL_PROXY_MAX_GROUP.
const MaxMaxGroup = 1000

// admitWorkers is how many admission transactions one replica runs at once:
// one. While it runs, the submissions that arrive queue and form the next group,
// so the group is as large as the load makes it and paydb pays one transaction,
// one commit and one WAL flush per group. A second worker halves the groups,
// costs paydb CPU per submission and buys no throughput
// (docs/contracts/rail-proxy.md, "Group admission").
const admitWorkers = 1

// resolveWorkers is the same for resolving writes: one statement at a time, the
// writes that come meanwhile forming the next.
const resolveWorkers = 1

// queued is one piece of work waiting in a queue: item, to be done by
// deadline, its result sent on done (capacity 1).
type queued[T, R any] struct {
	item     T
	deadline time.Time
	done     chan R
}

// admitWait is one submission queued for admission.
type admitWait = queued[Submission, MemberResult]

// resolveWait is one resolving write queued.
type resolveWait = queued[resolution, resolveResult]

type resolveResult struct {
	wrote bool
	err   error
}

// groups is the admitter's two queues and their workers.
type groups struct {
	maxGroup int // RAIL_PROXY_MAX_GROUP; 1 = one by one, the pinned statements verbatim

	mu             sync.Mutex
	admits         []*admitWait
	admitRunning   int // admission workers running (at most admitWorkers)
	resolves       []*resolveWait
	resolveRunning int // resolution workers running (at most resolveWorkers)

	// The members a group left Alone are admitted one by one by their own
	// goroutines (admitAlone): one at a time per account, since they would wait
	// for the same row anyway, and at most aloneSlots at once, so that members
	// waiting for rows other transactions hold never take the connections the
	// workers need.
	aloneGates map[string]*aloneGate
	aloneSlots chan struct{} // made at first use, from the pool's size
}

// aloneGate lets one Alone admission of an account run at a time.
type aloneGate struct {
	turn  chan struct{} // capacity 1: held while the account's Alone admission runs
	users int           // goroutines holding or waiting for turn, under groups.mu
}

func newGroups(maxGroup int) *groups {
	return &groups{maxGroup: max(1, maxGroup)}
}

// grouped reports whether submissions are admitted in groups.
func (a *admitter) grouped() bool { return a.groups != nil && a.groups.maxGroup > 1 }

// admit runs steps 1–3 for sub, bounded by ctx's deadline (the admission bound):
// alone with RAIL_PROXY_MAX_GROUP=1, else in whatever group forms.
func (a *admitter) admit(ctx context.Context, sub Submission) (Admission, error) {
	if !a.grouped() {
		a.metrics.groupSize.Observe(1)
		return a.store.Admit(ctx, sub, a.fencing, a.books, a.interruptAfter)
	}
	g := a.groups
	w := &admitWait{item: sub, deadline: deadlineOr(ctx, AdmissionBound), done: make(chan MemberResult, 1)}
	if enqueue(g, &g.admits, w, &g.admitRunning, admitWorkers) {
		go a.admitWorker()
	}
	// The member waits for its group's truth whatever happens to its caller: once
	// its group runs, its row may be committed.
	r := <-w.done
	if r.Alone {
		// Its group did not decide it and wrote nothing for it (its account's
		// mark row was held by another transaction, or the group's statement
		// failed before COMMIT): it is admitted on its own, within what is left
		// of its own bound.
		return a.admitAlone(ctx, sub)
	}
	return r.Admission, r.Err
}

// deadlineOr is ctx's deadline, or d from now when ctx has none.
func deadlineOr(ctx context.Context, d time.Duration) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return time.Now().Add(d)
}

// enqueue appends w to the queue q under g.mu and says whether the caller is to
// start a worker for it: fewer than workers run (*running counts them, and is
// counted up here for the worker to be started).
func enqueue[W any](g *groups, q *[]*W, w *W, running *int, workers int) (start bool) {
	g.mu.Lock()
	*q = append(*q, w)
	if start = *running < workers; start {
		*running++
	}
	g.mu.Unlock()
	return start
}

// admitAlone admits sub one by one (the pinned statements, Store.Admit), which
// waits for its own account's mark row only, within ctx — the submission's own
// admission bound.
func (a *admitter) admitAlone(ctx context.Context, sub Submission) (Admission, error) {
	leave, err := a.groups.enterAlone(ctx, sub.AccountID, max(1, a.store.maxConns()-admitWorkers-resolveWorkers))
	if err != nil {
		return Admission{}, &CommitError{Err: fmt.Errorf("waiting for its turn to be admitted alone: %w", err)}
	}
	defer leave()
	return a.store.Admit(ctx, sub, a.fencing, a.books, a.interruptAfter)
}

// enterAlone waits, within ctx, for account's turn and a free slot among
// slots; leave gives both back.
func (g *groups) enterAlone(ctx context.Context, account string, slots int) (leave func(), err error) {
	g.mu.Lock()
	if g.aloneSlots == nil {
		g.aloneSlots = make(chan struct{}, slots)
	}
	if g.aloneGates == nil {
		g.aloneGates = map[string]*aloneGate{}
	}
	gate := g.aloneGates[account]
	if gate == nil {
		gate = &aloneGate{turn: make(chan struct{}, 1)}
		g.aloneGates[account] = gate
	}
	gate.users++
	free := g.aloneSlots
	g.mu.Unlock()
	done := func() {
		g.mu.Lock()
		if gate.users--; gate.users == 0 {
			delete(g.aloneGates, account)
		}
		g.mu.Unlock()
	}
	select {
	case gate.turn <- struct{}{}:
	case <-ctx.Done():
		done()
		return nil, ctx.Err()
	}
	select {
	case free <- struct{}{}:
	case <-ctx.Done():
		<-gate.turn
		done()
		return nil, ctx.Err()
	}
	return func() {
		<-free
		<-gate.turn
		done()
	}, nil
}

// admitWorker admits groups until the queue is empty. It takes a connection
// first and forms the group once it has one: everything that queued meanwhile
// rides along.
func (a *admitter) admitWorker() {
	defer a.replaceWorker(workerAdmission) // worker.go
	g := a.groups
	for {
		g.mu.Lock()
		if len(g.admits) == 0 {
			g.admitRunning--
			g.mu.Unlock()
			return
		}
		head := g.admits[0].deadline
		g.mu.Unlock()

		cctx, cancel := context.WithDeadline(context.Background(), head)
		conn, err := a.store.acquire(cctx)
		cancel()
		if err != nil {
			// No connection before the oldest member's bound: it, and every member
			// as old, answers 503 (nothing written); the others wait on.
			a.expireAdmits(head, fmt.Errorf("waiting for a paydb connection: %w", err))
			continue
		}
		group, expired := g.takeAdmits(time.Now())
		answerExpired(expired)
		if len(group) == 0 {
			conn.release()
			continue
		}
		subs, dl := items(group)
		a.metrics.groupSize.Observe(float64(len(group)))
		// The group runs within its earliest member's bound, which no member may
		// outlive. Its statement never waits for a row another transaction holds;
		// should the bound run out before COMMIT all the same, nothing was
		// written and each member is admitted alone within its own bound.
		gctx, cancel := context.WithDeadline(context.Background(), dl)
		res, fellBack := a.admitGroupGuarded(gctx, conn, subs) // worker.go: a panic answers the members
		cancel()
		conn.release()
		if fellBack != nil {
			a.logger.Warn("group admission statement failed before COMMIT; its members are admitted one by one", "event", "admission_group_fallback",
				"groupSize", len(group), "error", fellBack.Error())
		}
		for i, w := range group {
			w.done <- res[i]
		}
	}
}

// takeAdmits takes the next group: at most maxGroup members whose bound has not
// passed, in arrival order; those whose bound has passed are returned apart.
func (g *groups) takeAdmits(now time.Time) (group, expired []*admitWait) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return take(&g.admits, g.maxGroup, now)
}

// take takes from the queue q the next group: at most maxGroup members whose
// deadline is after now, in arrival order; those whose deadline has passed are
// returned apart. The caller holds groups.mu.
func take[T, R any](q *[]*queued[T, R], maxGroup int, now time.Time) (group, expired []*queued[T, R]) {
	i := 0
	for ; i < len(*q) && len(group) < maxGroup; i++ {
		w := (*q)[i]
		if !now.Before(w.deadline) {
			expired = append(expired, w)
			continue
		}
		group = append(group, w)
	}
	*q = dropFront(*q, i)
	return group, expired
}

// items returns the items of a group, in its order, and its earliest deadline.
func items[T, R any](group []*queued[T, R]) ([]T, time.Time) {
	dl := group[0].deadline
	out := make([]T, len(group))
	for i, w := range group {
		out[i] = w.item
		if w.deadline.Before(dl) {
			dl = w.deadline
		}
	}
	return out, dl
}

// expireAdmits answers, with err, every queued member whose deadline is not
// after dl.
func (a *admitter) expireAdmits(dl time.Time, err error) {
	g := a.groups
	g.mu.Lock()
	var expired []*admitWait
	kept := g.admits[:0]
	for _, w := range g.admits {
		if w.deadline.After(dl) {
			kept = append(kept, w)
		} else {
			expired = append(expired, w)
		}
	}
	clear(g.admits[len(kept):])
	g.admits = kept
	g.mu.Unlock()
	for _, w := range expired {
		w.done <- MemberResult{Err: &CommitError{Err: err}}
	}
}

func answerExpired(expired []*admitWait) {
	for _, w := range expired {
		w.done <- MemberResult{Err: &CommitError{Err: fmt.Errorf("waiting for a paydb connection: %w", context.DeadlineExceeded)}}
	}
}

// dropFront removes the first n elements of q, reusing its array when it empties.
func dropFront[T any](q []*T, n int) []*T {
	if n == len(q) {
		clear(q)
		return q[:0]
	}
	clear(q[:n])
	return q[n:]
}

// resolve makes one resolving write, bounded by ctx's deadline: alone with
// RAIL_PROXY_MAX_GROUP=1 (the pinned statement), else in whatever group forms.
func (a *admitter) resolve(ctx context.Context, res resolution) (bool, error) {
	if !a.grouped() {
		a.metrics.resolveGroupSize.Observe(1)
		return a.store.Resolve(ctx, res.id, res.outcome, res.railRef, res.reason)
	}
	g := a.groups
	w := &resolveWait{item: res, deadline: deadlineOr(ctx, ResolveBound), done: make(chan resolveResult, 1)}
	if enqueue(g, &g.resolves, w, &g.resolveRunning, resolveWorkers) {
		go a.resolveWorker()
	}
	r := <-w.done
	return r.wrote, r.err
}

// resolveWorker makes the queued resolving writes, a group per statement, until
// the queue is empty.
func (a *admitter) resolveWorker() {
	defer a.replaceWorker(workerResolution) // worker.go
	g := a.groups
	for {
		g.mu.Lock()
		group, expired := take(&g.resolves, g.maxGroup, time.Now())
		if len(group) == 0 && len(expired) == 0 {
			g.resolveRunning--
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		for _, w := range expired {
			w.done <- resolveResult{err: fmt.Errorf("resolving submission %d: %w", w.item.id, context.DeadlineExceeded)}
		}
		if len(group) == 0 {
			continue
		}
		res, dl := items(group)
		a.metrics.resolveGroupSize.Observe(float64(len(group)))
		ctx, cancel := context.WithDeadline(context.Background(), dl)
		wrote, err := a.resolveGroupGuarded(ctx, res) // worker.go: a panic answers the members
		cancel()
		if err != nil && len(group) > 1 && !errors.Is(err, context.DeadlineExceeded) && memberCaused(err) {
			// One member's values refused: write them one by one.
			wrote, err = make([]bool, len(group)), nil
			for i, w := range group {
				cctx, cancel := context.WithDeadline(context.Background(), w.deadline)
				ok, rerr := a.store.Resolve(cctx, w.item.id, w.item.outcome, w.item.railRef, w.item.reason)
				cancel()
				wrote[i] = ok
				if rerr != nil {
					w.done <- resolveResult{wrote: ok, err: rerr}
					group[i] = nil
				}
			}
		}
		for i, w := range group {
			if w == nil {
				continue
			}
			r := resolveResult{err: err}
			if i < len(wrote) {
				r.wrote = wrote[i]
			}
			w.done <- r
		}
	}
}
