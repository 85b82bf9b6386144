package lockclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"lock.dev/internal/leasepause"
	"lock.dev/lockapi"
)

// Defaults of the options.
const (
	DefaultDriftMargin    = 0.10
	DefaultRequestTimeout = 5 * time.Second
	// maxDriftMargin leaves room for two renewals (every ttl/3) before the deadline.
	maxDriftMargin = 0.5
	// maxResponseBytes bounds what the client reads of any answer.
	maxResponseBytes = 1 << 20
)

// Client talks to one lock-server (or a load balancer in front of replicas).
type Client struct {
	base    string
	hc      *http.Client
	tls     *tls.Config
	drift   float64
	logger  *slog.Logger
	timeout time.Duration
	pauser  *leasepause.Pauser[*Lease]
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the HTTP client, for a caller that shares or tunes its
// transport. Its transport must not resend requests on its own (Go's does not
// resend a POST without an idempotency header, which this client never sends),
// should not follow redirects nor use a proxy from the environment (see New),
// and for a workload identity carries the mutual-TLS configuration itself:
// WithTLSConfig does not apply to it.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithTLSConfig calls lock-server over TLS with cfg. lock-server serves only
// mutual TLS between workload identities (docs/contracts/workload-identity.md):
// cfg presents the caller's X.509-SVID and accepts only the server whose SPIFFE
// ID it expects, as the configuration lock.dev/workload builds from the SVID
// files does. It applies to the client's own transport; with WithHTTPClient,
// configure that client instead. New refuses it with an http:// base URL, which
// would send every call in plaintext.
func WithTLSConfig(cfg *tls.Config) Option { return func(c *Client) { c.tls = cfg } }

// WithDriftMargin sets how much of each TTL the local deadline gives up to clock
// drift and scheduling (default 0.10; 0 ≤ fraction ≤ 0.5, else New fails).
func WithDriftMargin(fraction float64) Option { return func(c *Client) { c.drift = fraction } }

// WithLogger sets where the client logs renewal failures and lost leases
// (default: nowhere).
func WithLogger(l *slog.Logger) Option { return func(c *Client) { c.logger = l } }

// WithRequestTimeout bounds each HTTP call, renewals included (default 5 s;
// it must be positive, else New fails). A renewal is also cut short when the
// lease's local deadline passes.
func WithRequestTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithPauser lets p freeze and thaw the leases this client grants. It is for
// this module's tests and demonstrations only: p's type is internal, so from
// outside the module the only value it can be given is nil, which changes
// nothing.
func WithPauser(p *leasepause.Pauser[*Lease]) Option { return func(c *Client) { c.pauser = p } }

// New returns a client of the lock-server at baseURL, e.g.
// https://lock-server:8081: an http or https URL with a host, optionally a path
// prefix (a gateway's), and no query, fragment or user information. A URL
// without a scheme is refused with the one to use, rather than read as a path;
// so is an option out of its range.
func New(baseURL string, opts ...Option) (*Client, error) {
	base, err := parseBaseURL(baseURL)
	if err != nil {
		return nil, err
	}
	c := &Client{
		base:    base.String(),
		drift:   DefaultDriftMargin,
		timeout: DefaultRequestTimeout,
	}
	for _, o := range opts {
		o(c)
	}
	if c.drift < 0 || c.drift > maxDriftMargin || c.drift != c.drift {
		return nil, fmt.Errorf("lockclient: drift margin %v outside [0, %v]", c.drift, maxDriftMargin)
	}
	if c.timeout <= 0 {
		return nil, fmt.Errorf("lockclient: request timeout %v is not positive: every call must be bounded", c.timeout)
	}
	if c.tls != nil && c.hc != nil {
		// The configuration would be ignored, and the caller would believe its
		// calls are made over mutual TLS.
		return nil, errors.New("lockclient: WithTLSConfig does not apply to a client given WithHTTPClient; configure that client's transport instead")
	}
	if c.tls != nil && base.Scheme == "http" {
		return nil, fmt.Errorf("lockclient: base URL %q is http:// but a TLS configuration was given: use https://%s", baseURL, base.Host+base.Path)
	}
	if c.hc == nil {
		c.hc = &http.Client{
			Transport: newTransport(c.tls),
			// lock-server never redirects; following one would turn a POST into
			// a GET of something else.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// parseBaseURL checks New's base URL and returns it without trailing slashes.
func parseBaseURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, errors.New("lockclient: base URL is empty; use e.g. https://lock-server:8081")
	}
	if !strings.Contains(raw, "://") {
		// "lock-server:8081" parses as scheme "lock-server"; "127.0.0.1:8081" not
		// at all. Either way the caller left out the scheme.
		return nil, fmt.Errorf("lockclient: base URL %q has no scheme; use https://%s", raw, strings.TrimPrefix(raw, "//"))
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("lockclient: base URL %q: %w", raw, err)
	}
	shown := u.Redacted() // never echo a password
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("lockclient: base URL %q has scheme %q; use https:// (or http:// without identities)", shown, u.Scheme)
	case u.Hostname() == "":
		return nil, fmt.Errorf("lockclient: base URL %q has no host", shown)
	case u.User != nil:
		return nil, fmt.Errorf("lockclient: base URL %q carries user information; lock-server knows its callers by their mutual-TLS identity", shown)
	case u.RawQuery != "" || u.ForceQuery:
		return nil, fmt.Errorf("lockclient: base URL %q has a query; the client appends each call's own path and query", shown)
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return nil, fmt.Errorf("lockclient: base URL %q has a fragment", shown)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	return u, nil
}

// newTransport is Go's default transport without the environment's proxy: a
// proxy (HTTP_PROXY, HTTPS_PROXY) could retry an acquire on its own, and a
// second grant to the same owner hands out a token nobody learns. lock-server is
// addressed directly.
func newTransport(cfg *tls.Config) http.RoundTripper {
	t := &http.Transport{}
	if d, ok := http.DefaultTransport.(*http.Transport); ok {
		t = d.Clone()
	}
	t.Proxy = nil
	t.TLSClientConfig = cfg
	// Every lease renews on its own every ttl/3, so a worker holding many
	// leases sends that many calls at once. Go's default keeps 2 idle
	// connections per host: every call beyond those opens a new connection,
	// which over mutual TLS is a full handshake (certificate verification both
	// ways) per renewal. 64 keeps a worker's usual concurrent leases on warm
	// connections; idle ones still close after IdleConnTimeout.
	t.MaxIdleConnsPerHost = maxIdleConnsPerHost
	return t
}

// maxIdleConnsPerHost: see newTransport.
const maxIdleConnsPerHost = 64

// Acquire asks for name on behalf of ownerID for ttl (whole milliseconds; the
// server's bounds apply). It sends one request and never retries: a held lock
// (ErrHeld) is the caller's decision — Lock is the call that waits for it — and
// after ErrUnavailable the lock may or may not have been granted — if it was,
// nobody learned its token and it ends with its TTL.
//
// The lease renews itself every ttl/3 until Release, and outlives ctx (only ctx's
// values are kept). If the answer arrives after the local deadline already
// passed, the lease is returned with its context cancelled at once.
func (c *Client) Acquire(ctx context.Context, name, ownerID string, ttl time.Duration) (*Lease, error) {
	ttlMs := ttl.Milliseconds()
	sent := time.Now() // before the request: the server's lease starts later than this
	var dto lockapi.Lease
	if err := c.leaseCall(ctx, "acquire", name, ownerID, 0, ttlMs, &dto); err != nil {
		return nil, err
	}
	if dto.Token <= 0 || dto.LockName != name || dto.OwnerID != ownerID {
		return nil, &Error{Op: "acquire", Name: name, Code: lockapi.CodeInternal, Status: http.StatusOK,
			Err: fmt.Errorf("answer is not a grant of this lock to this owner: %+v", dto)}
	}
	return newLease(ctx, c, name, ownerID, dto, time.Duration(ttlMs)*time.Millisecond, sent), nil
}

// Get reads the state of a lock (ErrNotFound when it was never granted).
func (c *Client) Get(ctx context.Context, name string) (lockapi.LockState, error) {
	var st lockapi.LockState
	if err := validateName("get", name); err != nil {
		return st, err
	}
	err := c.do(ctx, "get", name, http.MethodGet, c.lockURL(name, ""), nil, nil, &st)
	return st, err
}

// Grants reads a lock's grant history, newest first; limit ≤ 0 means the
// server's default (100); the server allows at most 1000.
func (c *Client) Grants(ctx context.Context, name string, limit int) ([]lockapi.Grant, error) {
	if err := validateName("grants", name); err != nil {
		return nil, err
	}
	u := c.lockURL(name, "/grants")
	if limit > 0 {
		u += "?limit=" + strconv.Itoa(limit)
	}
	var gl lockapi.GrantList
	if err := c.do(ctx, "grants", name, http.MethodGet, u, nil, nil, &gl); err != nil {
		return nil, err
	}
	return gl.Grants, nil
}

func (c *Client) lockURL(name, suffix string) string {
	return c.base + "/v1/locks/" + url.PathEscape(name) + suffix
}

// leaseCall sends acquire (token 0), renew or release (ttlMs 0: no body).
func (c *Client) leaseCall(ctx context.Context, op, name, owner string, token, ttlMs int64, out any) error {
	if err := validateName(op, name); err != nil {
		return err
	}
	if err := lockapi.ValidateOwnerID(owner); err != nil {
		return &Error{Op: op, Name: name, Code: lockapi.CodeInvalidRequest, Err: fmt.Errorf("owner id: %w", err)}
	}
	h := http.Header{}
	h.Set(lockapi.HeaderOwnerID, owner)
	if token > 0 {
		h.Set(lockapi.HeaderFencingToken, strconv.FormatInt(token, 10))
	}
	var body []byte
	if op != "release" {
		body, _ = json.Marshal(lockapi.LeaseRequest{TTLMs: ttlMs})
		h.Set("Content-Type", "application/json")
	}
	return c.do(ctx, op, name, http.MethodPost, c.lockURL(name, "/"+op), h, body, out)
}

func validateName(op, name string) error {
	err := lockapi.ValidateLockName(name)
	if err == nil && (name == "." || name == "..") {
		// Valid characters, but no URL path can carry them as a segment.
		err = errors.New("cannot be . or .. (not addressable as a URL path segment)")
	}
	if err != nil {
		return &Error{Op: op, Name: name, Code: lockapi.CodeInvalidRequest, Err: fmt.Errorf("lock name: %w", err)}
	}
	return nil
}

// do sends one request, bounded by the client's timeout, and decodes a 2xx answer
// into out. Every failure is an *Error.
func (c *Client) do(ctx context.Context, op, name, method, u string, h http.Header, body []byte, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("lockclient: %s %s: %w", op, name, err)
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	req.Header.Set("Accept", "application/json, application/problem+json")
	resp, err := c.hc.Do(req)
	if err != nil {
		// No answer: the server may or may not have acted.
		return &Error{Op: op, Name: name, Code: lockapi.CodeUnavailable, Err: err}
	}
	defer resp.Body.Close()
	b, err := lockapi.ReadAllLimited(resp.Body, maxResponseBytes)
	if err != nil {
		return &Error{Op: op, Name: name, Code: lockapi.CodeUnavailable, Status: resp.StatusCode, Err: fmt.Errorf("reading answer: %w", err)}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if out == nil || resp.StatusCode == http.StatusNoContent {
			return nil
		}
		if err := json.Unmarshal(b, out); err != nil {
			return &Error{Op: op, Name: name, Code: lockapi.CodeInternal, Status: resp.StatusCode, Err: fmt.Errorf("decoding answer: %w", err)}
		}
		return nil
	}
	e := &Error{Op: op, Name: name, Status: resp.StatusCode, Problem: lockapi.ReadProblem(resp, b)}
	switch {
	case e.Problem != nil:
		e.Code = e.Problem.Code
	case resp.StatusCode == http.StatusBadGateway, resp.StatusCode == http.StatusServiceUnavailable,
		resp.StatusCode == http.StatusGatewayTimeout:
		e.Code = lockapi.CodeUnavailable // a proxy in front could not reach lock-server
	default:
		e.Code = "HTTP_" + strconv.Itoa(resp.StatusCode)
	}
	return e
}

// Sentinel errors; errors.Is matches every *Error carrying the code.
var (
	ErrHeld        error = &sentinel{lockapi.CodeLockHeld, "lockclient: lock held"}
	ErrLeaseLost   error = &sentinel{lockapi.CodeLeaseLost, "lockclient: lease lost"}
	ErrNotFound    error = &sentinel{lockapi.CodeNotFound, "lockclient: lock never granted"}
	ErrUnavailable error = &sentinel{lockapi.CodeUnavailable, "lockclient: lock-server unavailable"}
	// ErrForbidden: the calling workload lacks the route's role
	// (docs/contracts/workload-identity.md).
	ErrForbidden error = &sentinel{lockapi.CodeForbidden, "lockclient: this workload may not make the call"}
	// ErrNotLeaseHolder: the lease was acquired by another workload.
	ErrNotLeaseHolder error = &sentinel{lockapi.CodeNotLeaseHolder, "lockclient: another workload holds the lease"}
)

// Reasons a lease's context ends besides ErrLeaseLost (see Lease.Err).
var (
	// ErrExpired: the local safe deadline passed without a successful renewal.
	// errors.Is(ErrExpired, context.DeadlineExceeded) is true.
	ErrExpired = fmt.Errorf("lockclient: lease's local safe deadline passed without a successful renewal: %w", context.DeadlineExceeded)
	// ErrReleased: the lease was released by its holder.
	ErrReleased = errors.New("lockclient: lease released")
)

type sentinel struct{ code, msg string }

func (s *sentinel) Error() string { return s.msg }

// Error is a failed call: the server's problem answer, or no answer at all
// (Code UNAVAILABLE, Status 0, Err the transport's error).
type Error struct {
	Code    string           // the problem code: LOCK_HELD, LEASE_LOST, NOT_FOUND, UNAVAILABLE, INVALID_REQUEST …
	Status  int              // HTTP status; 0 when no answer was received
	Problem *lockapi.Problem // the problem document, when the server sent one
	Op      string           // acquire, renew, release, get, grants
	Name    string           // the lock
	Err     error            // the underlying failure, when there was no usable answer
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "lockclient: %s %s: ", e.Op, e.Name)
	switch {
	case e.Problem != nil:
		b.WriteString(e.Problem.Error())
	case e.Status != 0:
		fmt.Fprintf(&b, "%d %s", e.Status, e.Code)
	default:
		b.WriteString(e.Code)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap exposes the transport's error (e.g. context.DeadlineExceeded).
func (e *Error) Unwrap() error { return e.Err }

// Is matches the sentinel of e's code.
func (e *Error) Is(target error) bool {
	s, ok := target.(*sentinel)
	return ok && s.code == e.Code
}

// Holder returns the LOCK_HELD answer's holder and expiry.
func (e *Error) Holder() (owner string, expiresAt time.Time, ok bool) {
	if e.Code != lockapi.CodeLockHeld || e.Problem == nil {
		return "", time.Time{}, false
	}
	okH, errH := e.Problem.Member("holder", &owner)
	okE, errE := e.Problem.Member("expiresAt", &expiresAt)
	return owner, expiresAt, okH && okE && errH == nil && errE == nil
}

// transient says a failed renewal may succeed if tried again: no answer, or the
// server (or lockdb behind it) failed. Any other answer is the server's verdict.
func transient(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	return e.Code == lockapi.CodeUnavailable || e.Status >= 500 ||
		e.Status == http.StatusTooManyRequests || e.Status == http.StatusRequestTimeout
}
