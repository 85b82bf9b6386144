package fence

import (
	"sync"
	"sync/atomic"
)

// cache remembers verified grants, keyed by the exact grant string, with their
// claims. It is bounded: when full, a CLOCK sweep evicts an entry not read since
// the hand last passed it — a close approximation of least recently used that
// lets reads share a read lock (a hit only sets an atomic bit), so the cached
// path of concurrent submissions does not serialise on one mutex.
type cache struct {
	mu    sync.RWMutex
	index map[string]int // grant → slot
	slots []slot         // fixed size; the first n are in use
	n     int
	hand  int
}

type slot struct {
	grant  string
	claims Claims
	ref    atomic.Bool // read since the hand last passed
}

func newCache(max int) *cache {
	return &cache{index: make(map[string]int, max), slots: make([]slot, max)}
}

func (c *cache) get(g string) (Claims, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	i, ok := c.index[g]
	if !ok {
		return Claims{}, false
	}
	s := &c.slots[i]
	s.ref.Store(true)
	return s.claims, true
}

func (c *cache) put(g string, cl Claims) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.index[g]; ok {
		return // verified meanwhile by another request
	}
	if c.n < len(c.slots) {
		s := &c.slots[c.n]
		s.grant, s.claims = g, cl
		c.index[g] = c.n
		c.n++
		return
	}
	// Every full sweep clears every bit, so this ends within two rounds.
	for c.slots[c.hand].ref.Swap(false) {
		c.hand = (c.hand + 1) % len(c.slots)
	}
	s := &c.slots[c.hand]
	delete(c.index, s.grant)
	s.grant, s.claims = g, cl
	s.ref.Store(false)
	c.index[g] = c.hand
	c.hand = (c.hand + 1) % len(c.slots)
}

func (c *cache) len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.index)
}
