// Package leasepause freezes a lease the way a stop-the-world pause of its
// holder would — no renewal, and a local deadline that stops running — and
// thaws it again. It is how this module's executor, demonstrations and tests
// manufacture a real stale holder: a process stopped between its last lease
// check and its next write (docs/contracts/lock-service.md).
//
// It is internal on purpose. lockclient takes a Pauser only through
// lockclient.WithPauser, whose parameter type is defined here, so no program
// outside this module can build one: a worker that uses the public client has
// no way to make its own leases outlive what it can vouch for.
//
// A Pauser holds no global state: each is made by New, handed to the clients
// whose leases it may pause, and reaches only the leases those clients
// acquired, until each ends. It imports only the standard library, so
// lockclient stays free of third-party code.
package leasepause

import "sync"

// Hooks are the freeze and thaw of one lease, supplied by lockclient when the
// lease is granted.
type Hooks struct {
	Freeze func()
	Thaw   func()
}

// Pauser reaches the leases (keyed by K, lockclient's *Lease) acquired by the
// clients it was given to.
type Pauser[K comparable] struct {
	mu     sync.Mutex
	leases map[K]Hooks
}

// New returns a Pauser that reaches no lease yet.
func New[K comparable]() *Pauser[K] {
	return &Pauser[K]{leases: map[K]Hooks{}}
}

// Attach makes lease k pausable until detach is called, which lockclient does
// when the lease ends. A nil Pauser attaches nothing.
func (p *Pauser[K]) Attach(k K, h Hooks) (detach func()) {
	if p == nil {
		return func() {}
	}
	p.mu.Lock()
	p.leases[k] = h
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		delete(p.leases, k)
		p.mu.Unlock()
	}
}

// Freeze freezes lease k and reports whether it reached it: false when k was
// not acquired through a client given this Pauser, or has ended (an ended
// lease has nothing to freeze).
func (p *Pauser[K]) Freeze(k K) bool { return p.call(k, func(h Hooks) func() { return h.Freeze }) }

// Thaw thaws lease k; false as for Freeze.
func (p *Pauser[K]) Thaw(k K) bool { return p.call(k, func(h Hooks) func() { return h.Thaw }) }

// call runs one hook outside p's mutex: the hook takes the lease's own lock,
// and a lease that ends takes p's mutex (detach) while holding its own, so
// holding both here could deadlock.
func (p *Pauser[K]) call(k K, pick func(Hooks) func()) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	h, ok := p.leases[k]
	p.mu.Unlock()
	if !ok {
		return false
	}
	if f := pick(h); f != nil {
		f()
	}
	return true
}
