package lockapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// BodyFault is why a request body could not even be looked at: 415 or 413.
type BodyFault struct {
	Status int
	Errors []FieldError
}

// ReadJSONBody applies the first two rules of C3 #ct3-conventions in their order:
// the content type must be JSON (415), the body at most 64 KiB (413). The caller
// checks headers next, then parses the body.
func ReadJSONBody(r *http.Request) ([]byte, *BodyFault) {
	if err := CheckJSONContentType(r.Header); err != nil {
		return nil, &BodyFault{Status: http.StatusUnsupportedMediaType,
			Errors: []FieldError{{Field: "Content-Type", Problem: problemText(err)}}}
	}
	if r.ContentLength > MaxBodyBytes {
		return nil, tooLarge()
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return nil, &BodyFault{Status: http.StatusBadRequest,
			Errors: []FieldError{{Field: "body", Problem: "could not be read: " + err.Error()}}}
	}
	if len(b) > MaxBodyBytes {
		return nil, tooLarge()
	}
	return b, nil
}

func tooLarge() *BodyFault {
	return &BodyFault{Status: http.StatusRequestEntityTooLarge,
		Errors: []FieldError{{Field: "body", Problem: "must be at most 65536 bytes"}}}
}

// CheckJSONContentType accepts application/json, case-insensitive, with any parameters.
func CheckJSONContentType(h http.Header) error {
	vs := h.Values("Content-Type")
	if len(vs) == 0 {
		return invalid("is required and must be application/json")
	}
	if len(vs) > 1 {
		return invalid("must appear exactly once")
	}
	mt, _, err := mime.ParseMediaType(vs[0])
	if err != nil || !strings.EqualFold(mt, "application/json") {
		return invalid("must be application/json")
	}
	return nil
}

// Object is a strictly parsed JSON object: each member once, nothing after it.
// Fields are taken one by one; every fault is collected, and Finish reports
// members nobody asked for.
type Object struct {
	members map[string]json.RawMessage
	order   []string
	taken   map[string]bool
	errs    []FieldError
}

// ParseObject parses b as exactly one JSON object. A body that is not one is a
// single fault on field "body".
func ParseObject(b []byte) (*Object, []FieldError) {
	fail := func(p string) (*Object, []FieldError) {
		return nil, []FieldError{{Field: "body", Problem: p}}
	}
	if !json.Valid(b) {
		// Valid also rejects trailing data after a value; tell the two apart.
		dec := json.NewDecoder(bytes.NewReader(b))
		var v json.RawMessage
		if err := dec.Decode(&v); err == nil {
			return fail("must contain exactly one JSON value (trailing data found)")
		}
		return fail("must be well-formed JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return fail("must be well-formed JSON")
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fail("must be a JSON object")
	}
	o := &Object{members: map[string]json.RawMessage{}, taken: map[string]bool{}}
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return fail("must be well-formed JSON")
		}
		k, _ := kt.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return fail("must be well-formed JSON")
		}
		if _, dup := o.members[k]; dup {
			o.errs = append(o.errs, FieldError{Field: k, Problem: "must appear only once"})
			continue
		}
		o.members[k] = raw
		o.order = append(o.order, k)
	}
	return o, nil
}

func (o *Object) fault(field, problem string) {
	o.errs = append(o.errs, FieldError{Field: field, Problem: problem})
}

func (o *Object) take(name string, required bool) (json.RawMessage, bool) {
	o.taken[name] = true
	raw, ok := o.members[name]
	if !ok {
		if required {
			o.fault(name, "is required")
		}
		return nil, false
	}
	return raw, true
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// String takes a string member. A null is treated as absent only when nullable.
// validate, when set, adds its fault.
func (o *Object) String(name string, required, nullable bool, validate func(string) error) (string, bool) {
	raw, ok := o.take(name, required)
	if !ok {
		return "", false
	}
	if isNull(raw) {
		if !nullable {
			o.fault(name, "must not be null")
		}
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		o.fault(name, "must be a string")
		return "", false
	}
	if validate != nil {
		if err := validate(s); err != nil {
			o.fault(name, problemText(err))
			return "", false
		}
	}
	return s, true
}

// Int64 takes an integer member: a JSON integer literal (no fraction, no exponent)
// within [min, max].
func (o *Object) Int64(name string, required bool, min, max int64) (int64, bool) {
	raw, ok := o.take(name, required)
	if !ok {
		return 0, false
	}
	s := string(bytes.TrimSpace(raw))
	if s == "null" {
		o.fault(name, "must not be null")
		return 0, false
	}
	if s == "" || strings.ContainsAny(s, ".eE\"") || !(s[0] == '-' || (s[0] >= '0' && s[0] <= '9')) {
		o.fault(name, "must be an integer")
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			o.fault(name, "is out of range")
		} else {
			o.fault(name, "must be an integer")
		}
		return 0, false
	}
	if v < min || v > max {
		o.fault(name, "must be between "+strconv.FormatInt(min, 10)+" and "+strconv.FormatInt(max, 10))
		return 0, false
	}
	return v, true
}

// Float64 takes a number member within [min, max].
func (o *Object) Float64(name string, required bool, min, max float64) (float64, bool) {
	raw, ok := o.take(name, required)
	if !ok {
		return 0, false
	}
	s := string(bytes.TrimSpace(raw))
	if s == "null" {
		o.fault(name, "must not be null")
		return 0, false
	}
	if s == "" || !(s[0] == '-' || (s[0] >= '0' && s[0] <= '9')) {
		o.fault(name, "must be a number")
		return 0, false
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < min || v > max {
		o.fault(name, "must be between "+strconv.FormatFloat(min, 'g', -1, 64)+" and "+strconv.FormatFloat(max, 'g', -1, 64))
		return 0, false
	}
	return v, true
}

// Finish reports members that were not asked for and returns every fault found.
func (o *Object) Finish() []FieldError {
	for _, k := range o.order {
		if !o.taken[k] {
			o.fault(k, "is not a known member")
		}
	}
	return o.errs
}
