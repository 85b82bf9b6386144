// Package jsonbody reads a request's JSON body the way every service must
// (docs/contracts/README.md, HTTP conventions): the content type first (415),
// then the size (413), and then the body as exactly one JSON object, parsed
// strictly — each member once, no member nobody asked for, text that is
// Unicode — with every fault collected and named by its member. The faults are
// lockapi.FieldError, the members of an INVALID_REQUEST problem.
//
// It is not encoding/json's Unmarshal: that takes a duplicate member's last
// value, ignores unknown members and repairs invalid UTF-8, each of which would
// let a request say two things at once. The scanner keeps encoding/json's
// grammar (the same verdicts, the same member values) and validates and splits
// the object in one pass.
package jsonbody

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"lock.dev/lockapi"
)

// BodyFault is why a request body could not even be looked at: 415 or 413.
type BodyFault struct {
	Status int
	Errors []lockapi.FieldError
}

// ReadJSONBody applies the first two rules of docs/contracts/README.md in their order:
// the content type must be JSON (415), the body at most 64 KiB (413). The caller
// checks headers next, then parses the body.
func ReadJSONBody(r *http.Request) ([]byte, *BodyFault) {
	if err := CheckJSONContentType(r.Header); err != nil {
		return nil, &BodyFault{Status: http.StatusUnsupportedMediaType,
			Errors: []lockapi.FieldError{{Field: "Content-Type", Problem: lockapi.ProblemText(err)}}}
	}
	if r.ContentLength > lockapi.MaxBodyBytes {
		drainOversized(r)
		return nil, tooLarge()
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, lockapi.MaxBodyBytes+1))
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		// The server already knows the body is too large (http.MaxBytesReader,
		// or a body the server refused to read); such a body reads no further,
		// so there is nothing here to drain.
		return nil, tooLarge()
	}
	if err != nil {
		return nil, &BodyFault{Status: http.StatusBadRequest,
			Errors: []lockapi.FieldError{{Field: "body", Problem: "could not be read: " + err.Error()}}}
	}
	if len(b) > lockapi.MaxBodyBytes {
		drainOversized(r)
		return nil, tooLarge()
	}
	return b, nil
}

// MaxDrainBytes bounds what is read and thrown away of a body over
// lockapi.MaxBodyBytes
// so that its 413 reaches the client.
//
// A server that answers before a client has finished sending its body and then
// closes the connection (Go's does, past 256 KiB left unread) makes the client's
// kernel answer its remaining writes with a reset, which discards the 413 still
// unread in the client's receive buffer: the client sees a broken pipe or a
// reset instead of the answer. Reading the rest of a body up to a few MiB — a
// client's honest mistake — costs little and keeps the connection usable; a
// larger one (or one announced larger) is not read, and that client may see the
// connection closed.
const MaxDrainBytes = 4 << 20

func drainOversized(r *http.Request) {
	if r.ContentLength > MaxDrainBytes {
		return
	}
	// A client waiting for 100 Continue has sent no body: reading it would invite
	// the body only to throw it away. The server answers and closes instead.
	if strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, MaxDrainBytes))
}

func tooLarge() *BodyFault {
	return &BodyFault{Status: http.StatusRequestEntityTooLarge,
		Errors: []lockapi.FieldError{{Field: "body", Problem: "must be at most 65536 bytes"}}}
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

// invalid is a fault of a value, as lockapi's validators report one.
func invalid(problem string) error {
	return fmt.Errorf("%w: %s", lockapi.ErrInvalid, problem)
}
