package railstub

import (
	"net/http"
	"strings"
	"testing"

	"lock.dev/lockapi"
)

// PUT replaces every knob (an omitted one becomes 0, an omitted seed keeps the
// current one) and answers the settings now in force; GET shows them; bad
// settings are INVALID_REQUEST and change nothing.
func TestChaosAdmin(t *testing.T) {
	t.Parallel()
	ts := startStub(t, func(c *Config) { c.LatencyMs, c.DeclineRate, c.DropRate = 7, 0.5, 0.25 })
	got, err := ts.Client.Chaos(t.Context())
	if err != nil || got != (Chaos{LatencyMs: 7, DeclineRate: 0.5, DropRate: 0.25, Seed: 1}) {
		t.Fatalf("chaos at start = %+v (%v), want the configured knobs and seed 1", got, err)
	}
	seed := int64(-77)
	set, err := ts.Client.SetChaos(t.Context(), 12, 0.125, 1, &seed)
	want := Chaos{LatencyMs: 12, DeclineRate: 0.125, DropRate: 1, Seed: -77}
	if err != nil || set != want {
		t.Fatalf("PUT answered %+v (%v), want %+v", set, err, want)
	}
	if got, _ := ts.Client.Chaos(t.Context()); got != want {
		t.Fatalf("GET after PUT = %+v, want %+v", got, want)
	}
	put := func(body string) reply {
		t.Helper()
		r, err := send(t.Context(), http.DefaultClient, ts.URL, http.MethodPut, "/rail/v1/admin/chaos", "application/json", []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := put(`{"declineRate":0.3}`); r.status != http.StatusOK || strings.TrimSpace(string(r.body)) != `{"latencyMs":0,"declineRate":0.3,"dropRate":0,"seed":-77}` {
		t.Fatalf("PUT with only declineRate = %d %s, want the others 0 and the seed kept", r.status, r.body)
	}
	if r := put(`{}`); r.status != http.StatusOK || strings.TrimSpace(string(r.body)) != `{"latencyMs":0,"declineRate":0,"dropRate":0,"seed":-77}` {
		t.Fatalf("PUT {} = %d %s, want every knob 0 and the seed kept", r.status, r.body)
	}
	if r := put(`{"latencyMs":60000,"declineRate":1,"dropRate":0,"seed":9223372036854775807}`); r.status != http.StatusOK {
		t.Fatalf("PUT at the bounds = %d %s", r.status, r.body)
	}
	inForce, _ := ts.Client.Chaos(t.Context())
	for _, tc := range []struct{ body, field string }{
		{`{"declineRate":1.5}`, "declineRate"},
		{`{"declineRate":-0.1}`, "declineRate"},
		{`{"dropRate":"0.5"}`, "dropRate"},
		{`{"dropRate":null}`, "dropRate"},
		{`{"latencyMs":-1}`, "latencyMs"},
		{`{"latencyMs":1.5}`, "latencyMs"},
		{`{"latencyMs":60001}`, "latencyMs"},
		{`{"seed":1.5}`, "seed"},
		{`{"seed":9223372036854775808}`, "seed"},
		{`{"seed":null}`, "seed"},
		{`{"jitterMs":5}`, "jitterMs"},
		{`{"latencyMs":1,"latencyMs":2}`, "latencyMs"},
		{`{"latencyMs":1}{}`, "body"},
		{`[]`, "body"},
		{`{"latencyMs":`, "body"},
	} {
		p := problem(t, put(tc.body), http.StatusBadRequest, lockapi.CodeInvalidRequest)
		if f := fields(t, p); len(f) != 1 || f[0] != tc.field {
			t.Errorf("%s: fault fields %v, want [%s]", tc.body, f, tc.field)
		}
	}
	r, err := send(t.Context(), http.DefaultClient, ts.URL, http.MethodPut, "/rail/v1/admin/chaos", "text/plain", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	problem(t, r, http.StatusUnsupportedMediaType, lockapi.CodeInvalidRequest)
	if got, _ := ts.Client.Chaos(t.Context()); got != inForce {
		t.Fatalf("a refused PUT changed the settings: %+v, was %+v", got, inForce)
	}
	if ev := ts.logs.events(t, "chaos_changed"); len(ev) != 4 {
		t.Fatalf("%d chaos_changed log lines, want one per accepted PUT (4)", len(ev))
	}
}

// The binder never panics and never lets an out-of-bounds knob through.
func FuzzParseChaosRequest(f *testing.F) {
	for _, s := range []string{`{}`, `{"latencyMs":5,"declineRate":0.5,"dropRate":0.1,"seed":3}`, `{"declineRate":1e-3}`,
		`{"seed":-9223372036854775808}`, `{"latencyMs":1}{}`, `[]`, `{"a":1,"a":2}`, `{"dropRate":"x"}`, `null`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, errs := parseChaosRequest(b)
		if len(errs) > 0 {
			return
		}
		if req.LatencyMs < 0 || req.LatencyMs > MaxLatencyMs || !validRate(req.DeclineRate) || !validRate(req.DropRate) {
			t.Fatalf("%q bound to out-of-bounds %+v", b, req)
		}
	})
}
