package apitest

import (
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// Seen is how often each answer was seen, after waiting for the checks still
// running.
func (c *Checker) Seen() map[Key]int {
	c.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[Key]int, len(c.seen))
	for k, n := range c.seen {
		out[k] = n
	}
	return out
}

// Documented lists every (method, path template, status) the document gives,
// in document order.
func (c *Checker) Documented() []Key { return slices.Clone(c.documented) }

// Missing lists the documented answers never seen, leaving out those the
// caller names as not exercised on purpose.
func (c *Checker) Missing(exempt ...Key) []Key {
	seen := c.Seen()
	var out []Key
	for _, k := range c.Documented() {
		if seen[k] == 0 && !slices.Contains(exempt, k) {
			out = append(out, k)
		}
	}
	return out
}

// Exemption names documented answers a package's tests do not provoke on
// purpose, and why. A zero Method, Path or Status matches any.
type Exemption struct {
	Key
	Reason string
}

// Exempt is an Exemption of method path status ("" or 0 for any) for reason.
func Exempt(method, path string, status int, reason string) Exemption {
	return Exemption{Key: Key{Method: method, Path: path, Status: status}, Reason: reason}
}

// ServeEndpoints500 exempts the 500 INTERNAL of the endpoints internal/serve
// gives every service. They answer from memory — process liveness, the metric
// registry, the embedded document — or, for readiness, 200 or 503 whatever
// their checks return (a failing check is DOWN, not an error): their 500 is only
// serve.Handler's answer to a handler panic, which no test can cause without
// changing the code.
func ServeEndpoints500() []Exemption {
	return []Exemption{
		Exempt("GET", "/livez", 500, "no failure path but a panic"),
		Exempt("GET", "/actuator/health/liveness", 500, "no failure path but a panic"),
		Exempt("GET", "/metrics", 500, "no failure path but a panic"),
		Exempt("GET", "/actuator/prometheus", 500, "no failure path but a panic"),
		Exempt("GET", "/openapi.json", 500, "the document is embedded; api_test.go proves it is there"),
		Exempt("GET", "/readyz", 500, "readiness has no error path but a panic"),
		Exempt("GET", "/actuator/health/readiness", 500, "readiness has no error path but a panic"),
		Exempt("GET", "/actuator/health", 500, "readiness has no error path but a panic"),
	}
}

func (e Exemption) matches(k Key) bool {
	return (e.Method == "" || e.Method == k.Method) && (e.Path == "" || e.Path == k.Path) && (e.Status == 0 || e.Status == k.Status)
}

// Finish ends a package's TestMain, given what m.Run returned, and returns the
// exit code: it fails the run on every finding no test was told of (an
// exchange with a server no test tracked, or one after its test ended) and —
// unless the run was narrowed by -run, -skip or -short, which leave tests out —
// on every documented answer no test provoked and no exemption names. An
// exemption that names no documented answer fails it too, and one whose
// answers were all seen anyway is noted, to be removed.
func (c *Checker) Finish(code int, exempt ...Exemption) int {
	return c.finish(code, narrowed(), os.Stderr, exempt...)
}

func (c *Checker) finish(code int, narrowed bool, out io.Writer, exempt ...Exemption) int {
	c.Wait()
	fail := func(format string, args ...any) {
		fmt.Fprintf(out, "apitest: %s: "+format+"\n", append([]any{c.service}, args...)...)
		if code == 0 {
			code = 1
		}
	}
	for _, f := range c.take(func(Finding) bool { return true }) {
		fail("conformance: %s", f)
	}
	documented := c.Documented()
	seen := c.Seen()
	for _, e := range exempt {
		n, hit := 0, 0
		for _, k := range documented {
			if e.matches(k) {
				n++
				if seen[k] > 0 {
					hit++
				}
			}
		}
		switch {
		case n == 0:
			fail("exemption %s (%s) names no documented answer", e.Key, e.Reason)
		case hit == n && !narrowed:
			fmt.Fprintf(out, "apitest: %s: note: exemption %s is no longer needed: every answer it names was seen\n", c.service, e.Key)
		}
	}
	if narrowed {
		return code
	}
	var missing []string
	for _, k := range documented {
		if seen[k] == 0 && !slices.ContainsFunc(exempt, func(e Exemption) bool { return e.matches(k) }) {
			missing = append(missing, "\t"+k.String())
		}
	}
	if len(missing) > 0 {
		fail("coverage: %d documented answers no test provoked (provoke each, or exempt it with a reason):\n%s",
			len(missing), strings.Join(missing, "\n"))
	}
	return code
}

// narrowed reports whether this test binary runs only some of its tests.
func narrowed() bool {
	for _, name := range []string{"test.run", "test.skip", "test.short", "test.list"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" && f.Value.String() != "false" {
			return true
		}
	}
	return false
}
