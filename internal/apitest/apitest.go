// Package apitest checks real HTTP traffic against a service's OpenAPI document
// (package api), for tests. A Checker wraps a service's http.Handler, or a
// client's http.RoundTripper, and validates every request and every response
// with pb33f/libopenapi-validator — the document's schemas, not hand-written
// checks, decide. It records which (method, path template, status) it saw, so a
// test can ask which documented answers were never exercised, and it reports:
//
//   - an answer with a status the operation does not document;
//   - a response body, header or content type the document does not allow — a
//     member the schema does not list included, since the documents pin their
//     members (additionalProperties: false);
//   - a problem document whose status member is not the HTTP status;
//   - a body on an answer the document says has none;
//   - a 2xx answer to a request the document forbids (the server accepts what
//     the document says it refuses);
//   - an answer to an undocumented route or method that is not the document's
//     404 NOT_FOUND or 405 METHOD_NOT_ALLOWED (with Allow).
//
// Validation runs off the request's goroutine, after the answer is written, so
// a wrapped server keeps its timing; Findings and Report wait for it.
//
// A package's conformance run shares one Checker among all its tests, so that
// coverage accumulates: Track gives each test the findings of the exchanges with
// the server it started (reported when it ends), TrackedRoundTripper wraps the
// package's shared clients, and Finish, at the end of TestMain, fails the run on
// any finding no test was told of and on every documented answer never seen
// (less the exemptions the package names, each with its reason).
package apitest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	verrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/pb33f/libopenapi-validator/paths"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	"github.com/pb33f/libopenapi/datamodel/high/base"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"
	"github.com/pb33f/libopenapi/orderedmap"

	"lock.dev/api"
)

// NoRoute is the path of a Key for a request to a path the document does not list.
const NoRoute = "(no route)"

// Key is one documented answer: a method, a path template of the document (or
// NoRoute) and a status.
type Key struct {
	Method string
	Path   string
	Status int
}

func (k Key) String() string { return fmt.Sprintf("%s %s %d", k.Method, k.Path, k.Status) }

// Finding kinds.
const (
	UndocumentedStatus    = "undocumented status"
	InvalidResponse       = "response does not match the document"
	ProblemStatusMismatch = "problem status member is not the HTTP status"
	UnexpectedBody        = "body on an answer documented without one"
	AcceptedInvalid       = "2xx answer to a request the document forbids"
	UnmatchedRoute        = "undocumented route not answered 404/405 as documented"
)

// Finding is one disagreement between the traffic and the document.
type Finding struct {
	Kind    string
	Key     Key
	Host    string // the server's host:port, as the request named it
	Request string // method and URL as sent
	Detail  string
}

func (f Finding) String() string {
	return fmt.Sprintf("%s: %s (%s): %s", f.Kind, f.Key, f.Request, f.Detail)
}

// Checker validates traffic against one document and records what it saw.
// It is safe for concurrent use.
type Checker struct {
	service api.Service
	model   *v3.Document
	v       validator.Validator
	schemas schema_validation.SchemaValidator
	opts    *config.ValidationOptions
	// The bodies of the answers to undocumented routes and methods.
	notFound, notAllowed *base.Schema

	mu   sync.Mutex
	idle *sync.Cond // signalled whenever a check ends
	// Checks still running, in all and by host. (Not a sync.WaitGroup: tests
	// running in parallel add checks while another waits.)
	pending       int
	pendingByHost map[string]int
	seen          map[Key]int
	findings      []Finding
	reported      map[int]bool // indexes of findings already told to a test
	tracked       map[string]int
}

// New builds a Checker for the service's embedded document.
func New(s api.Service) (*Checker, error) {
	raw, err := api.Document(s)
	if err != nil {
		return nil, fmt.Errorf("apitest: %s: %w", s, err)
	}
	return NewFromDocument(s, raw)
}

// MustNew is New for a package variable: it panics when the document does not
// load.
func MustNew(s api.Service) *Checker {
	c, err := New(s)
	if err != nil {
		panic(err)
	}
	return c
}

// NewFromDocument builds a Checker for the given document bytes (tests of this
// package use it to break a document on purpose).
func NewFromDocument(s api.Service, raw []byte) (*Checker, error) {
	doc, err := libopenapi.NewDocument(raw)
	if err != nil {
		return nil, fmt.Errorf("apitest: %s: %w", s, err)
	}
	m, err := doc.BuildV3Model()
	if err != nil {
		return nil, fmt.Errorf("apitest: %s: %w", s, err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		return nil, fmt.Errorf("apitest: %s: %w", s, errors.Join(errs...))
	}
	c := &Checker{service: s, model: &m.Model, v: v, schemas: schema_validation.NewSchemaValidator(),
		opts: config.NewValidationOptions(), seen: map[Key]int{}, pendingByHost: map[string]int{},
		reported: map[int]bool{}, tracked: map[string]int{}}
	c.idle = sync.NewCond(&c.mu)
	c.notFound = responseSchema(c.model, "RouteNotFound")
	c.notAllowed = responseSchema(c.model, "MethodNotAllowed")
	if c.notFound == nil || c.notAllowed == nil {
		return nil, fmt.Errorf("apitest: %s: the document needs components/responses RouteNotFound and MethodNotAllowed with a problem schema", s)
	}
	return c, nil
}

func responseSchema(m *v3.Document, name string) *base.Schema {
	if m.Components == nil {
		return nil
	}
	r := m.Components.Responses.GetOrZero(name)
	if r == nil {
		return nil
	}
	mt := r.Content.GetOrZero("application/problem+json")
	if mt == nil || mt.Schema == nil {
		return nil
	}
	return mt.Schema.Schema()
}

// Handler wraps a service's handler: every request it serves is checked.
func (c *Checker) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var reqBody bytes.Buffer
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = struct {
				io.Reader
				io.Closer
			}{io.TeeReader(r.Body, &reqBody), r.Body}
		}
		rec := &recorder{inner: w, header: w.Header()}
		next.ServeHTTP(rec, r)
		if rec.hijacked {
			return // no HTTP answer at all (a dropped connection): nothing to check
		}
		if rec.status == 0 && r.Context().Err() != nil {
			return // the client left and the handler wrote nothing: no answer anybody saw
		}
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		req := r.Clone(context.WithoutCancel(r.Context()))
		if req.URL.Host == "" {
			req.URL.Host = r.Host // a server's request names its host only in Host
		}
		resp := &http.Response{StatusCode: rec.status, Header: rec.header.Clone(), Request: req}
		c.check(req, reqBody.Bytes(), resp, rec.body.Bytes())
	})
}

// RoundTripper wraps a client's transport (nil means http.DefaultTransport):
// every exchange it carries is checked. Calls that get no answer are not.
func (c *Checker) RoundTripper(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return roundTripper{c: c, next: next}
}

// TrackedRoundTripper is RoundTripper for a package's shared clients: it checks
// only the exchanges with a server some test is tracking (Track), and passes
// the others through untouched — a benchmark's server, a fake rail, a server
// of another kind.
func (c *Checker) TrackedRoundTripper(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return roundTripper{c: c, next: next, onlyTracked: true}
}

type roundTripper struct {
	c           *Checker
	next        http.RoundTripper
	onlyTracked bool
}

func (rt roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	if rt.onlyTracked && !rt.c.isTracked(r.URL.Host) {
		return rt.next.RoundTrip(r)
	}
	var reqBody []byte
	if r.Body != nil && r.Body != http.NoBody {
		b, err := io.ReadAll(r.Body)
		_ = r.Body.Close()
		if err != nil {
			return nil, err
		}
		reqBody = b
		// A clone with a fresh body: the caller's request is not ours to change.
		r = r.Clone(r.Context())
		r.Body = io.NopCloser(bytes.NewReader(b))
		r.GetBody = nil
	}
	resp, err := rt.next.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return resp, nil // the caller will see the same truncated body; nothing to check
	}
	cp := *resp
	cp.Header = resp.Header.Clone()
	rt.c.check(r.Clone(context.WithoutCancel(r.Context())), reqBody, &cp, body)
	return resp, nil
}

// check validates one exchange in the background.
func (c *Checker) check(req *http.Request, reqBody []byte, resp *http.Response, respBody []byte) {
	reqBody = slices.Clone(reqBody)
	respBody = slices.Clone(respBody)
	host := req.URL.Host
	c.mu.Lock()
	c.pending++
	c.pendingByHost[host]++
	c.mu.Unlock()
	go func() {
		defer func() {
			c.mu.Lock()
			c.pending--
			if c.pendingByHost[host]--; c.pendingByHost[host] == 0 {
				delete(c.pendingByHost, host)
			}
			c.mu.Unlock()
			c.idle.Broadcast()
		}()
		c.validate(req, reqBody, resp, respBody)
	}()
}

func (c *Checker) validate(req *http.Request, reqBody []byte, resp *http.Response, respBody []byte) {
	sent := req.Method + " " + req.URL.RequestURI()
	item, errs, template := paths.FindPath(req, c.model, c.opts)
	if item == nil || len(errs) > 0 {
		c.validateUnmatched(req, resp, respBody, item != nil, sent)
		return
	}
	key := Key{Method: req.Method, Path: template, Status: resp.StatusCode}
	c.saw(key)
	op := item.GetOperations().GetOrZero(strings.ToLower(req.Method))
	documented := op.Responses.Codes.GetOrZero(strconv.Itoa(resp.StatusCode))
	if documented == nil {
		c.find(req, Finding{Kind: UndocumentedStatus, Key: key, Request: sent, Detail: describe(resp, respBody)})
		return
	}

	resp.Body = io.NopCloser(bytes.NewReader(respBody))
	req.Body = io.NopCloser(bytes.NewReader(reqBody))
	if ok, verrs := c.v.ValidateHttpResponse(req, resp); !ok {
		c.find(req, Finding{Kind: InvalidResponse, Key: key, Request: sent, Detail: explain(verrs) + "; body: " + clip(respBody)})
	}
	if orderedmap.Len(documented.Content) == 0 && len(respBody) > 0 {
		c.find(req, Finding{Kind: UnexpectedBody, Key: key, Request: sent, Detail: clip(respBody)})
	}
	c.checkProblemStatus(req, key, sent, resp, respBody)

	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		req.Body = io.NopCloser(bytes.NewReader(reqBody))
		if ok, verrs := c.v.ValidateHttpRequestSync(req); !ok {
			c.find(req, Finding{Kind: AcceptedInvalid, Key: key, Request: sent, Detail: explain(verrs)})
		}
	}
}

// validateUnmatched checks the answer to a path (or method) the document does
// not list: the document promises 404 NOT_FOUND (405 METHOD_NOT_ALLOWED with
// Allow when the path exists) in the shape of its RouteNotFound and
// MethodNotAllowed responses.
func (c *Checker) validateUnmatched(req *http.Request, resp *http.Response, body []byte, pathKnown bool, sent string) {
	key := Key{Method: req.Method, Path: NoRoute, Status: resp.StatusCode}
	want, schema := http.StatusNotFound, c.notFound
	if pathKnown {
		want, schema = http.StatusMethodNotAllowed, c.notAllowed
	}
	c.saw(key)
	switch {
	case resp.StatusCode != want:
		c.find(req, Finding{Kind: UnmatchedRoute, Key: key, Request: sent, Detail: fmt.Sprintf("want %d; got %s", want, describe(resp, body))})
		return
	case !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json"):
		c.find(req, Finding{Kind: UnmatchedRoute, Key: key, Request: sent, Detail: "not application/problem+json: " + describe(resp, body)})
		return
	case want == http.StatusMethodNotAllowed && resp.Header.Get("Allow") == "":
		c.find(req, Finding{Kind: UnmatchedRoute, Key: key, Request: sent, Detail: "405 without an Allow header"})
	}
	if ok, verrs := c.schemas.ValidateSchemaBytes(schema, body); !ok {
		c.find(req, Finding{Kind: UnmatchedRoute, Key: key, Request: sent, Detail: explain(verrs) + "; body: " + clip(body)})
	}
	c.checkProblemStatus(req, key, sent, resp, body)
}

func (c *Checker) checkProblemStatus(req *http.Request, key Key, sent string, resp *http.Response, body []byte) {
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		return
	}
	var p struct {
		Status *int `json:"status"`
	}
	if err := json.Unmarshal(body, &p); err != nil || p.Status == nil || *p.Status != resp.StatusCode {
		c.find(req, Finding{Kind: ProblemStatusMismatch, Key: key, Request: sent, Detail: clip(body)})
	}
}

func (c *Checker) saw(k Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[k]++
}

func (c *Checker) find(req *http.Request, f Finding) {
	f.Host = req.URL.Host
	c.mu.Lock()
	defer c.mu.Unlock()
	c.findings = append(c.findings, f)
}

// Wait blocks until every exchange so far has been checked.
func (c *Checker) Wait() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.pending > 0 {
		c.idle.Wait()
	}
}

// waitHost blocks until every exchange so far with host has been checked
// (exchanges of other tests running in parallel do not hold it up).
func (c *Checker) waitHost(host string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.pendingByHost[host] > 0 {
		c.idle.Wait()
	}
}

// Findings are the disagreements found so far, after waiting for the checks
// still running.
func (c *Checker) Findings() []Finding {
	c.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.findings)
}

// Seen is how often each answer was seen, after waiting for the checks still
// running.
func (c *Checker) Seen() map[Key]int {
	c.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[Key]int, len(c.seen))
	for k, n := range c.seen {
		out[k] = n
	}
	return out
}

// Documented lists every (method, path template, status) the document gives,
// in document order.
func (c *Checker) Documented() []Key {
	var keys []Key
	for path, item := range c.model.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			for code := range op.Responses.Codes.FromOldest() {
				n, err := strconv.Atoi(code)
				if err != nil {
					continue // a range such as 4XX; the documents list statuses one by one
				}
				keys = append(keys, Key{Method: strings.ToUpper(method), Path: path, Status: n})
			}
		}
	}
	return keys
}

// Missing lists the documented answers never seen, leaving out those the
// caller names as not exercised on purpose.
func (c *Checker) Missing(exempt ...Key) []Key {
	seen := c.Seen()
	var out []Key
	for _, k := range c.Documented() {
		if seen[k] == 0 && !slices.Contains(exempt, k) {
			out = append(out, k)
		}
	}
	return out
}

// TB is the part of testing.TB Report needs.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
}

// Report fails t once per finding.
func (c *Checker) Report(t TB) {
	t.Helper()
	c.Wait()
	for _, f := range c.take(func(Finding) bool { return true }) {
		t.Errorf("%s: %s", c.service, f)
	}
}

// take returns the findings keep accepts that no test was told of yet, and
// marks them told.
func (c *Checker) take(keep func(Finding) bool) []Finding {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Finding
	for i, f := range c.findings {
		if !c.reported[i] && keep(f) {
			c.reported[i] = true
			out = append(out, f)
		}
	}
	return out
}

// CleanupTB is the part of testing.TB Track needs.
type CleanupTB interface {
	TB
	Cleanup(func())
}

// Track gives t the server at baseURL (http://host:port) for as long as t runs:
// a TrackedRoundTripper checks the exchanges with it, and when t ends (its
// Cleanup, so register Track before the cleanup that stops the server: it then
// runs after it) every finding of those exchanges fails t. Tracking the same
// server from several tests is allowed; each is told of what it has not been
// told of yet.
func (c *Checker) Track(t CleanupTB, baseURL string) {
	t.Helper()
	u, err := url.Parse(baseURL)
	if err != nil || u.Host == "" {
		t.Errorf("apitest: Track(%q): not a base URL", baseURL)
		return
	}
	host := u.Host
	c.mu.Lock()
	c.tracked[host]++
	c.mu.Unlock()
	t.Cleanup(func() {
		c.waitHost(host)
		c.mu.Lock()
		if c.tracked[host]--; c.tracked[host] <= 0 {
			delete(c.tracked, host)
		}
		c.mu.Unlock()
		for _, f := range c.take(func(f Finding) bool { return f.Host == host }) {
			t.Errorf("%s conformance: %s", c.service, f)
		}
	})
}

func (c *Checker) isTracked(host string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tracked[host] > 0
}

// Exemption names documented answers a package's tests do not provoke on
// purpose, and why. A zero Method, Path or Status matches any.
type Exemption struct {
	Key
	Reason string
}

// Exempt is an Exemption of method path status ("" or 0 for any) for reason.
func Exempt(method, path string, status int, reason string) Exemption {
	return Exemption{Key: Key{Method: method, Path: path, Status: status}, Reason: reason}
}

// ServeEndpoints500 exempts the 500 INTERNAL of the endpoints internal/serve
// gives every service. They answer from memory — process liveness, the metric
// registry, the embedded document — or, for readiness, 200 or 503 whatever
// their checks return (a failing check is DOWN, not an error): their 500 is only
// serve.Handler's answer to a handler panic, which no test can cause without
// changing the code.
func ServeEndpoints500() []Exemption {
	return []Exemption{
		Exempt("GET", "/livez", 500, "no failure path but a panic"),
		Exempt("GET", "/actuator/health/liveness", 500, "no failure path but a panic"),
		Exempt("GET", "/metrics", 500, "no failure path but a panic"),
		Exempt("GET", "/actuator/prometheus", 500, "no failure path but a panic"),
		Exempt("GET", "/openapi.json", 500, "the document is embedded; api_test.go proves it is there"),
		Exempt("GET", "/readyz", 500, "readiness has no error path but a panic"),
		Exempt("GET", "/actuator/health/readiness", 500, "readiness has no error path but a panic"),
		Exempt("GET", "/actuator/health", 500, "readiness has no error path but a panic"),
	}
}

func (e Exemption) matches(k Key) bool {
	return (e.Method == "" || e.Method == k.Method) && (e.Path == "" || e.Path == k.Path) && (e.Status == 0 || e.Status == k.Status)
}

// Finish ends a package's TestMain, given what m.Run returned, and returns the
// exit code: it fails the run on every finding no test was told of (an
// exchange with a server no test tracked, or one after its test ended) and —
// unless the run was narrowed by -run, -skip or -short, which leave tests out —
// on every documented answer no test provoked and no exemption names. An
// exemption that names no documented answer fails it too, and one whose
// answers were all seen anyway is noted, to be removed.
func (c *Checker) Finish(code int, exempt ...Exemption) int {
	return c.finish(code, narrowed(), os.Stderr, exempt...)
}

func (c *Checker) finish(code int, narrowed bool, out io.Writer, exempt ...Exemption) int {
	c.Wait()
	fail := func(format string, args ...any) {
		fmt.Fprintf(out, "apitest: %s: "+format+"\n", append([]any{c.service}, args...)...)
		if code == 0 {
			code = 1
		}
	}
	for _, f := range c.take(func(Finding) bool { return true }) {
		fail("conformance: %s", f)
	}
	documented := c.Documented()
	seen := c.Seen()
	for _, e := range exempt {
		n, hit := 0, 0
		for _, k := range documented {
			if e.matches(k) {
				n++
				if seen[k] > 0 {
					hit++
				}
			}
		}
		switch {
		case n == 0:
			fail("exemption %s (%s) names no documented answer", e.Key, e.Reason)
		case hit == n && !narrowed:
			fmt.Fprintf(out, "apitest: %s: note: exemption %s is no longer needed: every answer it names was seen\n", c.service, e.Key)
		}
	}
	if narrowed {
		return code
	}
	var missing []string
	for _, k := range documented {
		if seen[k] == 0 && !slices.ContainsFunc(exempt, func(e Exemption) bool { return e.matches(k) }) {
			missing = append(missing, "\t"+k.String())
		}
	}
	if len(missing) > 0 {
		fail("coverage: %d documented answers no test provoked (provoke each, or exempt it with a reason):\n%s",
			len(missing), strings.Join(missing, "\n"))
	}
	return code
}

// narrowed reports whether this test binary runs only some of its tests.
func narrowed() bool {
	for _, name := range []string{"test.run", "test.skip", "test.short", "test.list"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" && f.Value.String() != "false" {
			return true
		}
	}
	return false
}

func describe(resp *http.Response, body []byte) string {
	return fmt.Sprintf("%d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), clip(body))
}

func clip(b []byte) string {
	const max = 600
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}

// explain renders the validator's errors, the first few schema faults of each
// (a long list repeats one fault over many items).
func explain(errs []*verrors.ValidationError) string {
	const maxFaults = 5
	var parts []string
	for _, e := range errs {
		s := e.Message
		if e.Reason != "" {
			s += ": " + e.Reason
		}
		for i, f := range e.SchemaValidationErrors {
			if i == maxFaults {
				s += fmt.Sprintf(" [and %d more]", len(e.SchemaValidationErrors)-maxFaults)
				break
			}
			s += fmt.Sprintf(" [%s %s: %s]", f.FieldPath, f.KeywordLocation, f.Reason)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// recorder passes an answer through to the real writer and keeps a copy.
type recorder struct {
	inner    http.ResponseWriter
	header   http.Header
	status   int
	body     bytes.Buffer
	hijacked bool
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 && code >= 200 {
		r.status = code
	}
	r.inner.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	n, err := r.inner.Write(b)
	r.body.Write(b[:n]) // what the client got: net/http refuses a body on 204 and 304
	return n, err
}

// Hijack lets a handler drop the connection (rail-stub's chaos does): there is
// then no answer to check.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(r.inner).Hijack()
	if err == nil {
		r.hijacked = true
	}
	return conn, rw, err
}

func (r *recorder) Flush() { _ = http.NewResponseController(r.inner).Flush() }

// Unwrap lets http.ResponseController reach the real writer's deadlines.
func (r *recorder) Unwrap() http.ResponseWriter { return r.inner }

// ServesDocument fails t unless h answers GET /openapi.json with exactly the
// service's embedded document, as application/json.
func ServesDocument(t TB, h http.Handler, s api.Service) {
	t.Helper()
	want, err := api.Document(s)
	if err != nil {
		t.Errorf("%s: no document: %v", s, err)
		return
	}
	req, _ := http.NewRequest(http.MethodGet, "/openapi.json", nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" || !bytes.Equal(rec.Body.Bytes(), want) {
		t.Errorf("%s: GET /openapi.json answered %d %q with %d bytes; want 200 application/json and the %d bytes of api/%s.json",
			s, rec.Code, rec.Header().Get("Content-Type"), rec.Body.Len(), len(want), s)
	}
}
