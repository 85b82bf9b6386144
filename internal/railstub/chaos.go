package railstub

import (
	"math/rand/v2"
	"sync"

	"lock.dev/internal/jsonbody"
	"lock.dev/lockapi"
)

// Chaos is the set of knobs in force (docs/contracts/rail-stub.md), as PUT and GET
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

// decide draws one call's fate in the order docs/contracts/rail-stub.md pins: the
// first draw decides a decline (no money moves, so nothing to drop); otherwise the
// payment is accepted and a second draw decides whether the connection is dropped
// instead of answered.
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

// parseChaosRequest binds the PUT body as strictly as every other body: one JSON
// object, each member once, no unknown members, nothing after it. Every knob is
// optional: an omitted knob becomes 0, an omitted seed keeps the current one.
func parseChaosRequest(b []byte) (chaosRequest, []lockapi.FieldError) {
	var req chaosRequest
	o, errs := jsonbody.ParseObject(b)
	if errs != nil {
		return req, errs
	}
	latency, _ := o.Int64("latencyMs", false, 0, MaxLatencyMs)
	req.LatencyMs = int(latency)
	req.DeclineRate, _ = o.Float64("declineRate", false, 0, 1)
	req.DropRate, _ = o.Float64("dropRate", false, 0, 1)
	if seed, ok := o.Int64("seed", false, -1<<63, 1<<63-1); ok {
		req.Seed = &seed
	}
	return req, o.Finish()
}
