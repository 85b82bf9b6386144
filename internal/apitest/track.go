package apitest

import (
	"net/url"
	"slices"
)

// Wait blocks until every exchange so far has been checked.
func (c *Checker) Wait() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.pending > 0 {
		c.idle.Wait()
	}
}

// waitHost blocks until every exchange so far with host has been checked
// (exchanges of other tests running in parallel do not hold it up).
func (c *Checker) waitHost(host string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.pendingByHost[host] > 0 {
		c.idle.Wait()
	}
}

// Findings are the disagreements found so far, after waiting for the checks
// still running.
func (c *Checker) Findings() []Finding {
	c.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.findings)
}

// TB is the part of testing.TB Report needs.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
}

// Report fails t once per finding.
func (c *Checker) Report(t TB) {
	t.Helper()
	c.Wait()
	for _, f := range c.take(func(Finding) bool { return true }) {
		t.Errorf("%s: %s", c.service, f)
	}
}

// take returns the findings keep accepts that no test was told of yet, and
// marks them told.
func (c *Checker) take(keep func(Finding) bool) []Finding {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Finding
	for i, f := range c.findings {
		if !c.reported[i] && keep(f) {
			c.reported[i] = true
			out = append(out, f)
		}
	}
	return out
}

// CleanupTB is the part of testing.TB Track needs.
type CleanupTB interface {
	TB
	Cleanup(func())
}

// Track gives t the server at baseURL (http://host:port) for as long as t runs:
// a TrackedRoundTripper checks the exchanges with it, and when t ends (its
// Cleanup, so register Track before the cleanup that stops the server: it then
// runs after it) every finding of those exchanges fails t. Tracking the same
// server from several tests is allowed; each is told of what it has not been
// told of yet.
func (c *Checker) Track(t CleanupTB, baseURL string) {
	t.Helper()
	u, err := url.Parse(baseURL)
	if err != nil || u.Host == "" {
		t.Errorf("apitest: Track(%q): not a base URL", baseURL)
		return
	}
	host := u.Host
	c.mu.Lock()
	c.tracked[host]++
	c.mu.Unlock()
	t.Cleanup(func() {
		c.waitHost(host)
		c.mu.Lock()
		if c.tracked[host]--; c.tracked[host] <= 0 {
			delete(c.tracked, host)
		}
		c.mu.Unlock()
		for _, f := range c.take(func(f Finding) bool { return f.Host == host }) {
			t.Errorf("%s conformance: %s", c.service, f)
		}
	})
}

func (c *Checker) isTracked(host string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tracked[host] > 0
}
