package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHealthcheck(t *testing.T) {
	ready := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/moved":
			http.Redirect(w, r, "/readyz", http.StatusFound)
		case r.Method == http.MethodGet && r.URL.Path == "/readyz" && ready:
			_, _ = w.Write([]byte(`{"status":"UP"}`))
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"status":"DOWN"}`))
		}
	}))
	defer srv.Close()
	// A port nothing listens on: bind one, then close it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/readyz"
	_ = ln.Close()

	for _, tc := range []struct {
		name   string
		args   []string
		before func()
		code   int
		stderr string
	}{
		{"ready", []string{srv.URL + "/readyz"}, nil, 0, ""},
		{"not ready", []string{srv.URL + "/readyz"}, func() { ready = false }, 1, "answered 503"},
		{"redirect not followed", []string{srv.URL + "/moved"}, func() { ready = true }, 1, "answered 302"},
		{"nothing listening", []string{closed}, nil, 1, "healthcheck:"},
		{"no url", nil, nil, 2, "usage"},
		{"not a url", []string{"/readyz"}, nil, 2, "not an http(s) URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.before != nil {
				tc.before()
			}
			var stdout, stderr bytes.Buffer
			if code := run(tc.args, &stdout, &stderr); code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.stderr) {
				t.Fatalf("stderr %q does not say %q", stderr.String(), tc.stderr)
			}
		})
	}
}

// --help, -help and -h are a request for the usage, not a URL that fails to
// parse: the usage on stdout and exit 0, nothing on stderr.
func TestHealthcheckHelp(t *testing.T) {
	for _, arg := range []string{"--help", "-help", "-h"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{arg}, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "usage: healthcheck URL") || stderr.Len() != 0 {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want the usage on stdout and exit 0", arg, code, stdout.String(), stderr.String())
		}
	}
}

func TestHealthcheckVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--version"}, &stdout, &stderr); code != 0 || stdout.String() != "dev\n" {
		t.Fatalf("--version: exit %d, stdout %q", code, stdout.String())
	}
}
