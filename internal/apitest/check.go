package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"

	verrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/pb33f/libopenapi-validator/paths"
	"github.com/pb33f/libopenapi/orderedmap"

	"lock.dev/api"
)

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
