package testkit_test

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/testkit"
	"lock.dev/internal/testkit/faultproxy"
)

// echoServer answers every line with "echo: " and the line, and sends what it
// received into got.
func echoServer(t *testing.T) (addr string, got <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	lines := make(chan string, 100)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					lines <- sc.Text()
					if _, err := io.WriteString(c, "echo: "+sc.Text()+"\n"); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), lines
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, bufio.NewReader(c)
}

func send(t *testing.T, c net.Conn, line string) {
	t.Helper()
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatal(err)
	}
}

func expect(t *testing.T, c net.Conn, r *bufio.Reader, want string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := r.ReadString('\n')
	if err != nil || got != want+"\n" {
		t.Fatalf("read %q %v, want %q", got, err, want)
	}
}

// expectSilence checks nothing arrives on c for a moment: the one fact a
// held or stalled path offers is that nothing comes.
func expectSilence(t *testing.T, c net.Conn, r *bufio.Reader) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if got, err := r.ReadString('\n'); err == nil || !isTimeout(err) {
		t.Fatalf("read %q %v, want nothing", got, err)
	}
	_ = c.SetReadDeadline(time.Time{})
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func expectClosed(t *testing.T, c net.Conn, r *bufio.Reader) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := r.ReadString('\n'); err == nil || isTimeout(err) {
		t.Fatalf("read %q %v, want the connection closed", got, err)
	}
}

// Forward relays; Hold keeps the bytes and Forward delivers them; Cut closes
// the connections; Down refuses new ones until Forward.
func TestFaultProxyForwardHoldCutDown(t *testing.T) {
	target, got := echoServer(t)
	p := testkit.FaultProxy(t, target)
	c, r := dial(t, p.Addr())
	send(t, c, "one")
	expect(t, c, r, "echo: one")
	<-got

	p.Hold()
	send(t, c, "two")
	expectSilence(t, c, r)
	select {
	case l := <-got:
		t.Fatalf("the target received %q while held", l)
	default:
	}
	p.Forward()
	expect(t, c, r, "echo: two")
	<-got

	p.Hold()
	send(t, c, "dropped")
	p.Cut()
	expectClosed(t, c, r)
	p.Forward()

	p.Down()
	c2, r2 := dial(t, p.Addr())
	expectClosed(t, c2, r2)
	p.Forward()
	c3, r3 := dial(t, p.Addr())
	send(t, c3, "three")
	expect(t, c3, r3, "echo: three")
	if l := <-got; l != "three" {
		t.Fatalf("the target received %q after the held line was cut, want three", l)
	}
}

// Stall closes the relayed connections and keeps new ones open and silent;
// Forward closes those and relays again.
func TestFaultProxyStall(t *testing.T) {
	target, _ := echoServer(t)
	p := testkit.FaultProxy(t, target)
	c, r := dial(t, p.Addr())
	// A round trip first: the proxy relays c before Stall is called (a dial
	// returns when the kernel accepts, before the proxy has taken the connection).
	send(t, c, "relayed")
	expect(t, c, r, "echo: relayed")
	p.Stall()
	expectClosed(t, c, r)
	c2, r2 := dial(t, p.Addr())
	send(t, c2, "hello")
	expectSilence(t, c2, r2)
	p.Forward()
	expectClosed(t, c2, r2)
	c3, r3 := dial(t, p.Addr())
	send(t, c3, "again")
	expect(t, c3, r3, "echo: again")
}

// An armed fault: without Deliver the matching chunk never reaches the target;
// with Deliver it does, after the client's side was closed, and after Release
// when set; Then changes the mode for the other connections.
func TestFaultProxyFaults(t *testing.T) {
	target, got := echoServer(t)
	p := testkit.FaultProxy(t, target)

	p.Arm(faultproxy.Fault{Match: []byte("COMMIT")})
	c, r := dial(t, p.Addr())
	send(t, c, "COMMIT lost")
	expectClosed(t, c, r)

	release := make(chan struct{})
	other, ro := dial(t, p.Addr())
	send(t, other, "other")
	expect(t, other, ro, "echo: other")
	if l := <-got; l != "other" {
		t.Fatalf("the target received %q, want other (the dropped COMMIT never arrives)", l)
	}
	p.Arm(faultproxy.Fault{Match: []byte("COMMIT"), Deliver: true, Release: release, Then: faultproxy.Down})
	c2, r2 := dial(t, p.Addr())
	send(t, c2, "COMMIT landed")
	expectClosed(t, c2, r2)
	expectClosed(t, other, ro) // Then: Down cut the other connection
	select {
	case l := <-got:
		t.Fatalf("the target received %q before the release", l)
	default:
	}
	close(release)
	if l := <-got; l != "COMMIT landed" {
		t.Fatalf("the target received %q", l)
	}
	c3, r3 := dial(t, p.Addr())
	expectClosed(t, c3, r3) // still Down
	p.Forward()
	c4, r4 := dial(t, p.Addr())
	send(t, c4, "after")
	expect(t, c4, r4, "echo: after")
	if !strings.HasPrefix(<-got, "after") {
		t.Fatal("the target did not receive the line after Forward")
	}
}
