package railstub

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"

	"lock.dev/lockapi"
)

// Chaos is the set of knobs in force (C3 #ct3-railstub), as PUT and GET
// /rail/v1/admin/chaos show them.
type Chaos struct {
	LatencyMs   int     `json:"latencyMs"`
	DeclineRate float64 `json:"declineRate"`
	DropRate    float64 `json:"dropRate"`
	Seed        int64   `json:"seed"`
}

// decision is what chaos made of one call.
type decision struct {
	declined  bool
	dropped   bool
	latencyMs int // delay before the reply; 0 for a dropped call, which gets no reply
}

// chaos draws the per-call decisions from one seeded generator, so a seed and a
// sequence of calls reproduce the same decisions. Draws happen in arrival order:
// the call log calls decide while it assigns the seq.
type chaos struct {
	mu  sync.Mutex
	cur Chaos
	rng *rand.Rand
}

func newChaos(c Chaos) *chaos {
	return &chaos{cur: c, rng: newRNG(c.Seed)}
}

// newRNG is the generator of a seed. PCG is specified exactly by math/rand/v2, so
// a seed means the same sequence on every Go release that keeps that promise.
func newRNG(seed int64) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(seed), 0x5241494c53545542)) // "RAILSTUB"
}

// randomSeed picks a seed when none was configured; it is logged so a run can be
// replayed.
func randomSeed() int64 { return rand.Int64() }

func (c *chaos) settings() Chaos {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// replace puts new settings in force. A seed, when given, restarts the sequence
// (even when it equals the current one, so a run can be replayed); without one
// the generator carries on where it was.
func (c *chaos) replace(latencyMs int, declineRate, dropRate float64, seed *int64) Chaos {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cur.LatencyMs, c.cur.DeclineRate, c.cur.DropRate = latencyMs, declineRate, dropRate
	if seed != nil {
		c.cur.Seed = *seed
		c.rng = newRNG(*seed)
	}
	return c.cur
}

// decide draws one call's fate in the order C3 pins: the first draw decides a
// decline (no money moves, so nothing to drop); otherwise the payment is accepted
// and a second draw decides whether the connection is dropped instead of answered.
func (c *chaos) decide() decision {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rng.Float64() < c.cur.DeclineRate {
		return decision{declined: true, latencyMs: c.cur.LatencyMs}
	}
	if c.rng.Float64() < c.cur.DropRate {
		return decision{dropped: true}
	}
	return decision{latencyMs: c.cur.LatencyMs}
}

// chaosRequest is the bound body of PUT /rail/v1/admin/chaos.
type chaosRequest struct {
	LatencyMs   int
	DeclineRate float64
	DropRate    float64
	Seed        *int64
}

// parseChaosRequest binds the PUT body as strictly as lockapi binds every other
// body: one JSON object, each member once, no unknown members, nothing after it.
// lockapi's binder has no floating-point member, hence this small one. Every knob
// is optional: an omitted knob becomes 0, an omitted seed keeps the current one.
func parseChaosRequest(b []byte) (chaosRequest, []lockapi.FieldError) {
	var req chaosRequest
	bodyFault := func(p string) (chaosRequest, []lockapi.FieldError) {
		return req, []lockapi.FieldError{{Field: "body", Problem: p}}
	}
	if !json.Valid(b) {
		var v json.RawMessage
		if err := json.NewDecoder(bytes.NewReader(b)).Decode(&v); err == nil {
			return bodyFault("must contain exactly one JSON value (trailing data found)")
		}
		return bodyFault("must be well-formed JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return bodyFault("must be well-formed JSON")
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return bodyFault("must be a JSON object")
	}
	var errs []lockapi.FieldError
	fault := func(field, problem string) { errs = append(errs, lockapi.FieldError{Field: field, Problem: problem}) }
	seen := map[string]bool{}
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return bodyFault("must be well-formed JSON")
		}
		k, _ := kt.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return bodyFault("must be well-formed JSON")
		}
		if seen[k] {
			fault(k, "must appear only once")
			continue
		}
		seen[k] = true
		v := strings.TrimSpace(string(raw))
		switch k {
		case "latencyMs":
			n, p := jsonInt(v, 0, MaxLatencyMs)
			if p != "" {
				fault(k, p)
			}
			req.LatencyMs = int(n)
		case "declineRate", "dropRate":
			r, p := jsonRate(v)
			if p != "" {
				fault(k, p)
			}
			if k == "declineRate" {
				req.DeclineRate = r
			} else {
				req.DropRate = r
			}
		case "seed":
			n, p := jsonInt(v, -1<<63, 1<<63-1)
			if p != "" {
				fault(k, p)
			} else {
				req.Seed = &n
			}
		default:
			fault(k, "is not a known member")
		}
	}
	return req, errs
}

// jsonInt reads a JSON integer literal (no fraction, no exponent) within [min, max];
// the second result is the fault, empty when none.
func jsonInt(v string, min, max int64) (int64, string) {
	if v == "null" {
		return 0, "must not be null"
	}
	if v == "" || strings.ContainsAny(v, ".eE\"") || !(v[0] == '-' || (v[0] >= '0' && v[0] <= '9')) {
		return 0, "must be an integer"
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, "is out of range"
	}
	if n < min || n > max {
		return 0, "must be between " + strconv.FormatInt(min, 10) + " and " + strconv.FormatInt(max, 10)
	}
	return n, ""
}

// jsonRate reads a JSON number within [0, 1].
func jsonRate(v string) (float64, string) {
	if v == "null" {
		return 0, "must not be null"
	}
	if v == "" || !(v[0] == '-' || (v[0] >= '0' && v[0] <= '9')) {
		return 0, "must be a number"
	}
	r, err := strconv.ParseFloat(v, 64)
	if err != nil || !validRate(r) {
		return 0, "must be between 0 and 1"
	}
	return r, ""
}
