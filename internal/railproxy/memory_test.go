package railproxy

import (
	"bytes"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// A submission waiting for the rail is one goroutine of the real binary, and
// its stack stays at 8 KiB (docs/contracts/rail-proxy.md#performance, memory).
// Two things grew it to 16 KiB for the whole wait, 2,000 times over in the
// bench's burst: the dial of a new rail connection on the submission's own
// goroutine (the deepest call it makes), and submit's 2.5 KiB frame of log
// arguments. Every submission here is of a fresh account and dials its own
// connection, as in the burst; the rail holds every call until the stacks have
// been read. The binary is built without -race, which has stacks of its own.
func TestInflightSubmissionsKeepSmallStacks(t *testing.T) {
	t.Parallel()
	const n = 500
	hold := newHoldingRail(t)
	dbURL := pgtest.PaydbURL(t)

	// About the memory of submissions in flight, of made-up payouts: the books
	// check is off.
	url, stderr, _ := startBinary(t, "UNSAFE_NON_DURABLE_DB=true", "PAYDB_URL="+dbURL, "RAIL_BASE_URL="+hold.URL,
		"LOG_LEVEL=error", "RAIL_READ_TIMEOUT=20s", "RAIL_PROXY_BOOKS_CHECK=false")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * n}, Timeout: time.Minute}
	before := metricAt(t, url, "go_memstats_stack_inuse_bytes")

	var wg sync.WaitGroup
	statuses := make([]int, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			body := newPayout(fmt.Sprintf("p-stack-%d", i), fmt.Sprintf("acct-stack-%d", i)).body()
			req, _ := http.NewRequest(http.MethodPost, url+"/v1/rail/submissions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(lockapi.HeaderFencingToken, "1")
			req.Header.Set(lockapi.HeaderOwnerID, "w")
			req.Header.Set(lockapi.HeaderIdempotencyKey, fmt.Sprintf("k-%d", i))
			resp, err := client.Do(req)
			if err != nil {
				errs[i] = err
				return
			}
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		})
	}
	hold.waitCalls(t, n) // every submission admitted, its connection dialled, its call held
	inflight := metricAt(t, url, "rail_submission_inflight")
	during := metricAt(t, url, "go_memstats_stack_inuse_bytes")
	if before < 0 || during < 0 {
		t.Fatal("go_memstats_stack_inuse_bytes is not exposed")
	}
	hold.release()
	wg.Wait()
	for i := range n {
		if errs[i] != nil || statuses[i] != http.StatusOK {
			t.Fatalf("submission %d: status %d, error %v; stderr: %s", i, statuses[i], errs[i], stderr.String())
		}
	}
	if inflight != n {
		t.Fatalf("rail_submission_inflight = %v while the rail held %d calls", inflight, n)
	}
	perSub := (during - before) / n
	t.Logf("goroutine stacks: %.1f MiB before, %.1f MiB with %d in flight: %.1f KiB each",
		before/(1<<20), during/(1<<20), n, perSub/1024)
	// 8 KiB stacks come to 9.5–11.5 KiB each here (the pool's new connections
	// and the workers' stacks are shared out too); 16 KiB ones to 16.5 and more.
	if perSub > 13<<10 {
		t.Fatalf("each submission in flight holds %.1f KiB of goroutine stack; want at most 13 KiB (an 8 KiB stack)", perSub/1024)
	}
}
