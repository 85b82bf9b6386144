package stack

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/identity"
	"lock.dev/internal/invariants"
)

// A tap is a reverse proxy in front of one service that records what clients
// were answered: every status (with its time, so a failover's report can count
// the 503s of a window) and, in front of lock-server, every token an acquire was
// answered with — the tokens clients were given, which the invariant checker
// compares with lock_grant (no token handed out twice, none the database does
// not hold). It changes nothing else: when the service cannot be reached, the
// tap drops the client's connection as the service would have, rather than
// answering a 502 of its own.
//
// With identities on (docs/contracts/workload-identity.md) every hop is mutual
// TLS and each service authorises its caller's SPIFFE ID, so a tap cannot simply
// relay bytes. It terminates TLS presenting the service's own SVID (a client
// expecting lock-server's ID gets it: the stack holds every workload's files),
// verifies the caller's certificate against the bundle, and calls the service as
// that caller: over mutual TLS with the client certificate of the caller's
// verified SPIFFE ID (the stack's certificate set has one per workload name),
// expecting the service's ID. The service thus sees the very workload the client
// is — its roles, its lease ownership and the grant's wid are judged as without
// the tap. A caller whose ID is not one of the stack's workloads is dropped (the
// tap cannot speak for it). A caller from another authority fails the tap's
// handshake, as it would fail the service's.

// taps are the stack's taps, by service.
type taps struct {
	stack   *Stack
	mu      sync.Mutex
	by      map[string]*tap
	issued  []invariants.IssuedToken
	answers []Answer
}

type tap struct {
	name string
	url  string
	srv  *http.Server
	done chan struct{}
}

// Answer is one answer a tap passed to a client.
type Answer struct {
	Service string
	Status  int
	At      time.Time
}

func startTaps(s *Stack, targets map[string]string) (*taps, error) {
	ts := &taps{by: map[string]*tap{}, stack: s}
	for name, target := range targets {
		if err := ts.start(name, target); err != nil {
			_ = ts.close()
			return nil, err
		}
	}
	return ts, nil
}

func (ts *taps) start(name, target string) error {
	u, err := url.Parse(target)
	if err != nil {
		return fmt.Errorf("stack: tap %s: %w", name, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("stack: tap %s listen: %w", name, err)
	}
	scheme := "http://"
	var transport http.RoundTripper
	if ts.stack.Secure() {
		src, err := ts.stack.Source(name)
		if err != nil {
			ln.Close()
			return fmt.Errorf("stack: tap %s: %w", name, err)
		}
		// tls.NewListener's *tls.Conn lets net/http set r.TLS, whose verified
		// certificate names the caller.
		ln = tls.NewListener(ln, src.ServerConfig())
		scheme = "https://"
		transport = asCaller{stack: ts.stack, service: name}
	} else {
		transport = ts.stack.transport("", name) // plaintext (UnsafeNoAuth)
	}
	rp := &httputil.ReverseProxy{
		Rewrite:        func(r *httputil.ProxyRequest) { r.SetURL(u) },
		Transport:      transport,
		ModifyResponse: func(resp *http.Response) error { return ts.record(name, resp) },
		// The client sees what it would have seen without the tap: a broken
		// connection, not a 502 a service never answers.
		ErrorHandler: func(http.ResponseWriter, *http.Request, error) { panic(http.ErrAbortHandler) },
	}
	var h http.Handler = rp
	if ts.stack.Secure() {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id, err := identity.PeerID(r)
			caller, ok := ts.stack.workloadOf(id)
			if err != nil || !ok {
				panic(http.ErrAbortHandler) // the tap cannot call the service as this caller
			}
			rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, caller)))
		})
	}
	t := &tap{name: name, url: scheme + ln.Addr().String(), done: make(chan struct{}),
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}}
	// The server's own log would print every aborted request; a tap has nothing to say.
	t.srv.ErrorLog = discardLog()
	go func() {
		defer close(t.done)
		_ = t.srv.Serve(ln)
	}()
	ts.mu.Lock()
	ts.by[name] = t
	ts.mu.Unlock()
	return nil
}

// record notes the answer, and the token of a granted acquire. The body is read
// whole and put back: a grant answer is small.
func (ts *taps) record(service string, resp *http.Response) error {
	a := Answer{Service: service, Status: resp.StatusCode, At: time.Now()}
	var issued *invariants.IssuedToken
	if service == "lock-server" && resp.StatusCode == http.StatusOK && resp.Request != nil &&
		resp.Request.Method == http.MethodPost && strings.HasSuffix(resp.Request.URL.Path, "/acquire") {
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
		if err != nil {
			return fmt.Errorf("stack: tap: read an acquire answer: %w", err)
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		var g struct {
			LockName string `json:"lockName"`
			OwnerID  string `json:"ownerId"`
			Token    int64  `json:"token"`
		}
		if err := json.Unmarshal(body, &g); err != nil {
			return fmt.Errorf("stack: tap: decode an acquire answer: %w", err)
		}
		issued = &invariants.IssuedToken{LockName: g.LockName, Token: g.Token, OwnerID: g.OwnerID, At: a.At}
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.answers = append(ts.answers, a)
	if issued != nil {
		issued.Seq = int64(len(ts.issued) + 1)
		ts.issued = append(ts.issued, *issued)
	}
	return nil
}

func (ts *taps) url(service string) string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.by[service].url
}

func (ts *taps) close() error {
	ts.mu.Lock()
	all := make([]*tap, 0, len(ts.by))
	for _, t := range ts.by {
		all = append(all, t)
	}
	ts.mu.Unlock()
	var errs []error
	for _, t := range all {
		if err := t.srv.Close(); err != nil {
			errs = append(errs, fmt.Errorf("tap %s: %w", t.name, err))
		}
		<-t.done
	}
	return errors.Join(errs...)
}

// IssuedTokens is every token lock-server answered an acquire with through the
// tap, in the order answered; nil without Options.Tap.
func (s *Stack) IssuedTokens() []invariants.IssuedToken {
	if s.taps == nil {
		return nil
	}
	s.taps.mu.Lock()
	defer s.taps.mu.Unlock()
	return append([]invariants.IssuedToken{}, s.taps.issued...)
}

// Answers is every answer the taps passed on at or after from and before to (a
// zero to: no end), in the order passed; nil without Options.Tap.
func (s *Stack) Answers(from, to time.Time) []Answer {
	if s.taps == nil {
		return nil
	}
	s.taps.mu.Lock()
	defer s.taps.mu.Unlock()
	var out []Answer
	for _, a := range s.taps.answers {
		if !a.At.Before(from) && (to.IsZero() || a.At.Before(to)) {
			out = append(out, a)
		}
	}
	return out
}

func discardLog() *log.Logger { return log.New(io.Discard, "", 0) }

// callerKey carries the verified caller's workload name from the tap's handler to
// its transport.
type callerKey struct{}

// asCaller calls service as the workload named in the request's context: with
// that workload's client certificate, expecting the service's ID.
type asCaller struct {
	stack   *Stack
	service string
}

func (a asCaller) RoundTrip(r *http.Request) (*http.Response, error) {
	caller, _ := r.Context().Value(callerKey{}).(string)
	if caller == "" {
		return nil, fmt.Errorf("stack: tap %s: no verified caller", a.service)
	}
	return a.stack.transport(caller, a.service).RoundTrip(r)
}

// workloadOf is the name of the stack's workload whose default SPIFFE ID is id.
func (s *Stack) workloadOf(id spiffeid.ID) (string, bool) {
	for _, n := range append(identity.DefaultNames(), s.opts.Workloads...) {
		if id.String() == identity.DefaultID(n) {
			return n, true
		}
	}
	return "", false
}
