package railstub

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// Two calls with the same reference are two payments: the stub is
// non-idempotent, and each call is booked with every field and announced in the
// log with the beneficiary masked.
func TestPaymentAcceptedIsBookedEveryTime(t *testing.T) {
	t.Parallel()
	ts := startStub(t, nil)
	p := payment("p-1001")
	var refs []string
	for range 2 {
		r := pay(t, ts, p)
		if r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
			t.Fatalf("status %d %s, want 200 JSON: %s", r.status, r.header.Get("Content-Type"), r.body)
		}
		var m map[string]any
		if err := json.Unmarshal(r.body, &m); err != nil {
			t.Fatal(err)
		}
		ref, _ := m["railReference"].(string)
		if m["status"] != "ACCEPTED" || !strings.HasPrefix(ref, "RS-") || len(m) != 2 {
			t.Fatalf("reply = %s, want exactly {status: ACCEPTED, railReference: RS-…}", r.body)
		}
		refs = append(refs, ref)
	}
	if refs[0] == refs[1] {
		t.Fatalf("two payments got the same rail reference %s", refs[0])
	}
	cs := calls(t, ts)
	if len(cs) != 2 {
		t.Fatalf("booked %d calls, want 2 (the same reference twice is two payments)", len(cs))
	}
	for i, c := range cs {
		if c.Seq != int64(i+1) || c.Reference != p.Reference || c.AccountID != p.AccountID || c.AmountMinor != p.AmountMinor ||
			c.Currency != p.Currency || c.Beneficiary != p.Beneficiary || c.Result != ResultAccepted ||
			c.RailReference != refs[i] || c.LatencyMs != 0 || c.Dropped || time.Since(c.ReceivedAt) > time.Minute {
			t.Fatalf("call %d = %+v", i, c)
		}
	}
	raw, err := send(t.Context(), http.DefaultClient, ts.URL, http.MethodGet, "/rail/v1/calls", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(raw.body), `"reason":null`) != 2 {
		t.Fatalf("an accepted call's reason is not null on the wire: %s", raw.body)
	}
	logs := ts.logs.events(t, "rail_call")
	if len(logs) != 2 {
		t.Fatalf("%d rail_call log lines, want 2", len(logs))
	}
	l := logs[0]
	if l["level"] != "INFO" || l["service"] != "rail-stub" || l["reference"] != p.Reference || l["accountId"] != p.AccountID ||
		l["result"] != ResultAccepted || l["dropped"] != false || l["beneficiary"] != "****4300" {
		t.Fatalf("rail_call log line = %v", l)
	}
	if strings.Contains(ts.logs.String(), p.Beneficiary) {
		t.Fatal("the full beneficiary appears in the log")
	}
}

// declineRate 1: every call is answered 422 DECLINED and booked as DECLINED with
// no rail reference; a decline is never also dropped.
func TestDeclineRateOneDeclinesAndBooks(t *testing.T) {
	t.Parallel()
	ts := startStub(t, func(c *Config) { c.DeclineRate, c.DropRate = 1, 1 })
	r := pay(t, ts, payment("p-1"))
	if r.status != http.StatusUnprocessableEntity {
		t.Fatalf("status %d, want 422: %s", r.status, r.body)
	}
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatal(err)
	}
	if m["status"] != "DECLINED" || m["reason"] == "" || len(m) != 2 {
		t.Fatalf("reply = %s, want exactly {status: DECLINED, reason}", r.body)
	}
	cs := calls(t, ts)
	if len(cs) != 1 || cs[0].Result != ResultDeclined || cs[0].RailReference != "" || cs[0].Dropped {
		t.Fatalf("calls = %+v, want one DECLINED, not dropped, no reference", cs)
	}
	raw, err := send(t.Context(), http.DefaultClient, ts.URL, http.MethodGet, "/rail/v1/calls", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw.body), `"railReference":null`) {
		t.Fatalf("a declined call's railReference is not null on the wire: %s", raw.body)
	}
	// docs/contracts/rail-stub.md: the call object carries the decline reason, the
	// one the caller was told.
	if cs[0].Reason != m["reason"] || !strings.Contains(string(raw.body), `"reason":"`+DeclineReason+`"`) {
		t.Fatalf("a declined call's reason on the wire is not the reply's %q: %s", m["reason"], raw.body)
	}
}

// dropRate 1: the caller sees a dropped connection (EOF or reset, no status), yet
// the payment is booked ACCEPTED with its reference and dropped=true. Repeated on
// one client, the stub still sees each call exactly once (no transport replay).
func TestDropRateOneDropsAfterBooking(t *testing.T) {
	t.Parallel()
	ts := startStub(t, func(c *Config) { c.DropRate, c.LatencyMs = 1, 10 })
	hc := &http.Client{Timeout: 10 * time.Second}
	const n = 3
	for i := range n {
		r, err := send(t.Context(), hc, ts.URL, http.MethodPost, "/rail/v1/payments", "application/json", mustJSON(t, payment("p-"+string(rune('a'+i)))))
		if err == nil {
			t.Fatalf("got status %d %s, want a dropped connection", r.status, r.body)
		}
		if !isDropped(err) {
			t.Fatalf("error %v is not a dropped connection", err)
		}
	}
	cs := calls(t, ts)
	if len(cs) != n {
		t.Fatalf("booked %d calls, want %d", len(cs), n)
	}
	for _, c := range cs {
		if c.Result != ResultAccepted || !c.Dropped || !strings.HasPrefix(c.RailReference, "RS-") || c.LatencyMs != 0 {
			t.Fatalf("call = %+v, want ACCEPTED, dropped, with a reference, no latency", c)
		}
	}
	l := ts.logs.events(t, "rail_call")
	if len(l) != n || l[0]["dropped"] != true {
		t.Fatalf("rail_call logs = %v", l)
	}
}

// Record first: a call whose reply is still being delayed is already in the
// books, and stays there as a payment when the caller gives up waiting.
func TestLateReplyIsBookedBeforeTheReply(t *testing.T) {
	t.Parallel()
	ts := startStub(t, func(c *Config) { c.LatencyMs = 5_000 })
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	body := mustJSON(t, payment("p-late")) // on the test's goroutine: mustJSON may end the test
	go func() {
		_, err := send(ctx, http.DefaultClient, ts.URL, http.MethodPost, "/rail/v1/payments", "application/json", body)
		done <- err
	}()
	testkit.Eventually(t, 5*time.Second, "the call to be booked", func() bool { return len(calls(t, ts)) == 1 })
	select {
	case err := <-done:
		t.Fatalf("the reply arrived before the test looked (err %v); latency was not applied", err)
	default:
	}
	cancel() // the caller gives up, as a proxy's read timeout would
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("client error = %v, want context.Canceled", err)
	}
	c := calls(t, ts)[0]
	if c.Result != ResultAccepted || c.Dropped || c.LatencyMs != 5_000 || c.RailReference == "" {
		t.Fatalf("call = %+v, want ACCEPTED with latencyMs 5000", c)
	}
}

// Latency delays every reply that is sent, accept and decline alike.
func TestLatencyDelaysEveryReply(t *testing.T) {
	t.Parallel()
	const latency = 50 * time.Millisecond
	ts := startStub(t, func(c *Config) { c.LatencyMs = int(latency / time.Millisecond) })
	start := time.Now()
	if r := pay(t, ts, payment("p-1")); r.status != http.StatusOK {
		t.Fatalf("status %d", r.status)
	}
	if el := time.Since(start); el < latency {
		t.Fatalf("accept answered after %v, want ≥ %v", el, latency)
	}
	if _, err := ts.Client.SetChaos(t.Context(), int(latency/time.Millisecond), 1, 0, nil); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if r := pay(t, ts, payment("p-2")); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("status %d", r.status)
	}
	if el := time.Since(start); el < latency {
		t.Fatalf("decline answered after %v, want ≥ %v", el, latency)
	}
	for _, c := range calls(t, ts) {
		if c.LatencyMs != 50 {
			t.Fatalf("call %d latencyMs = %d, want 50", c.Seq, c.LatencyMs)
		}
	}
}

// The same seed and rates give the same decisions, call for call, on two stubs;
// re-putting the seed replays the sequence; another seed gives another one.
func TestSeedReproducesDecisions(t *testing.T) {
	t.Parallel()
	const n = 120
	run := func(ts *testStub) []string {
		t.Helper()
		for i := range n {
			_, err := ts.Client.Pay(t.Context(), payment("p-"+string(rune('A'+i%26))))
			if err != nil && !isDropped(err) {
				t.Fatalf("pay: %v", err)
			}
		}
		cs := calls(t, ts)
		if len(cs) != n {
			t.Fatalf("booked %d, want %d", len(cs), n)
		}
		seq := make([]string, n)
		for i, c := range cs {
			seq[i] = c.Result
			if c.Dropped {
				seq[i] = "DROPPED"
			}
		}
		return seq
	}
	chaosWith := func(seed int64) func(*Config) {
		return func(c *Config) { c.Seed, c.DeclineRate, c.DropRate = &seed, 0.3, 0.3 }
	}
	a, b, other := startStub(t, chaosWith(42)), startStub(t, chaosWith(42)), startStub(t, chaosWith(43))
	seqA, seqB, seqOther := run(a), run(b), run(other)
	if strings.Join(seqA, ",") != strings.Join(seqB, ",") {
		t.Fatalf("seed 42 gave two sequences:\n%v\n%v", seqA, seqB)
	}
	if strings.Join(seqA, ",") == strings.Join(seqOther, ",") {
		t.Fatal("seeds 42 and 43 gave the same sequence")
	}
	kinds := map[string]int{}
	for _, k := range seqA {
		kinds[k]++
	}
	if kinds[ResultAccepted] == 0 || kinds[ResultDeclined] == 0 || kinds["DROPPED"] == 0 {
		t.Fatalf("sequence lacks a kind of decision: %v", kinds)
	}
	// Replay on a: reset, put the seed again, same calls → same sequence.
	if err := a.Client.Reset(t.Context()); err != nil {
		t.Fatal(err)
	}
	seed := int64(42)
	if _, err := a.Client.SetChaos(t.Context(), 0, 0.3, 0.3, &seed); err != nil {
		t.Fatal(err)
	}
	if again := run(a); strings.Join(again, ",") != strings.Join(seqA, ",") {
		t.Fatalf("re-seeding did not replay the sequence:\n%v\n%v", seqA, again)
	}
}

// Malformed payments are refused with INVALID_REQUEST and never booked: they did
// not get far enough to move money.
func TestMalformedPaymentsAreRefusedAndNotBooked(t *testing.T) {
	t.Parallel()
	ts := startStub(t, nil)
	good := `{"reference":"p-1","accountId":"acct-7","amountMinor":100,"currency":"EUR","beneficiary":"NL91ABNA0417164300"}`
	cases := []struct {
		name, contentType, body string
		status                  int
		field                   string
	}{
		{"no content type", "", good, 415, "Content-Type"},
		{"text content type", "text/plain", good, 415, "Content-Type"},
		{"too large", "application/json", `{"reference":"` + strings.Repeat("x", 70_000) + `"}`, 413, "body"},
		{"not JSON", "application/json", `{"reference":`, 400, "body"},
		{"empty body", "application/json", ``, 400, "body"},
		{"array", "application/json", `[1]`, 400, "body"},
		{"trailing data", "application/json", good + `{}`, 400, "body"},
		{"unknown member", "application/json", strings.Replace(good, `"reference"`, `"token":1,"reference"`, 1), 400, "token"},
		{"duplicate member", "application/json", strings.Replace(good, `"reference":"p-1"`, `"reference":"p-1","reference":"p-2"`, 1), 400, "reference"},
		{"missing reference", "application/json", strings.Replace(good, `"reference":"p-1",`, ``, 1), 400, "reference"},
		{"bad reference", "application/json", strings.Replace(good, `"p-1"`, `"p 1"`, 1), 400, "reference"},
		{"null accountId", "application/json", strings.Replace(good, `"acct-7"`, `null`, 1), 400, "accountId"},
		{"zero amount", "application/json", strings.Replace(good, `100`, `0`, 1), 400, "amountMinor"},
		{"fractional amount", "application/json", strings.Replace(good, `100`, `100.5`, 1), 400, "amountMinor"},
		{"amount as string", "application/json", strings.Replace(good, `100`, `"100"`, 1), 400, "amountMinor"},
		{"amount above 10^15", "application/json", strings.Replace(good, `100`, `1000000000000001`, 1), 400, "amountMinor"},
		{"lower-case currency", "application/json", strings.Replace(good, `"EUR"`, `"eur"`, 1), 400, "currency"},
		{"empty beneficiary", "application/json", strings.Replace(good, `"NL91ABNA0417164300"`, `""`, 1), 400, "beneficiary"},
	}
	for _, tc := range cases {
		r, err := send(t.Context(), http.DefaultClient, ts.URL, http.MethodPost, "/rail/v1/payments", tc.contentType, []byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		p := problem(t, r, tc.status, lockapi.CodeInvalidRequest)
		if f := fields(t, p); len(f) == 0 || f[0] != tc.field {
			t.Errorf("%s: fault fields %v, want %s first", tc.name, f, tc.field)
		}
	}
	if cs := calls(t, ts); len(cs) != 0 {
		t.Fatalf("malformed payments were booked: %+v", cs)
	}
	// A good one after them is seq 1: the refused ones consumed nothing.
	pay(t, ts, payment("p-1"))
	if cs := calls(t, ts); len(cs) != 1 || cs[0].Seq != 1 {
		t.Fatalf("calls = %+v, want one with seq 1", cs)
	}
}

// 64 goroutines pay at once, with declines and drops: every call is booked once,
// seqs are 1..N without gap or repeat, every answer the callers saw matches its
// booking, and the decisions were drawn in seq order (the same sequence one seeded
// generator gives when drawn one by one). The file holds the same calls.
func TestConcurrentCallsAreBookedInArrivalOrder(t *testing.T) {
	t.Parallel()
	const workers, per = 64, 25
	path := t.TempDir() + "/calls.jsonl"
	seed := int64(99)
	ts := startStub(t, func(c *Config) { c.Seed, c.DeclineRate, c.DropRate, c.CallLogPath = &seed, 0.2, 0.1, path })
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	var mu sync.Mutex
	seen := map[string]int{} // what callers saw: ACCEPTED, DECLINED, DROPPED
	acceptedRefs := map[string]bool{}
	// The bodies are made on the test's goroutine: mustJSON may end the test.
	bodies := make([][][]byte, workers)
	for w := range workers {
		bodies[w] = make([][]byte, per)
		for i := range per {
			bodies[w][i] = mustJSON(t, payment("p-"+string(rune('a'+w%26))+"-"+string(rune('a'+i%26))))
		}
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range per {
				r, err := send(context.Background(), hc, ts.URL, http.MethodPost, "/rail/v1/payments", "application/json", bodies[w][i])
				kind := ""
				switch {
				case isDropped(err):
					kind = "DROPPED"
				case err != nil:
					t.Errorf("pay: %v", err)
					return
				case r.status == http.StatusOK:
					kind = ResultAccepted
					var rep PaymentReply
					if err := json.Unmarshal(r.body, &rep); err != nil {
						t.Errorf("reply: %v", err)
					}
					mu.Lock()
					acceptedRefs[rep.RailReference] = true
					mu.Unlock()
				case r.status == http.StatusUnprocessableEntity:
					kind = ResultDeclined
				default:
					t.Errorf("status %d: %s", r.status, r.body)
					return
				}
				mu.Lock()
				seen[kind]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	cs := calls(t, ts)
	if len(cs) != workers*per {
		t.Fatalf("booked %d calls, sent %d", len(cs), workers*per)
	}
	replay := newChaos(Chaos{DeclineRate: 0.2, DropRate: 0.1, Seed: seed})
	booked := map[string]int{}
	refs := map[string]bool{}
	for i, c := range cs {
		if c.Seq != int64(i+1) {
			t.Fatalf("call %d has seq %d: seqs are not 1..N in order", i, c.Seq)
		}
		d := replay.decide()
		if d.declined != (c.Result == ResultDeclined) || d.dropped != c.Dropped {
			t.Fatalf("seq %d booked %s dropped=%v, but the seeded sequence says declined=%v dropped=%v",
				c.Seq, c.Result, c.Dropped, d.declined, d.dropped)
		}
		kind := c.Result
		if c.Dropped {
			kind = "DROPPED"
		}
		booked[kind]++
		if c.RailReference != "" {
			if refs[c.RailReference] {
				t.Fatalf("rail reference %s booked twice", c.RailReference)
			}
			refs[c.RailReference] = true
		}
		if kind == ResultAccepted && !acceptedRefs[c.RailReference] {
			t.Fatalf("seq %d booked as answered ACCEPTED with %s, but no caller received that reference", c.Seq, c.RailReference)
		}
	}
	for _, k := range []string{ResultAccepted, ResultDeclined, "DROPPED"} {
		if seen[k] != booked[k] {
			t.Fatalf("callers saw %v, the books say %v", seen, booked)
		}
	}
	// The file holds exactly the calls in memory: a stub started on it loads them.
	cfg := DefaultConfig()
	cfg.CallLogPath, cfg.LogOutput = path, &syncBuffer{}
	reloaded, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer reloaded.Close()
	got := reloaded.calls.list(0, MaxPageLimit)
	if len(got) != len(cs) {
		t.Fatalf("file holds %d calls, memory %d", len(got), len(cs))
	}
	for i := range got {
		if !sameCall(got[i], cs[i]) {
			t.Fatalf("file call %d = %+v, memory %+v", i, got[i], cs[i])
		}
	}
}

// sameCall compares two calls, the instant of receivedAt rather than its
// representation.
func sameCall(a, b Call) bool {
	if !a.ReceivedAt.Equal(b.ReceivedAt) {
		return false
	}
	a.ReceivedAt, b.ReceivedAt = time.Time{}, time.Time{}
	return a == b
}
