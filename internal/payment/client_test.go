package payment_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/internal/payment"
	"lock.dev/lockapi"
)

// The client never sends an idempotency key, sends the fencing headers on claim
// and post only, JSON bodies only where there is a body.
func TestClientHeaders(t *testing.T) {
	t.Parallel()
	type seen struct {
		method, path, query, body string
		header                    http.Header
	}
	var mu sync.Mutex
	var reqs []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		reqs = append(reqs, seen{r.Method, r.URL.Path, r.URL.RawQuery, string(b), r.Header.Clone()})
		mu.Unlock()
		if r.URL.Path == "/v1/payouts" && r.Method == http.MethodGet {
			lockapi.WriteJSON(w, 200, lockapi.PayoutList{})
			return
		}
		lockapi.WriteJSON(w, 200, lockapi.Payout{PayoutID: "p-1"})
	}))
	defer srv.Close()
	c := payment.NewClient(srv.URL + "/")
	ctx := context.Background()
	before := time.Date(2025, 1, 2, 3, 4, 5, 600, time.FixedZone("X", 3600))
	if _, err := c.Create(ctx, lockapi.SubmissionRequest{PayoutID: "p-1", AccountID: "a", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "p-1"); err != nil {
		t.Fatal(err)
	}
	if l, err := c.List(ctx, "PENDING", "acct-1", &before, 5); err != nil || l == nil {
		t.Fatalf("list: %v %v", l, err)
	}
	if _, err := c.Claim(ctx, "p-1", 42, "exec-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Post(ctx, "p-1", 42, "exec-a", lockapi.PostRequest{Outcome: "PAID", RailReference: ptr("RS-1")}); err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 5 {
		t.Fatalf("%d requests", len(reqs))
	}
	for _, r := range reqs {
		for _, h := range []string{lockapi.HeaderIdempotencyKey, "Idempotency-Key"} {
			if _, ok := r.header[http.CanonicalHeaderKey(h)]; ok {
				t.Errorf("%s %s sent %s", r.method, r.path, h)
			}
		}
		fenced := strings.HasSuffix(r.path, "/claim") || strings.HasSuffix(r.path, "/post")
		if got := r.header.Get(lockapi.HeaderFencingToken); fenced != (got == "42") || fenced != (r.header.Get(lockapi.HeaderOwnerID) == "exec-a") {
			t.Errorf("%s %s: fencing headers %q %q", r.method, r.path, got, r.header.Get(lockapi.HeaderOwnerID))
		}
		hasBody := r.body != ""
		if hasBody != (r.header.Get("Content-Type") == "application/json") {
			t.Errorf("%s %s: body %q with Content-Type %q", r.method, r.path, r.body, r.header.Get("Content-Type"))
		}
	}
	if reqs[2].query != "accountId=acct-1&limit=5&status=PENDING&updatedBefore=2025-01-02T02%3A04%3A05.0000006Z" {
		t.Errorf("list query = %s", reqs[2].query)
	}
	if reqs[3].method != http.MethodPost || reqs[3].path != "/v1/payouts/p-1/claim" || reqs[3].body != "" {
		t.Errorf("claim sent %+v", reqs[3])
	}
	if reqs[4].body != `{"outcome":"PAID","railReference":"RS-1"}` {
		t.Errorf("post body = %s", reqs[4].body)
	}
}

// The transport hazard (docs/contracts/executor.md): a server that reads a request on a kept-alive
// connection and closes it without answering. The client's claim and post are
// each received once, and the caller sees an error. The control shows the same
// setup does produce a silent resend for a request carrying an idempotency key
// and a re-readable body — so the first half would catch the hazard.
func TestClientNoSilentResend(t *testing.T) {
	t.Parallel()
	var hits sync.Map // path → *atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := hits.LoadOrStore(r.URL.Path, &atomic.Int64{})
		n.(*atomic.Int64).Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Method == http.MethodGet {
			lockapi.WriteJSON(w, 200, lockapi.Payout{PayoutID: "p-1"})
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	defer srv.Close()
	count := func(path string) int64 {
		n, ok := hits.Load(path)
		if !ok {
			return 0
		}
		return n.(*atomic.Int64).Load()
	}
	c := payment.NewClient(srv.URL)
	c.HTTP = &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	ctx := context.Background()
	for _, call := range []struct {
		path string
		do   func() error
	}{
		{"/v1/payouts/p-1/claim", func() error { _, err := c.Claim(ctx, "p-1", 7, "exec-a"); return err }},
		{"/v1/payouts/p-1/post", func() error {
			_, err := c.Post(ctx, "p-1", 7, "exec-a", lockapi.PostRequest{Outcome: "PAID", RailReference: ptr("RS-1")})
			return err
		}},
	} {
		if _, err := c.Get(ctx, "p-1"); err != nil { // leaves a kept-alive connection to reuse
			t.Fatal(err)
		}
		err := call.do()
		var p *lockapi.Problem
		if err == nil || errors.As(err, &p) {
			t.Errorf("%s on a dropped connection: err = %v, want a transport error", call.path, err)
		}
		if n := count(call.path); n != 1 {
			t.Errorf("%s received %d times, want 1", call.path, n)
		}
	}

	// Control: same server, a request net/http considers replayable.
	hc := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	get, _ := http.NewRequest(http.MethodGet, srv.URL+"/warm", nil)
	resp, err := hc.Do(get)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/control", bytes.NewReader([]byte(`{}`)))
	req.Header.Set(lockapi.HeaderIdempotencyKey, "k-1")
	if resp, err := hc.Do(req); err == nil {
		resp.Body.Close()
	}
	if n := count("/control"); n < 2 {
		t.Errorf("control: a replayable request was received %d times; the test cannot see a resend", n)
	}
}

// Every call is bounded: a server that never answers costs the caller the
// client's timeout and a deadline error, not a hang. A non-problem error answer
// is an error that is not a *lockapi.Problem.
func TestClientBoundsAndErrors(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/payouts/p-bad" {
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte("upstream down"))
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c := payment.NewClient(srv.URL)
	c.Timeout = 200 * time.Millisecond
	if _, err := c.Get(context.Background(), "p-1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stalled server: err = %v, want a deadline error", err)
	}
	if _, err := c.Claim(context.Background(), "p-1", 1, "o"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stalled server, claim: err = %v, want a deadline error", err)
	}
	_, err := c.Get(context.Background(), "p-bad")
	var p *lockapi.Problem
	if err == nil || errors.As(err, &p) || !strings.Contains(err.Error(), "502") {
		t.Fatalf("502 without a problem body: err = %v", err)
	}
}
