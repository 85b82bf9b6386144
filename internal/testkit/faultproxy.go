package testkit

import (
	"net/url"
	"testing"

	"lock.dev/internal/testkit/faultproxy"
)

// FaultProxy starts a TCP fault proxy to target (host:port), closed when t
// ends.
func FaultProxy(t testing.TB, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// FaultProxyURL starts a TCP fault proxy (as FaultProxy) to the host of rawURL,
// a database or service URL, and returns it with rawURL pointed at it.
func FaultProxyURL(t testing.TB, rawURL string) (*faultproxy.Proxy, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	p := FaultProxy(t, u.Host)
	u.Host = p.Addr()
	return p, u.String()
}
