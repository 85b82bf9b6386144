package lockapi

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
)

// Problem codes. Each service answers only the closed set of its contract plus
// NOT_FOUND, METHOD_NOT_ALLOWED, INTERNAL and (for a database out of reach)
// UNAVAILABLE.
const (
	CodeInvalidRequest      = "INVALID_REQUEST"
	CodeNotFound            = "NOT_FOUND"
	CodeMethodNotAllowed    = "METHOD_NOT_ALLOWED"
	CodeInternal            = "INTERNAL"
	CodeUnavailable         = "UNAVAILABLE"
	CodeFencedOut           = "FENCED_OUT"
	CodeDuplicateSubmission = "DUPLICATE_SUBMISSION"
	CodeRailRejected        = "RAIL_REJECTED"
	CodeRailAmbiguous       = "RAIL_AMBIGUOUS"
	CodeRailUnavailable     = "RAIL_UNAVAILABLE"
	CodeLockHeld            = "LOCK_HELD"
	CodeLeaseLost           = "LEASE_LOST"
	CodePayoutConflict      = "PAYOUT_CONFLICT"
	CodePayoutFinal         = "PAYOUT_FINAL"
	// CodeUnauthorized: a missing or wrong bearer token (payment-resource's settle,
	// docs/contracts/reconciliation.md).
	CodeUnauthorized  = "UNAUTHORIZED"
	CodeGrantRejected = "GRANT_REJECTED"
	// CodeNotInBooks: rail-proxy refused a submission the books do not hold claimed
	// by this token and owner, as booked (docs/contracts/books.md); member
	// mismatch names the first check that failed, in BooksMismatchOrder.
	CodeNotInBooks = "NOT_IN_BOOKS"
	// CodeOutcomeNotRecorded: payment-resource refused to post an outcome the audit
	// trail does not record (docs/contracts/books.md).
	CodeOutcomeNotRecorded = "OUTCOME_NOT_RECORDED"
	// CodeSettleContradictsStatement: payment-resource refused a settle the
	// statement copy contradicts (docs/contracts/books.md).
	CodeSettleContradictsStatement = "SETTLE_CONTRADICTS_STATEMENT"
	// CodeForbidden: the caller's workload (its verified SPIFFE ID) lacks the
	// route's role (docs/contracts/workload-identity.md); member identity names it.
	CodeForbidden = "FORBIDDEN"
	// CodeNotLeaseHolder: lock-server refused a renew or release by a workload
	// other than the one that acquired the lease (docs/contracts/workload-identity.md).
	CodeNotLeaseHolder = "NOT_LEASE_HOLDER"
)

// ContentTypeProblem is the media type of every error answer (RFC 9457).
const ContentTypeProblem = "application/problem+json"

// codes is the one code → answer table: the HTTP status every service answers a
// code with, its title and its type URI (docs/contracts/README.md and each service's
// page list the codes; TestCodeTable checks this table against them). INVALID_REQUEST
// is 400 here; WriteInvalid gives it 413 or 415 when the body is too large or not JSON.
var codes = map[string]codeAnswer{
	CodeInvalidRequest:      answer(http.StatusBadRequest, CodeInvalidRequest, "Invalid request"),
	CodeNotFound:            answer(http.StatusNotFound, CodeNotFound, "Not found"),
	CodeMethodNotAllowed:    answer(http.StatusMethodNotAllowed, CodeMethodNotAllowed, "Method not allowed"),
	CodeInternal:            answer(http.StatusInternalServerError, CodeInternal, "Internal error"),
	CodeUnavailable:         answer(http.StatusServiceUnavailable, CodeUnavailable, "Service unavailable"),
	CodeFencedOut:           answer(http.StatusConflict, CodeFencedOut, "Fenced out"),
	CodeDuplicateSubmission: answer(http.StatusConflict, CodeDuplicateSubmission, "Duplicate submission"),
	CodeRailRejected:        answer(http.StatusUnprocessableEntity, CodeRailRejected, "Rail rejected"),
	CodeRailAmbiguous:       answer(http.StatusConflict, CodeRailAmbiguous, "Rail outcome ambiguous"),
	CodeRailUnavailable:     answer(http.StatusServiceUnavailable, CodeRailUnavailable, "Rail unavailable"),
	CodeLockHeld:            answer(http.StatusConflict, CodeLockHeld, "Lock held"),
	CodeLeaseLost:           answer(http.StatusConflict, CodeLeaseLost, "Lease lost"),
	CodePayoutConflict:      answer(http.StatusConflict, CodePayoutConflict, "Payout conflict"),
	CodePayoutFinal:         answer(http.StatusConflict, CodePayoutFinal, "Payout final"),
	CodeUnauthorized:        answer(http.StatusUnauthorized, CodeUnauthorized, "Unauthorized"),
	CodeGrantRejected:       answer(http.StatusUnauthorized, CodeGrantRejected, "Grant rejected"),
	CodeNotInBooks:          answer(http.StatusConflict, CodeNotInBooks, "Not in the books"),
	CodeOutcomeNotRecorded:  answer(http.StatusConflict, CodeOutcomeNotRecorded, "Outcome not recorded"),
	CodeSettleContradictsStatement: answer(http.StatusConflict, CodeSettleContradictsStatement,
		"Settle contradicts the statement"),
	CodeForbidden:      answer(http.StatusForbidden, CodeForbidden, "Forbidden"),
	CodeNotLeaseHolder: answer(http.StatusForbidden, CodeNotLeaseHolder, "Not the lease holder"),
}

// codeAnswer is what a code is answered with besides its detail and members.
type codeAnswer struct {
	status     int
	title, typ string
}

func answer(status int, code, title string) codeAnswer {
	return codeAnswer{status: status, title: title, typ: problemType(code)}
}

// problemType is the type URI of code: its name in lower case with dashes.
func problemType(code string) string {
	return "https://lock.dev/problems/" + strings.ToLower(strings.ReplaceAll(code, "_", "-"))
}

// Status is the HTTP status a problem with code is answered with; 500 for a code
// outside the table.
func Status(code string) int { return lookup(code).status }

// lookup is code's row of the table; a code outside it has status 500, no title,
// and a type URI made from its name.
func lookup(code string) codeAnswer {
	if a, ok := codes[code]; ok {
		return a
	}
	return codeAnswer{status: http.StatusInternalServerError, typ: problemType(code)}
}

// FieldError is one element of an INVALID_REQUEST answer's errors list.
type FieldError struct {
	Field   string `json:"field"`
	Problem string `json:"problem"`
}

// Problem is an RFC 9457 problem document with the project's code and the
// members a code carries. It is also the error a client returns for a problem
// answer, so callers can errors.As it and look at Code.
type Problem struct {
	Type    string
	Title   string
	Status  int
	Detail  string
	Code    string
	Members map[string]any // extension members, written as top-level JSON members

	raw map[string]json.RawMessage // as received, for clients
}

// NewProblemCode builds the problem a service answers for code, with the status,
// type and title of the code table.
func NewProblemCode(code, detail string, members map[string]any) *Problem {
	a := lookup(code)
	return &Problem{Type: a.typ, Title: a.title, Status: a.status, Detail: detail, Code: code, Members: members}
}

// NewProblem builds a problem with the type and title of the code table and an
// explicit status: INVALID_REQUEST's 413 and 415 (WriteInvalid), and answers a test
// scripts. A service answers a code through NewProblemCode.
func NewProblem(status int, code, detail string, members map[string]any) *Problem {
	a := lookup(code)
	return &Problem{Type: a.typ, Title: a.title, Status: status, Detail: detail, Code: code, Members: members}
}

func (p *Problem) Error() string {
	if p.Detail != "" {
		return fmt.Sprintf("%d %s: %s", p.Status, p.Code, p.Detail)
	}
	return fmt.Sprintf("%d %s", p.Status, p.Code)
}

// MarshalJSON writes the standard members and then the extension members.
func (p *Problem) MarshalJSON() ([]byte, error) {
	m := make(map[string]any, 5+len(p.Members))
	maps.Copy(m, p.Members)
	m["type"] = p.Type
	m["title"] = p.Title
	m["status"] = p.Status
	m["detail"] = p.Detail
	m["code"] = p.Code
	return json.Marshal(m)
}

// UnmarshalJSON reads a problem document; extension members stay available
// through Member.
func (p *Problem) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	var std struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
		Code   string `json:"code"`
	}
	if err := json.Unmarshal(b, &std); err != nil {
		return err
	}
	p.Type, p.Title, p.Status, p.Detail, p.Code = std.Type, std.Title, std.Status, std.Detail, std.Code
	p.raw = raw
	return nil
}

// Member decodes the extension member name into dst; it reports whether the
// member was present (a JSON null counts as present).
func (p *Problem) Member(name string, dst any) (bool, error) {
	if v, ok := p.Members[name]; ok && p.raw == nil {
		b, err := json.Marshal(v)
		if err != nil {
			return true, err
		}
		return true, json.Unmarshal(b, dst)
	}
	v, ok := p.raw[name]
	if !ok {
		return false, nil
	}
	return true, json.Unmarshal(v, dst)
}

// ProblemNoter is implemented by a ResponseWriter that wants to know which
// problem was answered (the service runtime logs refused requests with it).
type ProblemNoter interface{ NoteProblem(*Problem) }

// WriteProblem writes p as application/problem+json with its status.
func WriteProblem(w http.ResponseWriter, p *Problem) {
	if n, ok := w.(ProblemNoter); ok {
		n.NoteProblem(p)
	}
	body, err := json.Marshal(p)
	if err != nil { // members are built by our own code; fall back to a bare problem
		body = []byte(`{"type":"about:blank","title":"Internal error","status":500,"detail":"problem encoding failed","code":"INTERNAL"}`)
		p.Status = http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", ContentTypeProblem)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}

// WriteInvalid answers INVALID_REQUEST with every fault found.
func WriteInvalid(w http.ResponseWriter, status int, errs []FieldError) {
	detail := "the request is malformed"
	if len(errs) > 0 {
		detail = errs[0].Field + ": " + errs[0].Problem
		if len(errs) > 1 {
			detail += fmt.Sprintf(" (and %d more)", len(errs)-1)
		}
	}
	if errs == nil {
		errs = []FieldError{}
	}
	WriteProblem(w, NewProblem(status, CodeInvalidRequest, detail, map[string]any{"errors": errs}))
}

// WriteJSON writes v as application/json with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		WriteProblem(w, NewProblemCode(CodeInternal, "response encoding failed", nil))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// ReadProblem decodes a problem+json answer into a *Problem. It returns nil when the
// body is not a problem document; the caller decides what such an answer means.
func ReadProblem(resp *http.Response, body []byte) *Problem {
	ct := strings.ToLower(resp.Header.Get("Content-Type"))
	if !strings.HasPrefix(ct, ContentTypeProblem) {
		return nil
	}
	var p Problem
	if err := json.Unmarshal(body, &p); err != nil || p.Code == "" {
		return nil
	}
	if p.Status == 0 {
		p.Status = resp.StatusCode
	}
	return &p
}

// ReadAllLimited reads at most limit bytes of a response body; a longer body is an error.
func ReadAllLimited(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return b, err
	}
	if int64(len(b)) > limit {
		return b[:limit], fmt.Errorf("response body exceeds %d bytes", limit)
	}
	return b, nil
}
