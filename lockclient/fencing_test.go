package lockclient_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// SetHeaders puts the lease's token and owner on a request as a fence point
// parses them, replacing what the request carried; without a grant it leaves
// no grant header behind (with one, TestLeaseGrant checks it is the lease's).
func TestSetHeaders(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	c := newClient(t, w.URL)
	for range 2 { // token 2: a token other than the default's 1
		l, err := c.Acquire(context.Background(), "account:h", "exec-1", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	l, err := c.Acquire(context.Background(), "account:h", "exec-9", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	r := httptest.NewRequest(http.MethodPost, "http://resource/v1/payouts/p-1/claim", nil)
	r.Header.Set(lockapi.HeaderFencingToken, "999")
	r.Header.Add(lockapi.HeaderOwnerID, "someone")
	r.Header.Add(lockapi.HeaderOwnerID, "else")
	r.Header.Set(lockapi.HeaderFencingGrant, "another-lease's-grant")
	l.SetHeaders(r)
	f, errs := lockapi.ParseFencingHeaders(r.Header, true, true, false)
	if len(errs) != 0 || f.Token != 3 || f.OwnerID != "exec-9" {
		t.Errorf("the fence point reads %+v %v, want token 3 of exec-9", f, errs)
	}
	if vs := r.Header.Values(lockapi.HeaderFencingGrant); len(vs) != 0 {
		t.Errorf("a lease without a grant left %s %q", lockapi.HeaderFencingGrant, vs)
	}
	var bare http.Request // no header map at all
	l.SetHeaders(&bare)
	if bare.Header.Get(lockapi.HeaderFencingToken) != "3" {
		t.Errorf("on a request without headers: %v", bare.Header)
	}
}

// closeRecorder is a request body that records being closed.
type closeRecorder struct {
	io.Reader
	closed atomic.Bool
}

func (b *closeRecorder) Close() error { b.closed.Store(true); return nil }

// Transport sends every request with the lease's headers, leaving the caller's
// request as it was; once the lease has ended it sends nothing, returns an
// error matching the lease's Err, and closes the body.
func TestTransport(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	l, err := newClient(t, w.URL).Acquire(context.Background(), "account:rt", "exec-1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var seen atomic.Int32
	var token, owner atomic.Value
	resource := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		token.Store(r.Header.Get(lockapi.HeaderFencingToken))
		owner.Store(r.Header.Get(lockapi.HeaderOwnerID))
	}))
	defer resource.Close()
	hc := &http.Client{Transport: l.Transport(resource.Client().Transport)}

	req, _ := http.NewRequest(http.MethodPost, resource.URL+"/write", strings.NewReader("x"))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if token.Load() != strconv.FormatInt(l.Token(), 10) || owner.Load() != "exec-1" {
		t.Errorf("the resource saw token %v owner %v, want %d exec-1", token.Load(), owner.Load(), l.Token())
	}
	if len(req.Header) != 0 {
		t.Errorf("the caller's request was changed: %v", req.Header)
	}

	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	body := &closeRecorder{Reader: strings.NewReader("y")}
	req, _ = http.NewRequest(http.MethodPost, resource.URL+"/write", body)
	if resp, err := hc.Do(req); err == nil || !errors.Is(err, lockclient.ErrReleased) {
		if resp != nil {
			resp.Body.Close()
		}
		t.Errorf("a request under a released lease: %v, want ErrReleased", err)
	}
	if n := seen.Load(); n != 1 {
		t.Errorf("the resource received %d requests, want 1 (none after the release)", n)
	}
	if !body.closed.Load() {
		t.Error("the refused request's body was not closed")
	}
}
