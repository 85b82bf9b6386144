package executor_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/executor"
	"lock.dev/internal/identity"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// idleRelay is an HTTP/1.1 relay in front of rail-proxy that behaves like a
// server whose idle timeout fires just as a request arrives: a request that
// comes on a connection idle for longer than idle is not answered — in "drop"
// mode it is not even read (the connection is closed), in "swallow" mode it is
// forwarded and its answer thrown away before the connection is closed. Every
// other request is relayed, one connection upstream per connection downstream.
type idleRelay struct {
	URL    string
	target string
	idle   time.Duration
	mode   string // "drop" or "swallow"

	mu      sync.Mutex
	unsent  int // requests closed on, unanswered
	relayed int
}

func newIdleRelay(t *testing.T, targetURL string, idle time.Duration, mode string) *idleRelay {
	t.Helper()
	u, err := url.Parse(targetURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &idleRelay{URL: "http://" + ln.Addr().String(), target: u.Host, idle: idle, mode: mode}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { r.serve(c) })
		}
	})
	return r
}

func (r *idleRelay) serve(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("tcp", r.target)
	if err != nil {
		return
	}
	defer up.Close()
	cr, ur := bufio.NewReader(c), bufio.NewReader(up)
	last := time.Now()
	for {
		if _, err := cr.Peek(1); err != nil {
			return
		}
		late := time.Since(last) > r.idle
		if late && r.mode == "drop" {
			r.count(&r.unsent)
			return
		}
		req, err := http.ReadRequest(cr)
		if err != nil {
			return
		}
		if err := req.Write(up); err != nil {
			return
		}
		resp, err := http.ReadResponse(ur, req)
		if err != nil {
			return
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return
		}
		if late { // swallow: rail-proxy answered, the caller hears nothing
			r.count(&r.unsent)
			return
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if err := resp.Write(c); err != nil {
			return
		}
		r.count(&r.relayed)
		last = time.Now()
	}
}

func (r *idleRelay) count(n *int) {
	r.mu.Lock()
	*n++
	r.mu.Unlock()
}

func (r *idleRelay) unanswered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.unsent
}

// A kept-alive connection to rail-proxy that the server side
// closes as idle just as a submission goes out. The executor sends the
// submission once more, same token, on a fresh connection: it is settled in the
// cycle (no `unavailable`, no wait of a lease TTL for the reconcile pass), and
// the rail sees the payout once — also when the first copy did reach the proxy
// ("swallow": the resend is FENCED_OUT by the equal token, and the audit trail
// says what became of the first).
func TestSubmissionResentOnceAfterIdleConnectionClosed(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"drop", "swallow"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			// The relay reads the executor's requests: plaintext.
			st, _ := startPlainStack(t, nil)
			relay := newIdleRelay(t, st.ProxyURL, 300*time.Millisecond, mode)
			prefix := "resend-" + mode
			pc := paymentsAs(st, identity.NamePayoutCreator)
			create := func(id string) {
				if _, err := pc.Create(context.Background(), lockapi.SubmissionRequest{PayoutID: id, AccountID: prefix + "-acct",
					AmountMinor: 4200, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}); err != nil {
					t.Fatal(err)
				}
			}
			ex := startExecutor(t, st, "resender-"+mode, func(c *executor.Config) {
				c.RailProxyURL = relay.URL
				c.Workers = 1
			})
			first, second := prefix+"-1", prefix+"-2"
			create(first)
			testkit.EventuallyState(t, 30*time.Second, first+" PAID", func() (bool, string) {
				s := payout(t, st, first).status
				return s == lockapi.StatusPaid, s
			})
			time.Sleep(900 * time.Millisecond) // the executor's connection to the proxy sits idle
			create(second)
			// The executor counts a payout after its post is answered, so the
			// count is waited for with the status.
			testkit.EventuallyState(t, 30*time.Second, second+" PAID and counted", func() (bool, string) {
				s := payout(t, st, second).status
				return s == lockapi.StatusPaid && ex.metric(t, `executor_payout_total{result="paid"}`) >= 2, s
			})
			if n := relay.unanswered(); n != 1 {
				t.Fatalf("the relay left %d requests unanswered, want 1 (the submission on the idle connection)", n)
			}
			checkPaidOnce(t, st, second)
			for series, want := range map[string]float64{
				`executor_payout_total{result="paid"}`:        2,
				`executor_payout_total{result="unavailable"}`: 0,
				`executor_payout_total{result="fenced"}`:      0,
				"executor_submission_resent_total":            1,
			} {
				if v := ex.metric(t, series); v != want {
					t.Errorf("%s = %v, want %v", series, v, want)
				}
			}
			if ex.logs.contains(`"event":"reconcile_claimed"`, second) {
				t.Errorf("%s was settled by the reconcile pass, not in its cycle", second)
			}
			// One attempt the rail saw; in swallow mode also the resend's FENCED row,
			// with the same token.
			tok, owner := payout(t, st, second).fenceToken, "resender-"+mode
			wantRows := fmt.Sprintf("[ACKED@%d(%s)]", tok, owner)
			if mode == "swallow" {
				wantRows = fmt.Sprintf("[ACKED@%d(%s) FENCED@%d(%s)]", tok, owner, tok, owner)
			}
			if rows := attempts(t, st, second); fmt.Sprint(rows) != wantRows {
				t.Errorf("rows of %s: %v, want %s", second, rows, wantRows)
			}
		})
	}
}

// With a million rows in rail_submission and a payout whose
// trail runs over two pages (150 FENCED attempts before the one the rail
// accepted), an executor still settles the payout whose attempt its claimant
// lost track of: the reconcile pass pages through the trail and adopts it. Not
// parallel: the insert loads the test cluster the package's other tests share
// (their bounds would feel it); it runs before they start, and the rows go when
// it ends.
func TestReconcileSettlesLostAttemptAmongAMillionRows(t *testing.T) {
	st, _ := startStack(t, nil)
	ctx := context.Background()
	t.Cleanup(func() { _, _ = st.Paydb.Exec(context.Background(), "TRUNCATE rail_submission") })
	if _, err := st.Paydb.Exec(ctx, `
		INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor,
		                             currency, beneficiary, outcome, resolved_at)
		SELECT 'filler-' || lpad(g::text, 7, '0'), 'acct-filler', g, 'w', 'k', 1, 'EUR', 'b', 'FENCED', now()
		  FROM generate_series(1, 1000000) g`); err != nil {
		t.Fatal(err)
	}
	const p, acct = "lost-1", "lost-acct"
	if _, err := st.Paydb.Exec(ctx, `
		INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor,
		                             currency, beneficiary, outcome, resolved_at)
		SELECT $1, $2, 1, 'ghost', 'k', 4200, 'EUR', 'NL91ABNA0417164300', 'FENCED', now()
		  FROM generate_series(1, 150)`, p, acct); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Paydb.Exec(ctx, "ANALYZE rail_submission"); err != nil {
		t.Fatal(err)
	}
	// The lost attempt: claimed and submitted under a lease, accepted by the rail,
	// never posted — its claimant died.
	if _, err := paymentsAs(st, identity.NamePayoutCreator).Create(ctx, lockapi.SubmissionRequest{PayoutID: p, AccountID: acct, AmountMinor: 4200,
		Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}); err != nil {
		t.Fatal(err)
	}
	locks, pauser := locksAs(t, st, identity.NameExecutor)
	lease, err := locks.Acquire(ctx, lockapi.AccountLockName(acct), "ghost", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := paymentsAs(st, identity.NameExecutor).ClaimWithGrant(ctx, p, lease.Token(), lease.Grant(), "ghost"); err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(lockapi.SubmissionRequest{PayoutID: p, AccountID: acct, AmountMinor: 4200, Currency: "EUR",
		Beneficiary: "NL91ABNA0417164300"})
	req, _ := http.NewRequest(http.MethodPost, st.ProxyURL+"/v1/rail/submissions", io.NopCloser(bytes.NewReader(body)))
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(lockapi.HeaderFencingToken, fmt.Sprint(lease.Token()))
	req.Header.Set(lockapi.HeaderOwnerID, "ghost")
	req.Header.Set(lockapi.HeaderIdempotencyKey, fmt.Sprintf("%s:%d", p, lease.Token()))
	req.Header.Set(lockapi.HeaderFencingGrant, lease.Grant())
	resp, err := st.HTTPClient(identity.NameExecutor, identity.NameRailProxy).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the lost attempt was answered %d", resp.StatusCode)
	}
	pauser.Freeze(lease) // the claimant is gone: no renewal, no release

	ex := startExecutor(t, st, "reconciler", func(c *executor.Config) { c.Workers = 1 })
	testkit.EventuallyState(t, 60*time.Second, p+" settled", func() (bool, string) {
		s := payout(t, st, p).status
		return s != lockapi.StatusClaimed, s
	})
	checkPaidOnce(t, st, p)
	// The executor counts the payout after its post is answered, a moment after
	// the status can be read.
	testkit.EventuallyState(t, 10*time.Second, p+" counted", func() (bool, string) {
		v := ex.metric(t, `executor_payout_total{result="paid"}`)
		return v > 0, fmt.Sprint(v)
	})
	if v := ex.metric(t, `executor_payout_total{result="paid"}`); v != 1 {
		t.Fatalf(`executor_payout_total{result="paid"} = %v`, v)
	}
	if !ex.logs.contains(`"event":"reconcile_adopted"`, p) {
		t.Fatalf("the payout was not settled by adopting the recorded outcome")
	}
}

// The executor's own post whose answer was lost and that had
// landed is answered PAYOUT_FINAL with the status it posted when tried again:
// that is a success (payout_posted), not a refusal.
func TestLostPostAnswerConfirmedByPayoutFinal(t *testing.T) {
	t.Parallel()
	// The front reads and forwards the executor's posts: plaintext.
	st, _ := startPlainStack(t, nil)
	target, err := url.Parse(st.PaymentURL)
	if err != nil {
		t.Fatal(err)
	}
	// In front of payment-resource: the first post is delivered, its answer lost.
	var once sync.Once
	rp := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lose := false
		if strings.HasSuffix(r.URL.Path, "/post") {
			once.Do(func() { lose = true })
		}
		if !lose {
			rp.ServeHTTP(w, r)
			return
		}
		out, _ := http.NewRequestWithContext(r.Context(), r.Method, st.PaymentURL+r.URL.RequestURI(), r.Body)
		out.Header = r.Header.Clone()
		if resp, err := http.DefaultClient.Do(out); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(front.Close)
	createPayouts(t, st, "lostpost", 1, 1)
	ex := startExecutor(t, st, "poster", func(c *executor.Config) {
		c.PaymentResourceURL = front.URL
		c.Workers = 1
	})
	testkit.EventuallyState(t, 30*time.Second, "the payout PAID", func() (bool, string) {
		s := payout(t, st, "lostpost-000").status
		return s == lockapi.StatusPaid, s
	})
	testkit.EventuallyState(t, 10*time.Second, "the post confirmed", func() (bool, string) {
		return ex.logs.contains(`"event":"payout_posted"`, `"confirmedBy":"PAYOUT_FINAL"`), "not yet"
	})
	if ex.logs.contains(`"event":"post_refused"`) {
		t.Fatalf("the executor's own landed post was logged as refused")
	}
	checkPaidOnce(t, st, "lostpost-000")
}
