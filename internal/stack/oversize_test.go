package stack_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/rawhttp"
	"lock.dev/internal/stack"
	"lock.dev/lockapi"
)

// A body over 64 KiB always gets its 413 problem document, at
// every endpoint that reads a JSON body through lockapi, in every service. Each
// request is sent as most clients send one — the whole request written, then the
// answer read — 50 times each at 70 KiB and at 1 MiB, and a few times without a
// Content-Length (chunked). Not one broken pipe or reset instead of the answer.
func TestOversizedBodyAlwaysAnswered413(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// About body limits, not identity (docs/contracts/workload-identity.md): the
	// requests are sent plaintext, byte by byte.
	s, err := stack.Start(ctx, stack.Options{UnsafeNoAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() }) // after the parallel subtests

	fencing := http.Header{}
	fencing.Set(lockapi.HeaderFencingToken, "7")
	fencing.Set(lockapi.HeaderOwnerID, "exec-a")
	submission := fencing.Clone()
	submission.Set(lockapi.HeaderIdempotencyKey, "p-1:7")
	endpoints := []struct {
		name, url string
		header    http.Header
	}{
		{"rail-proxy submission", s.ProxyURL + "/v1/rail/submissions", submission},
		{"payment-resource create", s.PaymentURL + "/v1/payouts", http.Header{}},
		{"payment-resource post", s.PaymentURL + "/v1/payouts/p-1/post", fencing},
		{"lock-server acquire", s.LockServerURL + "/v1/locks/account:a/acquire", http.Header{lockapi.HeaderOwnerID: {"exec-a"}}},
		{"lock-server renew", s.LockServerURL + "/v1/locks/account:a/renew", fencing},
		{"rail-stub payment", s.StubURL + "/rail/v1/payments", http.Header{}},
		{"rail-stub chaos", s.StubURL + "/rail/v1/admin/chaos", http.Header{}},
	}
	for _, e := range endpoints {
		t.Run(e.name, func(t *testing.T) {
			t.Parallel()
			method := http.MethodPost
			if strings.HasSuffix(e.url, "/chaos") {
				method = http.MethodPut
			}
			for _, size := range []int{70 << 10, 1 << 20} {
				body := oversized(size)
				for i := range 55 {
					chunked := i >= 50
					if err := expect413(method, e.url, e.header, body, chunked); err != nil {
						t.Fatalf("%d bytes, try %d (chunked %v): %v", size, i+1, chunked, err)
					}
				}
			}
		})
	}
}

// expect413 sends one request the way most clients do (rawhttp.SendWhole) and
// checks that the answer is the 413 problem document.
func expect413(method, rawURL string, h http.Header, body []byte, chunked bool) error {
	h = h.Clone()
	h.Set("Content-Type", "application/json")
	status, header, b, err := rawhttp.SendWhole(method, rawURL, h, body, chunked)
	if err != nil {
		return err
	}
	var p struct {
		Status int    `json:"status"`
		Code   string `json:"code"`
	}
	if status != http.StatusRequestEntityTooLarge || header.Get("Content-Type") != "application/problem+json" ||
		json.Unmarshal(b, &p) != nil || p.Status != 413 || p.Code != lockapi.CodeInvalidRequest {
		return fmt.Errorf("answer %d %s %s", status, header.Get("Content-Type"), b)
	}
	return nil
}

// oversized is a well-formed JSON object of size bytes: the size alone is wrong.
func oversized(size int) []byte {
	const head, tail = `{"payoutId":"`, `"}`
	return []byte(head + strings.Repeat("x", size-len(head)-len(tail)) + tail)
}
