package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
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
)

// noRoute is the path of a key for a request to a path the document does not
// list (internal/apitest's NoRoute).
const noRoute = "(no route)"

// The kinds of finding; internal/apitest exports the same strings.
const (
	undocumentedStatus    = "undocumented status"
	invalidResponse       = "response does not match the document"
	problemStatusMismatch = "problem status member is not the HTTP status"
	unexpectedBody        = "body on an answer documented without one"
	acceptedInvalid       = "2xx answer to a request the document forbids"
	unmatchedRoute        = "undocumented route not answered 404/405 as documented"
)

type key struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Status int    `json:"status"`
}

type finding struct {
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
}

// exchange is one request and the answer to it, as the client or server saw them.
type exchange struct {
	Doc        uint64      `json:"doc,omitempty"`
	Method     string      `json:"method,omitempty"`
	URL        string      `json:"url,omitempty"` // absolute, or a path with Host naming the server
	Host       string      `json:"host,omitempty"`
	Header     http.Header `json:"header,omitempty"`
	Body       []byte      `json:"body,omitempty"`
	Status     int         `json:"status,omitempty"`
	RespHeader http.Header `json:"respHeader,omitempty"`
	RespBody   []byte      `json:"respBody,omitempty"`
}

// document is one loaded OpenAPI document. Its validator is safe for
// concurrent use.
type document struct {
	model   *v3.Document
	v       validator.Validator
	schemas schema_validation.SchemaValidator
	opts    *config.ValidationOptions
	// The bodies of the answers to undocumented routes and methods.
	notFound, notAllowed *base.Schema
	documented           []key
}

// catalog holds the documents loaded so far, by the id of the request that
// loaded them; a document loaded twice (a test kit's every checker loads its
// service's) is parsed once.
type catalog struct {
	mu     sync.Mutex
	byID   map[uint64]*document
	byHash map[[sha256.Size]byte]*document
}

func newCatalog() *catalog {
	return &catalog{byID: map[uint64]*document{}, byHash: map[[sha256.Size]byte]*document{}}
}

func (c *catalog) load(id uint64, raw []byte) answer {
	sum := sha256.Sum256(raw)
	c.mu.Lock()
	d := c.byHash[sum]
	c.mu.Unlock()
	if d == nil {
		var err error
		if d, err = parse(raw); err != nil {
			return answer{ID: id, Error: err.Error()}
		}
	}
	c.mu.Lock()
	c.byHash[sum] = d
	c.byID[id] = d
	c.mu.Unlock()
	return answer{ID: id, Documented: d.documented}
}

func (c *catalog) check(id, doc uint64, x *exchange) answer {
	c.mu.Lock()
	d := c.byID[doc]
	c.mu.Unlock()
	if d == nil {
		return answer{ID: id, Error: fmt.Sprintf("no document loaded by request %d", doc)}
	}
	k, fs, err := d.check(x)
	if err != nil {
		return answer{ID: id, Error: err.Error()}
	}
	return answer{ID: id, Key: &k, Findings: fs}
}

func parse(raw []byte) (*document, error) {
	doc, err := libopenapi.NewDocument(raw)
	if err != nil {
		return nil, err
	}
	m, err := doc.BuildV3Model()
	if err != nil {
		return nil, err
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	d := &document{model: &m.Model, v: v, schemas: schema_validation.NewSchemaValidator(), opts: config.NewValidationOptions()}
	d.notFound = responseSchema(d.model, "RouteNotFound")
	d.notAllowed = responseSchema(d.model, "MethodNotAllowed")
	if d.notFound == nil || d.notAllowed == nil {
		return nil, errors.New("the document needs components/responses RouteNotFound and MethodNotAllowed with a problem schema")
	}
	for path, item := range d.model.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			for code := range op.Responses.Codes.FromOldest() {
				n, err := strconv.Atoi(code)
				if err != nil {
					continue // a range such as 4XX; the documents list statuses one by one
				}
				d.documented = append(d.documented, key{Method: strings.ToUpper(method), Path: path, Status: n})
			}
		}
	}
	return d, nil
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

// check validates one exchange: the key it matched and what disagrees with the
// document.
func (d *document) check(x *exchange) (key, []finding, error) {
	u, err := url.Parse(x.URL)
	if err != nil {
		return key{}, nil, fmt.Errorf("exchange URL: %w", err)
	}
	host := x.Host
	if host == "" {
		host = u.Host
	}
	req := &http.Request{Method: x.Method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: x.Header, Host: host, ContentLength: int64(len(x.Body))}
	if req.Header == nil {
		req.Header = http.Header{}
	}
	resp := &http.Response{StatusCode: x.Status, Header: x.RespHeader, Request: req}
	if resp.Header == nil {
		resp.Header = http.Header{}
	}
	var fs []finding
	find := func(kind, detail string) { fs = append(fs, finding{Kind: kind, Detail: detail}) }

	item, errs, template := paths.FindPath(req, d.model, d.opts)
	if item == nil || len(errs) > 0 {
		k := key{Method: x.Method, Path: noRoute, Status: x.Status}
		d.checkUnmatched(resp, x.RespBody, item != nil, find)
		return k, fs, nil
	}
	k := key{Method: x.Method, Path: template, Status: x.Status}
	op := item.GetOperations().GetOrZero(strings.ToLower(x.Method))
	documented := op.Responses.Codes.GetOrZero(strconv.Itoa(x.Status))
	if documented == nil {
		find(undocumentedStatus, describe(resp, x.RespBody))
		return k, fs, nil
	}

	resp.Body = io.NopCloser(bytes.NewReader(x.RespBody))
	req.Body = io.NopCloser(bytes.NewReader(x.Body))
	if ok, verrs := d.v.ValidateHttpResponse(req, resp); !ok {
		find(invalidResponse, explain(verrs)+"; body: "+clip(x.RespBody))
	}
	if orderedmap.Len(documented.Content) == 0 && len(x.RespBody) > 0 {
		find(unexpectedBody, clip(x.RespBody))
	}
	checkProblemStatus(resp, x.RespBody, find)

	if x.Status >= 200 && x.Status < 300 {
		req.Body = io.NopCloser(bytes.NewReader(x.Body))
		if ok, verrs := d.v.ValidateHttpRequestSync(req); !ok {
			find(acceptedInvalid, explain(verrs))
		}
	}
	return k, fs, nil
}

// checkUnmatched checks the answer to a path (or method) the document does not
// list: the document promises 404 NOT_FOUND (405 METHOD_NOT_ALLOWED with Allow
// when the path exists) in the shape of its RouteNotFound and MethodNotAllowed
// responses.
func (d *document) checkUnmatched(resp *http.Response, body []byte, pathKnown bool, find func(kind, detail string)) {
	want, schema := http.StatusNotFound, d.notFound
	if pathKnown {
		want, schema = http.StatusMethodNotAllowed, d.notAllowed
	}
	switch {
	case resp.StatusCode != want:
		find(unmatchedRoute, fmt.Sprintf("want %d; got %s", want, describe(resp, body)))
		return
	case !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json"):
		find(unmatchedRoute, "not application/problem+json: "+describe(resp, body))
		return
	case want == http.StatusMethodNotAllowed && resp.Header.Get("Allow") == "":
		find(unmatchedRoute, "405 without an Allow header")
	}
	if ok, verrs := d.schemas.ValidateSchemaBytes(schema, body); !ok {
		find(unmatchedRoute, explain(verrs)+"; body: "+clip(body))
	}
	checkProblemStatus(resp, body, find)
}

func checkProblemStatus(resp *http.Response, body []byte, find func(kind, detail string)) {
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		return
	}
	var p struct {
		Status *int `json:"status"`
	}
	if err := json.Unmarshal(body, &p); err != nil || p.Status == nil || *p.Status != resp.StatusCode {
		find(problemStatusMismatch, clip(body))
	}
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
