// Package apitest checks real HTTP traffic against a service's OpenAPI document
// (package api), for tests. A Checker wraps a service's http.Handler, or a
// client's http.RoundTripper, and validates every request and every response
// with pb33f/libopenapi-validator — the document's schemas, not hand-written
// checks, decide (out of process: see below). It records which (method, path template, status) it saw, so a
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
//
// The validation itself runs in another process, checks/cmd/apivalidate, in the
// module lock.dev/checks: libopenapi and what it pulls in are heavy, and a
// requirement of lock.dev's go.mod — even one only a test kit uses — lands in
// the module graph of every program that takes lock.dev's client. The first
// Checker of a test binary builds that program once (go build -C checks, from
// this tree) and starts it; every Checker of the binary shares it, sending each
// exchange as a JSON line and getting back the documented key it matched and
// its findings, and loading its document there to learn the documented keys.
// A validator that does not build, dies or does not answer fails the tests
// (New's error, a CheckFailed finding): it is never skipped. Keeping
// libopenapi in lock.dev would have been simpler but is what this avoids;
// kin-openapi, the other Go validator, is as heavy; and the conformance tests
// cannot move to the checks module themselves, since they use their packages'
// unexported helpers.
package apitest

import (
	"fmt"
	"sync"

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
	// CheckFailed is an exchange the validator could not check (its process
	// died, or did not answer in time): a failure, never a silent pass.
	CheckFailed = "the validator could not check the exchange"
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
	proc    *process // the validator, shared by every Checker of the test binary
	doc     uint64   // the id under which proc loaded the document
	// documented are the document's (method, path template, status), in
	// document order.
	documented []Key

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
// package use it to break a document on purpose). The first Checker of a test
// binary builds and starts the validator (see the package documentation),
// which takes a few seconds.
func NewFromDocument(s api.Service, raw []byte) (*Checker, error) {
	p, err := sharedProcess()
	if err != nil {
		return nil, fmt.Errorf("apitest: %s: %w", s, err)
	}
	return newChecker(s, p, raw)
}

// newChecker loads the document into p.
func newChecker(s api.Service, p *process, raw []byte) (*Checker, error) {
	doc, documented, err := p.load(raw)
	if err != nil {
		return nil, fmt.Errorf("apitest: %s: %w", s, err)
	}
	c := &Checker{service: s, proc: p, doc: doc, documented: documented, seen: map[Key]int{},
		pendingByHost: map[string]int{}, reported: map[int]bool{}, tracked: map[string]int{}}
	c.idle = sync.NewCond(&c.mu)
	return c, nil
}
