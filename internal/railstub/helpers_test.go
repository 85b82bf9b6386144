package railstub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"lock.dev/internal/fastserve"
	"lock.dev/internal/identity"
	"lock.dev/internal/logcapture"
	"lock.dev/lockapi"
)

// testStub is a stub served by a real HTTP server on a loopback port 0.
type testStub struct {
	*Stub
	URL    string
	Client *Client
	logs   *syncBuffer
}

func startStub(t *testing.T, mutate func(*Config)) *testStub {
	t.Helper()
	cfg := DefaultConfig()
	// about the rail double, not identity (docs/contracts/workload-identity.md);
	// identity_test.go serves the stub over mutual TLS.
	cfg.Identity = unsafeNoAuth()
	seed := int64(1)
	cfg.Seed = &seed
	logs := &syncBuffer{}
	cfg.LogOutput = logs
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	// Served by the server the binary runs (fastserve.ServeFast's). Every exchange
	// with the stub is checked against api/rail-stub.json, and its findings fail
	// t: Track's cleanup runs after the one below, which closes the server once
	// every request has been answered.
	h := conformance.Handler(s.Handler())
	if cfg.Protocol == ProtocolISO20022 {
		h = outsideDocument(s.Handler(), h)
	}
	url, shutdown := serveFast(t, h, s)
	conformance.Track(t, url)
	t.Cleanup(func() {
		if err := shutdown(); err != nil {
			t.Error(err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return &testStub{Stub: s, URL: url, Client: NewClient(url), logs: logs}
}

// serveFast serves h on a loopback port with the server the binary runs
// (fastserve.NewFastServer). shutdown stops it once every request has been
// answered and reports what went wrong, if anything.
func serveFast(tb testing.TB, h http.Handler, s *Stub) (url string, shutdown func() error) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := fastserve.NewFastServer(h, s.logger)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() error {
		if err := srv.Shutdown(); err != nil {
			return fmt.Errorf("server shutdown: %w", err)
		}
		if err := <-served; err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		return nil
	}
}

type syncBuffer struct{ logcapture.Buffer }

// events returns the log lines whose event is name.
func (b *syncBuffer) events(t *testing.T, name string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(b.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if m["event"] == name {
			out = append(out, m)
		}
	}
	return out
}

func payment(ref string) PaymentRequest {
	return PaymentRequest{Reference: ref, AccountID: "acct-7", AmountMinor: 125000, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}
}

// reply is one raw answer of the stub.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// send posts a raw body with the given content type; a transport error (a dropped
// connection) is returned as is.
func send(ctx context.Context, hc *http.Client, url, method, path, contentType string, body []byte) (reply, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url+path, rd)
	if err != nil {
		return reply{}, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, err
}

func mustJSON(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func pay(t *testing.T, ts *testStub, p PaymentRequest) reply {
	t.Helper()
	r, err := send(t.Context(), &http.Client{Timeout: 10 * time.Second}, ts.URL, http.MethodPost, "/rail/v1/payments", "application/json", mustJSON(t, p))
	if err != nil {
		t.Fatalf("pay: %v", err)
	}
	return r
}

func calls(t *testing.T, ts *testStub) []Call {
	t.Helper()
	cs, err := ts.Client.Calls(t.Context())
	if err != nil {
		t.Fatalf("Calls: %v", err)
	}
	return cs
}

// isDropped reports whether err is what a caller sees when the connection was
// closed without a reply: EOF or a reset, not a status and not a timeout.
func isDropped(err error) bool {
	if err == nil {
		return false
	}
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// problem decodes a problem+json reply and checks its status and code.
func problem(t *testing.T, r reply, status int, code string) *lockapi.Problem {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body %s", r.status, status, r.body)
	}
	resp := &http.Response{StatusCode: r.status, Header: r.header}
	p := lockapi.ReadProblem(resp, r.body)
	if p == nil {
		t.Fatalf("not a problem+json answer: %s %s", r.header.Get("Content-Type"), r.body)
	}
	if p.Code != code || p.Status != status {
		t.Fatalf("problem = %d %s, want %d %s", p.Status, p.Code, status, code)
	}
	return p
}

func fields(t *testing.T, p *lockapi.Problem) []string {
	t.Helper()
	var errs []lockapi.FieldError
	if _, err := p.Member("errors", &errs); err != nil {
		t.Fatalf("errors member: %v", err)
	}
	var out []string
	for _, e := range errs {
		out = append(out, e.Field)
	}
	return out
}

// unsafeNoAuth is the identity settings of a test about something else than
// identity (docs/contracts/workload-identity.md): Run serves plaintext.
func unsafeNoAuth() identity.Settings { return identity.Settings{UnsafeNoAuth: true} }
