package lockclient

import (
	"fmt"
	"net/http"

	"lock.dev/lockapi"
)

// SetHeaders puts the lease on r as a fence point reads it: X-Fencing-Token,
// X-Owner-Id and, when lock-server signed the grant, X-Fencing-Grant
// (docs/contracts/signed-grants.md). Values r already had under those names are
// replaced, and a grant header is removed when the lease has no grant, so a
// request built from another lease's never presents a grant that is not this
// token's.
func (l *Lease) SetHeaders(r *http.Request) {
	if r.Header == nil {
		r.Header = http.Header{}
	}
	grant := l.Grant()
	for k, vs := range lockapi.FencingHeaders(l.token, grant, l.owner) {
		r.Header[k] = vs
	}
	if grant == "" {
		r.Header.Del(lockapi.HeaderFencingGrant)
	}
}

// Transport returns a RoundTripper that sends each request through base
// (http.DefaultTransport when nil) with the lease's headers set as SetHeaders
// sets them, on a copy: the caller's request is left as it was.
//
// Once the lease has ended — lost, expired or released — it sends nothing and
// returns an error matching Err(). That refusal only spares a resource a write
// it would reject; it is not what makes writes safe, since a lease can end on
// the server while this process still believes in it. The resource's
// comparison of tokens is.
func (l *Lease) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &fencedTransport{l: l, base: base}
}

type fencedTransport struct {
	l    *Lease
	base http.RoundTripper
}

func (t *fencedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if err := t.l.Err(); err != nil {
		if r.Body != nil {
			r.Body.Close() // a RoundTripper closes the body, also when it fails
		}
		return nil, fmt.Errorf("lockclient: not sending %s %s under lease %s token %d: %w",
			r.Method, r.URL.Redacted(), t.l.name, t.l.token, err)
	}
	r2 := r.Clone(r.Context())
	t.l.SetHeaders(r2)
	return t.base.RoundTrip(r2)
}
