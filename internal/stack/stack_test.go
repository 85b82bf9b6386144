package stack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	"lock.dev/internal/payment"
	"lock.dev/internal/stack"
	"lock.dev/lockapi"
)

func TestMain(m *testing.M) {
	stack.ChildMain(nil)
	os.Exit(m.Run())
}

func submit(t *testing.T, proxyURL, payout string, token int64) (int, string) {
	t.Helper()
	body, _ := json.Marshal(lockapi.SubmissionRequest{PayoutID: payout, AccountID: "acct-1", AmountMinor: 100, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"})
	req, _ := http.NewRequest(http.MethodPost, proxyURL+"/v1/rail/submissions", io.NopCloser(bytes.NewReader(body)))
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(lockapi.HeaderFencingToken, fmt.Sprint(token))
	req.Header.Set(lockapi.HeaderOwnerID, stackOwner)
	req.Header.Set(lockapi.HeaderIdempotencyKey, fmt.Sprintf("%s:%d", payout, token))
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("submit %s/%d: %v", payout, token, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(b, &p)
	return resp.StatusCode, p.Code
}

// stackOwner is the owner the tests claim and submit as.
const stackOwner = "stack-test"

// book creates payout as submit presents it and claims it with token, so that
// rail-proxy's books check (on, as the stack leaves it) admits it.
func book(t *testing.T, ctx context.Context, s *stack.Stack, payout string, token int64) {
	t.Helper()
	pc := payment.NewClient(s.PaymentURL)
	if _, err := pc.Create(ctx, lockapi.SubmissionRequest{PayoutID: payout, AccountID: "acct-1", AmountMinor: 100,
		Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}); err != nil {
		t.Fatalf("create %s: %v", payout, err)
	}
	claim(t, ctx, s, payout, token)
}

func claim(t *testing.T, ctx context.Context, s *stack.Stack, payout string, token int64) {
	t.Helper()
	if _, err := payment.NewClient(s.PaymentURL).Claim(ctx, payout, token, stackOwner); err != nil {
		t.Fatalf("claim %s with token %d: %v", payout, token, err)
	}
}

// The whole system comes up on a throwaway cluster; a crashed rail-proxy (SIGKILL)
// comes back on the same address and still fences the lower token: the mark lives
// in paydb, not in the process.
func TestStackCrashProxyKeepsTheMark(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// About the mark outliving a crash, not identity
	// (docs/contracts/workload-identity.md): plaintext, tokens without grants.
	s, err := stack.Start(ctx, stack.Options{ProxyAsChild: true, UnsafeNoAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	book(t, ctx, s, "p-1", 5)
	if st, code := submit(t, s.ProxyURL, "p-1", 5); st != 200 {
		t.Fatalf("first submission: %d %s", st, code)
	}
	if err := s.CrashProxy(ctx); err != nil {
		t.Fatal(err)
	}
	book(t, ctx, s, "p-2", 4)
	if st, code := submit(t, s.ProxyURL, "p-2", 4); st != 409 || code != lockapi.CodeFencedOut {
		t.Fatalf("lower token after crash: %d %s, want 409 FENCED_OUT", st, code)
	}
	claim(t, ctx, s, "p-2", 6)
	if st, code := submit(t, s.ProxyURL, "p-2", 6); st != 200 {
		t.Fatalf("higher token after crash: %d %s", st, code)
	}
	calls, err := s.Stub.Calls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 || calls[0].Reference != "p-1" || calls[1].Reference != "p-2" {
		t.Fatalf("rail saw %+v, want p-1 then p-2", calls)
	}
	for _, u := range []string{s.LockServerURL, s.PaymentURL, s.StubURL, s.ProxyURL} {
		resp, err := http.Get(u + "/readyz")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s not ready: %v", u, err)
		}
		resp.Body.Close()
	}
}
