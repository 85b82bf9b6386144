package executor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/jsonbody"
	"lock.dev/lockapi"
)

func sampleSubmission(id string) lockapi.SubmissionRequest {
	return lockapi.SubmissionRequest{PayoutID: id, AccountID: "acct-1", AmountMinor: 1250, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}
}

// closingProxy is a raw TCP server that plays rail-proxy at the level the hazard
// lives on. It answers submissions of payouts whose id starts with "ok" on a
// kept-alive connection, and for any other payout reads the whole request and then
// closes the connection without a byte of answer. It counts every request it read,
// by idempotency key.
type closingProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	seen  map[string]int
	conns int
	wg    sync.WaitGroup
}

func newClosingProxy(t *testing.T) *closingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &closingProxy{ln: ln, seen: map[string]int{}}
	s.wg.Go(s.accept)
	t.Cleanup(func() { ln.Close(); s.wg.Wait() })
	return s
}

func (s *closingProxy) url() string { return "http://" + s.ln.Addr().String() }

func (s *closingProxy) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns++
		s.mu.Unlock()
		s.wg.Go(func() { s.serve(c) })
	}
}

func (s *closingProxy) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		key := req.Header.Get(lockapi.HeaderIdempotencyKey)
		s.mu.Lock()
		s.seen[key]++
		s.mu.Unlock()
		var sub lockapi.SubmissionRequest
		_ = json.Unmarshal(body, &sub)
		if !strings.HasPrefix(sub.PayoutID, "ok") {
			return // read it all, answer nothing, close: the rail may have acted
		}
		ans, _ := json.Marshal(lockapi.SubmissionAccepted{SubmissionID: 1, PayoutID: sub.PayoutID,
			AccountID: sub.AccountID, PresentedToken: 1, Outcome: lockapi.OutcomeAcked, RailReference: "RS-1"})
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(ans), ans)
	}
}

func (s *closingProxy) count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[key]
}

func (s *closingProxy) connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}

// The transport hazard (docs/contracts/executor.md): a submission whose connection
// is closed by the server after it read the request must reach the server once,
// never twice. The control half shows the test can see the hazard: the same
// exchange with a re-readable body (what http.NewRequest gives an in-memory body)
// is resent by net/http.
func TestSubmissionIsNeverResentOnAReusedConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("executor client", func(t *testing.T) {
		t.Parallel()
		srv := newClosingProxy(t)
		c := newProxyClient(srv.url(), 4, nil)
		defer c.close()
		if a := c.submit(ctx, sampleSubmission("ok-1"), 7, "exec-a"); a.kind != answerAccepted {
			t.Fatalf("first submission: answer %v (%v), want accepted", a.kind, a.err)
		}
		// The second goes out on the kept-alive connection of the first; the
		// server reads it and hangs up.
		a := c.submit(ctx, sampleSubmission("drop-2"), 8, "exec-a")
		if a.kind != answerNone || a.err == nil {
			t.Fatalf("second submission: answer %v, want no answer with an error", a.kind)
		}
		// Told apart from other failures: a reused connection, no byte of answer
		// (the executor's own, deliberate resend then decides; see
		// TestSubmissionResentOnceAfterIdleConnectionClosed).
		if !a.staleConn {
			t.Fatalf("second submission: the failure on the reused connection was not recognised (%v)", a.err)
		}
		if n := srv.count("drop-2:8"); n != 1 {
			t.Fatalf("the server read the submission %d times, want exactly 1", n)
		}
		if n := srv.connections(); n != 1 {
			t.Fatalf("%d connections were opened, want 1 (the second request reused the first's)", n)
		}
	})

	t.Run("control: a re-readable body is resent", func(t *testing.T) {
		t.Parallel()
		srv := newClosingProxy(t)
		hc := newProxyClient(srv.url(), 4, nil).hc
		defer hc.CloseIdleConnections()
		send := func(id string, token int64) error {
			b, _ := json.Marshal(sampleSubmission(id))
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.url()+"/v1/rail/submissions", bytes.NewReader(b))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(lockapi.HeaderIdempotencyKey, idempotencyKey(id, token))
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			return resp.Body.Close()
		}
		if err := send("ok-1", 7); err != nil {
			t.Fatal(err)
		}
		_ = send("drop-2", 8)
		if n := srv.count("drop-2:8"); n < 2 {
			t.Fatalf("control: the naive request reached the server %d times; the test no longer shows the hazard", n)
		}
	})
}

// What a submission carries: the three fencing headers, the idempotency key
// {payoutId}:{token}, JSON with a known length, the five fields and nothing else.
func TestSubmissionRequestShape(t *testing.T) {
	t.Parallel()
	var got *http.Request
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		body, _ = io.ReadAll(r.Body)
		lockapi.WriteJSON(w, 200, lockapi.SubmissionAccepted{SubmissionID: 3, PayoutID: "p-9", Outcome: lockapi.OutcomeAcked, RailReference: "RS-9"})
	}))
	defer srv.Close()
	c := newProxyClient(srv.URL+"/", 1, nil)
	defer c.close()
	a := c.submit(context.Background(), sampleSubmission("p-9"), 42, "host-1:77")
	if a.kind != answerAccepted || a.railReference != "RS-9" {
		t.Fatalf("answer %v %q (%v), want accepted RS-9", a.kind, a.railReference, a.err)
	}
	if got.Method != http.MethodPost || got.URL.Path != "/v1/rail/submissions" {
		t.Fatalf("request %s %s", got.Method, got.URL.Path)
	}
	for h, want := range map[string]string{
		lockapi.HeaderFencingToken:   "42",
		lockapi.HeaderOwnerID:        "host-1:77",
		lockapi.HeaderIdempotencyKey: "p-9:42",
		"Content-Type":               "application/json",
	} {
		if vs := got.Header.Values(h); len(vs) != 1 || vs[0] != want {
			t.Errorf("header %s = %q, want exactly %q", h, vs, want)
		}
	}
	if got.ContentLength != int64(len(body)) || len(got.TransferEncoding) != 0 {
		t.Errorf("Content-Length %d, transfer encoding %v; want the length of the body (%d), not chunked", got.ContentLength, got.TransferEncoding, len(body))
	}
	req, errs := jsonbody.ParseSubmissionRequest(body)
	if len(errs) != 0 || req != sampleSubmission("p-9") {
		t.Errorf("body %s parses as %+v, faults %v", body, req, errs)
	}
}

// problemAnswer writes a problem document the way rail-proxy does.
func problemAnswer(status int, code string, members map[string]any) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		lockapi.WriteProblem(w, lockapi.NewProblem(status, code, "scripted", members))
	}
}

// Every answer of docs/contracts/rail-proxy.md is read as what it is; anything else — a code
// with the wrong status, a 200 that is not an acceptance of this payout, an
// unknown code, a non-problem error — is no answer, never a guess.
func TestParseAnswer(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		h     http.HandlerFunc
		kind  answerKind
		check func(t *testing.T, a submitAnswer)
	}{
		{"accepted", func(w http.ResponseWriter, _ *http.Request) {
			lockapi.WriteJSON(w, 200, lockapi.SubmissionAccepted{SubmissionID: 5, PayoutID: "p-1", AccountID: "acct-1", PresentedToken: 7, Outcome: "ACKED", RailReference: "RS-5"})
		}, answerAccepted, func(t *testing.T, a submitAnswer) {
			if a.railReference != "RS-5" || a.submissionID == nil || *a.submissionID != 5 {
				t.Errorf("reference %q submission %v", a.railReference, a.submissionID)
			}
		}},
		{"fenced", problemAnswer(409, lockapi.CodeFencedOut, map[string]any{"presentedToken": 7, "highestToken": 9, "submissionId": 6}),
			answerFenced, func(t *testing.T, a submitAnswer) {
				if a.highestToken == nil || *a.highestToken != 9 {
					t.Errorf("highestToken %v", a.highestToken)
				}
			}},
		{"duplicate acked", problemAnswer(409, lockapi.CodeDuplicateSubmission, map[string]any{"submissionId": 8, "firstSubmissionId": 2,
			"firstSubmittedAt": time.Now().UTC(), "firstOutcome": "ACKED", "firstRailReference": "RS-2"}),
			answerDuplicate, func(t *testing.T, a submitAnswer) {
				if a.firstOutcome == nil || *a.firstOutcome != "ACKED" || a.firstRailReference == nil || *a.firstRailReference != "RS-2" {
					t.Errorf("first outcome %v reference %v", a.firstOutcome, a.firstRailReference)
				}
			}},
		{"duplicate unresolved", problemAnswer(409, lockapi.CodeDuplicateSubmission, map[string]any{"submissionId": 8, "firstSubmissionId": 2,
			"firstSubmittedAt": time.Now().UTC(), "firstOutcome": nil, "firstRailReference": nil}),
			answerDuplicate, func(t *testing.T, a submitAnswer) {
				if a.firstOutcome != nil {
					t.Errorf("first outcome %v, want null", *a.firstOutcome)
				}
			}},
		{"rejected", problemAnswer(422, lockapi.CodeRailRejected, map[string]any{"submissionId": 4, "declineReason": "insufficient funds"}),
			answerRejected, func(t *testing.T, a submitAnswer) {
				if a.declineReason == nil || *a.declineReason != "insufficient funds" {
					t.Errorf("decline reason %v", a.declineReason)
				}
			}},
		{"ambiguous", problemAnswer(409, lockapi.CodeRailAmbiguous, map[string]any{"submissionId": 4}), answerAmbiguous, nil},
		{"unavailable", problemAnswer(503, lockapi.CodeRailUnavailable, map[string]any{"stage": "dial", "submissionId": 4}),
			answerUnavailable, func(t *testing.T, a submitAnswer) {
				if a.stage != "dial" {
					t.Errorf("stage %q", a.stage)
				}
			}},
		{"invalid", func(w http.ResponseWriter, _ *http.Request) {
			lockapi.WriteInvalid(w, 400, []lockapi.FieldError{{Field: "X-Fencing-Token", Problem: "is required"}})
		}, answerInvalid, nil},
		// Not one of the six: no answer.
		{"fenced with 200 status", problemAnswer(200, lockapi.CodeFencedOut, nil), answerNone, nil},
		{"ambiguous with 503 status", problemAnswer(503, lockapi.CodeRailAmbiguous, nil), answerNone, nil},
		{"internal", problemAnswer(500, lockapi.CodeInternal, nil), answerNone, nil},
		{"database unavailable", problemAnswer(503, lockapi.CodeUnavailable, nil), answerNone, nil},
		{"bad gateway, plain text", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "bad gateway", http.StatusBadGateway)
		}, answerNone, nil},
		{"200 not ACKED", func(w http.ResponseWriter, _ *http.Request) {
			lockapi.WriteJSON(w, 200, lockapi.SubmissionAccepted{PayoutID: "p-1", Outcome: "TIMEOUT", RailReference: "RS-1"})
		}, answerNone, nil},
		{"200 without reference", func(w http.ResponseWriter, _ *http.Request) {
			lockapi.WriteJSON(w, 200, lockapi.SubmissionAccepted{PayoutID: "p-1", Outcome: "ACKED"})
		}, answerNone, nil},
		{"200 for another payout", func(w http.ResponseWriter, _ *http.Request) {
			lockapi.WriteJSON(w, 200, lockapi.SubmissionAccepted{PayoutID: "p-2", Outcome: "ACKED", RailReference: "RS-1"})
		}, answerNone, nil},
		{"200 garbage", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"outcome":`))
		}, answerNone, nil},
		{"duplicate with a malformed first outcome", problemAnswer(409, lockapi.CodeDuplicateSubmission, map[string]any{"firstOutcome": 3}), answerNone, nil},
		{"duplicate with what the first attempt presented", problemAnswer(409, lockapi.CodeDuplicateSubmission, dupeMembers("ACKED", "RS-2", nil)),
			answerDuplicate, func(t *testing.T, a submitAnswer) {
				if d := a.first.differs(testPayout); len(d) != 0 {
					t.Errorf("the first attempt's fields read as %+v, differing in %v from the payout's", a.first, d)
				}
			}},
		{"duplicate from an older rail-proxy: the first attempt's fields unreported", problemAnswer(409, lockapi.CodeDuplicateSubmission,
			dupeMembers("ACKED", "RS-2", map[string]any{"firstAccountId": nil, "firstAmountMinor": nil, "firstCurrency": nil, "firstBeneficiary": nil})),
			answerDuplicate, func(t *testing.T, a submitAnswer) {
				if a.first.accountID != nil || a.first.amountMinor != nil || a.first.currency != nil || a.first.beneficiary != nil {
					t.Errorf("unreported fields read as %+v", a.first)
				}
			}},
		{"duplicate with a malformed first amount", problemAnswer(409, lockapi.CodeDuplicateSubmission,
			dupeMembers("ACKED", "RS-2", map[string]any{"firstAmountMinor": "100"})), answerNone, nil},
		{"not in the books", problemAnswer(409, lockapi.CodeNotInBooks, map[string]any{"submissionId": 11, "presentedToken": 7, "mismatch": "beneficiary"}),
			answerUnbooked, func(t *testing.T, a submitAnswer) {
				if a.mismatch != lockapi.MismatchBeneficiary || a.submissionID == nil || *a.submissionID != 11 {
					t.Errorf("mismatch %q submission %v", a.mismatch, a.submissionID)
				}
			}},
		{"not in the books with a 400 status", problemAnswer(400, lockapi.CodeNotInBooks, map[string]any{"mismatch": "token"}), answerNone, nil},
		{"not in the books without a mismatch", problemAnswer(409, lockapi.CodeNotInBooks, map[string]any{"submissionId": 11}), answerNone, nil},
		{"not in the books with a malformed mismatch", problemAnswer(409, lockapi.CodeNotInBooks, map[string]any{"mismatch": 3}), answerNone, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(tc.h)
			defer srv.Close()
			c := newProxyClient(srv.URL, 1, nil)
			defer c.close()
			a := c.submit(context.Background(), sampleSubmission("p-1"), 7, "exec-a")
			if a.kind != tc.kind {
				t.Fatalf("answer %v (err %v), want %v", a.kind, a.err, tc.kind)
			}
			if tc.kind == answerNone && a.err == nil {
				t.Fatalf("no answer without a reason")
			}
			if tc.check != nil {
				tc.check(t, a)
			}
		})
	}
}

// A submission that outlives its bound is no answer, and the call returns at the bound.
func TestSubmissionBoundedByItsContext(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c := newProxyClient(srv.URL, 1, nil)
	defer c.close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	a := c.submit(ctx, sampleSubmission("p-1"), 7, "exec-a")
	if a.kind != answerNone || !errors.Is(a.err, context.DeadlineExceeded) {
		t.Fatalf("answer %v err %v, want no answer with the deadline", a.kind, a.err)
	}
}

// The audit trail is read page by page (docs/contracts/executor.md: next names the
// submissionId to pass as after), and a trail that does not read as one — rows of
// another payout, rows out of order, a next that does not follow its page — is an
// error, never a guess.
func TestAuditTrail(t *testing.T) {
	t.Parallel()
	acked, timeout, fenced := lockapi.OutcomeAcked, lockapi.OutcomeTimeout, lockapi.OutcomeFenced
	ref := "RS-1"
	rows := []lockapi.Submission{
		{SubmissionID: 1, PayoutID: "p/1 x", PresentedToken: 3, Outcome: &fenced},
		{SubmissionID: 4, PayoutID: "p/1 x", PresentedToken: 3, Outcome: &fenced},
		{SubmissionID: 7, PayoutID: "p/1 x", PresentedToken: 4, Outcome: &acked, RailReference: &ref},
		{SubmissionID: 9, PayoutID: "p/1 x", PresentedToken: 5, Outcome: &timeout},
		{SubmissionID: 12, PayoutID: "p/1 x", PresentedToken: 6, Outcome: &fenced},
	}
	var (
		mu      sync.Mutex
		queries []string
		tamper  func(l *lockapi.SubmissionList)
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/v1/rail/submissions" {
			http.NotFound(w, r)
			return
		}
		q := r.URL.Query()
		mu.Lock()
		queries = append(queries, q.Get("payoutId")+"|"+q.Get("after"))
		tf := tamper
		mu.Unlock()
		var after int64
		fmt.Sscan(q.Get("after"), &after)
		var page lockapi.SubmissionList
		page.Submissions = []lockapi.Submission{}
		for _, s := range rows {
			if s.SubmissionID > after && len(page.Submissions) < 2 {
				page.Submissions = append(page.Submissions, s)
			}
		}
		if n := len(page.Submissions); n == 2 && page.Submissions[1].SubmissionID != rows[len(rows)-1].SubmissionID {
			next := page.Submissions[1].SubmissionID
			page.Next = &next
		}
		if tf != nil {
			tf(&page)
		}
		lockapi.WriteJSON(w, 200, page)
	}))
	defer srv.Close()
	c := newProxyClient(srv.URL, 1, nil)
	defer c.close()
	subs, err := c.submissions(context.Background(), "p/1 x")
	if err != nil {
		t.Fatal(err)
	}
	if len(subs) != len(rows) || subs[4].SubmissionID != 12 {
		t.Fatalf("read %d rows %+v, want all %d", len(subs), subs, len(rows))
	}
	if fmt.Sprint(queries) != "[p/1 x| p/1 x|4 p/1 x|9]" {
		t.Fatalf("pages asked for: %q", queries)
	}
	if fw := forwardable(subs); fw == nil || fw.SubmissionID != 7 {
		t.Fatalf("forwardable row %+v, want submission 7 (the first row the index covers)", fw)
	}
	if fw := forwardable(subs[:2]); fw != nil {
		t.Fatalf("a FENCED row was taken as forwardable")
	}
	for name, tf := range map[string]func(l *lockapi.SubmissionList){
		"a row of another payout": func(l *lockapi.SubmissionList) { l.Submissions[0].PayoutID = "other" },
		"rows out of order": func(l *lockapi.SubmissionList) {
			if len(l.Submissions) == 2 {
				l.Submissions[0], l.Submissions[1] = l.Submissions[1], l.Submissions[0]
			}
		},
		"next behind its page": func(l *lockapi.SubmissionList) {
			if l.Next != nil {
				back := *l.Next - 1
				l.Next = &back
			}
		},
		"next on an empty page": func(l *lockapi.SubmissionList) {
			one := int64(1)
			l.Submissions, l.Next = []lockapi.Submission{}, &one
		},
	} {
		mu.Lock()
		tamper = tf
		mu.Unlock()
		if _, err := c.submissions(context.Background(), "p/1 x"); err == nil {
			t.Errorf("%s: the trail was accepted", name)
		}
	}
	// A trail that never ends is not read for ever.
	mu.Lock()
	tamper = func(l *lockapi.SubmissionList) {
		last := l.Submissions[len(l.Submissions)-1].SubmissionID
		l.Next = &last
	}
	rows = append(rows[:0:0], rows...)
	for i := range 2 * maxTrailPages * 2 {
		rows = append(rows, lockapi.Submission{SubmissionID: int64(100 + i), PayoutID: "p/1 x", Outcome: &fenced})
	}
	mu.Unlock()
	if _, err := c.submissions(context.Background(), "p/1 x"); err == nil || !strings.Contains(err.Error(), "pages") {
		t.Errorf("a trail of more than %d pages: %v", maxTrailPages, err)
	}
}
