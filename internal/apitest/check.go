package apitest

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"

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

// validate has the validator check one exchange and records what it answers.
func (c *Checker) validate(req *http.Request, reqBody []byte, resp *http.Response, respBody []byte) {
	sent := req.Method + " " + req.URL.RequestURI()
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	k, fs, err := c.proc.check(ctx, c.doc, exchange{
		Method: req.Method, URL: req.URL.String(), Host: req.Host, Header: req.Header, Body: reqBody,
		Status: resp.StatusCode, RespHeader: resp.Header, RespBody: respBody,
	})
	if err != nil {
		c.find(req, Finding{Kind: CheckFailed, Key: Key{Method: req.Method, Path: NoRoute, Status: resp.StatusCode}, Request: sent, Detail: err.Error()})
		return
	}
	key := Key(k)
	c.saw(key)
	for _, f := range fs {
		c.find(req, Finding{Kind: f.Kind, Key: key, Request: sent, Detail: f.Detail})
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
