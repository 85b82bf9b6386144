package testkit

import (
	"net/http"
	"testing"
	"time"
)

// PollInterval is how often Eventually asks again.
const PollInterval = 20 * time.Millisecond

// Eventually asks cond every PollInterval until it holds, and fails t when
// within passes first, naming what it waited for. It must be called from the
// test's goroutine.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	EventuallyState(t, within, what, func() (bool, string) { return cond(), "" })
}

// EventuallyState is Eventually for a condition that also describes the state
// it saw; the last description is in the failure message.
func EventuallyState(t testing.TB, within time.Duration, what string, cond func() (ok bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if state != "" {
				t.Fatalf("timed out after %s waiting for %s; last state: %s", within, what, state)
			}
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(PollInterval)
	}
}

// WaitHTTP waits until a GET of url through client (http.DefaultClient when
// nil) is answered with status want — with any status when want is 0 — and
// fails t when within passes first. For a server's liveness or readiness.
func WaitHTTP(t testing.TB, client *http.Client, within time.Duration, url string, want int) {
	t.Helper()
	if client == nil {
		client = http.DefaultClient
	}
	EventuallyState(t, within, "GET "+url+" to answer", func() (bool, string) {
		resp, err := client.Get(url)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return want == 0 || resp.StatusCode == want, resp.Status
	})
}
