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
	"errors"
	"fmt"
	"sync"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	"github.com/pb33f/libopenapi/datamodel/high/base"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"

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
