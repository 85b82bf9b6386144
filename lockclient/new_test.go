package lockclient_test

import (
	"crypto/tls"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"lock.dev/lockclient"
)

// New refuses a base URL it could only misread, saying what to write instead,
// and options out of their range; a good URL's trailing slashes are dropped.
func TestNewValidatesItsSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url  string
		opts []lockclient.Option
		want string // a substring of the error; "" for none
	}{
		{"https://lock-server:8081", nil, ""},
		{"http://127.0.0.1:8081/", nil, ""},
		{"https://gateway.example/locks/", nil, ""},
		{"lock-server:8081", nil, `lockclient: base URL "lock-server:8081" has no scheme; use https://lock-server:8081`},
		{"127.0.0.1:8081", nil, "has no scheme; use https://127.0.0.1:8081"},
		{"//lock-server:8081", nil, "has no scheme; use https://lock-server:8081"},
		{"", nil, "base URL is empty"},
		{"ftp://lock-server:8081", nil, `has scheme "ftp"`},
		{"https://", nil, "has no host"},
		{"https://:8081", nil, "has no host"},
		{"https://lock-server:8081?x=1", nil, "has a query"},
		{"https://lock-server:8081?", nil, "has a query"},
		{"https://lock-server:8081#top", nil, "has a fragment"},
		{"https://user:secret@lock-server:8081", nil, "user information"},
		{"http://lock-server:8081", []lockclient.Option{lockclient.WithTLSConfig(&tls.Config{})}, "use https://lock-server:8081"},
		{"https://lock-server:8081", []lockclient.Option{lockclient.WithTLSConfig(&tls.Config{}), lockclient.WithHTTPClient(&http.Client{})}, "does not apply"},
		{"https://lock-server:8081", []lockclient.Option{lockclient.WithDriftMargin(0.6)}, "drift margin"},
		{"https://lock-server:8081", []lockclient.Option{lockclient.WithDriftMargin(-0.1)}, "drift margin"},
		{"https://lock-server:8081", []lockclient.Option{lockclient.WithRequestTimeout(0)}, "request timeout"},
		{"https://lock-server:8081", []lockclient.Option{lockclient.WithRequestTimeout(-time.Second)}, "request timeout"},
	} {
		c, err := lockclient.New(tc.url, tc.opts...)
		switch {
		case tc.want == "" && (err != nil || c == nil):
			t.Errorf("New(%q) = %v", tc.url, err)
		case tc.want != "" && (err == nil || c != nil):
			t.Errorf("New(%q) succeeded, want an error saying %q", tc.url, tc.want)
		case tc.want != "" && !strings.Contains(err.Error(), tc.want):
			t.Errorf("New(%q) = %q, want it to say %q", tc.url, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("New(%q) echoes the password: %v", tc.url, err)
		}
	}
}

// New never panics on a base URL, and accepts only an http or https URL with a
// host and no query, fragment or user information. Seeded with the table's URLs.
func FuzzNewBaseURL(f *testing.F) {
	for _, s := range []string{"https://lock-server:8081", "http://127.0.0.1:8081/", "https://gateway.example/locks/",
		"lock-server:8081", "127.0.0.1:8081", "//lock-server:8081", "", "ftp://lock-server:8081", "https://",
		"https://:8081", "https://lock-server:8081?x=1", "https://lock-server:8081#top", "https://user:secret@lock-server:8081"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := lockclient.New(raw)
		if err != nil {
			if c != nil {
				t.Fatalf("New(%q) returned a client and an error", raw)
			}
			return
		}
		u, perr := url.Parse(raw)
		if perr != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" ||
			u.User != nil || u.RawQuery != "" || u.ForceQuery || strings.Contains(raw, "#") {
			t.Fatalf("New(%q) accepted a URL it should refuse (%v)", raw, perr)
		}
	})
}
