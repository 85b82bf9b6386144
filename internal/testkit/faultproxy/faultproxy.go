// Package faultproxy is a TCP proxy that a test, or a demonstration, puts
// between a client and its server to break the path on purpose: cut every
// connection, refuse new ones, hold the bytes in flight, black-hole the server,
// or lose one request or its answer. It is the TCP fault proxy of the test kit
// (internal/testkit); it has no testing dependency, so that pgcluster's
// standby relay, which lockdemo also runs, is this same code.
package faultproxy

import (
	"bytes"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// DialTimeout bounds the proxy's connection to its target.
const DialTimeout = 2 * time.Second

// Mode is what the proxy does with connections and the bytes they carry.
type Mode int

const (
	// Forward relays every connection and its bytes (the mode a proxy starts in).
	Forward Mode = iota
	// Hold accepts and relays connections but keeps every chunk read in the
	// proxy, in both directions, until the mode changes: nothing is closed, so
	// Forward delivers what was held; Cut or Down discards it.
	Hold
	// Down closes every connection and refuses new ones: the target is out of
	// reach.
	Down
	// Stall closes every relayed connection and accepts new ones without ever
	// answering them: the target hangs (a black-holed host, a stuck server).
	// Leaving Stall closes the connections it kept open.
	Stall
)

// Fault is a one-shot fault armed by Arm: the next chunk towards the target
// that contains Match triggers it. The client's side of that connection is
// closed; with Deliver, the chunk then goes on to the target (after Delay, and
// once Release is closed when it is set) and the target's answer is lost,
// otherwise the chunk is dropped. At the fault the proxy enters Then for every
// other connection (Forward: no change).
type Fault struct {
	Match   []byte
	Deliver bool
	Delay   time.Duration
	Release <-chan struct{}
	Then    Mode
}

// pair is one relayed connection: the client's side and the target's.
type pair struct {
	client, target net.Conn
	dead           bool // closed; its pipes end
}

// Proxy is a TCP proxy on a loopback port to one target address.
type Proxy struct {
	ln     net.Listener
	target string
	done   chan struct{} // closed by Close

	mu     sync.Mutex
	cond   *sync.Cond // signalled on every change of mode and on every closed pair
	mode   Mode
	closed bool
	pairs  map[*pair]struct{}
	silent map[net.Conn]struct{} // connections accepted while stalled
	fault  *Fault
	wg     sync.WaitGroup
}

// New listens on a free loopback port and relays what it accepts to target
// (host:port). Close stops it.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, done: make(chan struct{}), pairs: map[*pair]struct{}{}, silent: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Forward makes the proxy relay again: held bytes are delivered, connections
// kept open by Stall are closed, new connections are relayed.
func (p *Proxy) Forward() { p.set(Forward, nil) }

// Hold keeps every chunk in the proxy until Forward (see Hold).
func (p *Proxy) Hold() { p.set(Hold, nil) }

// Down closes every connection and refuses new ones until Forward.
func (p *Proxy) Down() { p.set(Down, nil) }

// Stall makes the target hang until Forward (see Stall).
func (p *Proxy) Stall() { p.set(Stall, nil) }

// Cut closes every connection, discarding held bytes; the mode stays.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutLocked(nil)
}

// Arm arms f, replacing a fault armed before and not yet triggered.
func (p *Proxy) Arm(f Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault = &f
}

// Close stops listening, closes every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.done)
	}
	p.cutLocked(nil)
	p.closeSilentLocked()
	p.mu.Unlock()
	p.wg.Wait()
}

// set enters mode m; except (the connection of a fault) is spared its cut.
func (p *Proxy) set(m Mode, except *pair) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = m
	switch m {
	case Forward:
		p.closeSilentLocked()
	case Down:
		p.cutLocked(except)
		p.closeSilentLocked()
	case Stall:
		p.cutLocked(except)
	}
	p.cond.Broadcast()
}

func (p *Proxy) cutLocked(except *pair) {
	for pr := range p.pairs {
		if pr != except {
			p.dropLocked(pr)
		}
	}
}

func (p *Proxy) closeSilentLocked() {
	for c := range p.silent {
		_ = c.Close()
	}
	clear(p.silent)
}

func (p *Proxy) dropLocked(pr *pair) {
	if pr.dead {
		return
	}
	pr.dead = true
	_ = pr.client.Close()
	_ = pr.target.Close()
	delete(p.pairs, pr)
	p.cond.Broadcast()
}

func (p *Proxy) drop(pr *pair) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropLocked(pr)
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.admit(c) {
			continue
		}
		t, err := net.DialTimeout("tcp", p.target, DialTimeout)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = t.Close()
			return
		}
		if p.mode == Down || p.mode == Stall { // entered while the target was dialled
			_ = t.Close()
			p.mu.Unlock()
			if p.admit(c) {
				_ = c.Close()
			}
			continue
		}
		pr := &pair{client: c, target: t}
		p.pairs[pr] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(pr, true)
		go p.pipe(pr, false)
	}
}

// admit says whether c is to be relayed: Down closes it, Stall keeps it silent.
func (p *Proxy) admit(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed || p.mode == Down:
		_ = c.Close()
		return false
	case p.mode == Stall:
		p.silent[c] = struct{}{}
		return false
	}
	return true
}

// pipe copies one direction of pr, chunk by chunk, as the mode allows.
func (p *Proxy) pipe(pr *pair, up bool) {
	defer p.wg.Done()
	defer p.drop(pr)
	src, dst := pr.client, pr.target
	if !up {
		src, dst = dst, src
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			p.mu.Lock()
			var f *Fault
			if up && p.fault != nil && bytes.Contains(chunk, p.fault.Match) {
				f, p.fault = p.fault, nil
			}
			for f == nil && p.mode == Hold && !pr.dead {
				p.cond.Wait()
			}
			dead := pr.dead
			p.mu.Unlock()
			if dead {
				return
			}
			if f != nil {
				p.inject(pr, f, chunk)
				return
			}
			if _, werr := dst.Write(chunk); werr != nil {
				return
			}
		}
		if err != nil { // EOF or a closed connection: the deferred drop ends both sides
			return
		}
	}
}

// inject carries out fault f on pr, whose chunk towards the target triggered it.
func (p *Proxy) inject(pr *pair, f *Fault, chunk []byte) {
	if f.Then != Forward {
		p.set(f.Then, pr)
	}
	// The client's side goes first, so the target's answer has nowhere to go.
	_ = pr.client.Close()
	if !f.Deliver {
		return
	}
	if f.Delay > 0 {
		select {
		case <-time.After(f.Delay):
		case <-p.done:
			return
		}
	}
	if f.Release != nil {
		select {
		case <-f.Release:
		case <-p.done:
			return
		}
	}
	if _, err := pr.target.Write(chunk); err != nil {
		return
	}
	// The target's side stays open until its answer has come back (and found
	// the client gone, which ends the other direction) or the target closed it:
	// the chunk was processed.
	p.mu.Lock()
	for !pr.dead {
		p.cond.Wait()
	}
	p.mu.Unlock()
}

// String names the mode.
func (m Mode) String() string {
	switch m {
	case Forward:
		return "forward"
	case Hold:
		return "hold"
	case Down:
		return "down"
	case Stall:
		return "stall"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}
