package serve

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

// A duration without its unit — `--lock-min-ttl 5`, LOCK_MIN_TTL=5 — is refused
// saying what a duration looks like, from a flag and from a variable alike, with
// exit 2; the flag package alone says only "parse error".
func TestSettingsDurationRefusalSaysWhatADurationIs(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"flag, bare number", []string{"--lock-min-ttl", "5"}, nil, []string{"lock-min-ttl", "want a duration such as 5s or 250ms", "a number needs its unit"}},
		{"variable, bare number", nil, map[string]string{"LOCK_MIN_TTL": "5"}, []string{"LOCK_MIN_TTL", "want a duration such as 5s or 250ms", "a number needs its unit"}},
		{"variable, words", nil, map[string]string{"LOCK_MIN_TTL": "five seconds"}, []string{"LOCK_MIN_TTL", "want a duration such as 5s or 250ms"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := NewSettings("lock-server", func(k string) string { return c.env[k] })
			var d time.Duration
			s.Duration(&d, "LOCK_MIN_TTL", time.Second, "shortest lease TTL")
			_, err := s.Parse(c.args)
			var ue *UsageError
			if !errors.As(err, &ue) || ExitCode(err, io.Discard) != 2 {
				t.Fatalf("got %v, want a usage error (exit 2)", err)
			}
			for _, w := range c.want {
				if !strings.Contains(ue.Msg, w) {
					t.Errorf("%q does not say %q", ue.Msg, w)
				}
			}
			if strings.Contains(ue.Msg, "parse error") {
				t.Errorf("%q still says only \"parse error\"", ue.Msg)
			}
		})
	}
	// a good value still parses, and the default stands without one
	s := NewSettings("x", func(string) string { return "" })
	var d, e time.Duration
	s.Duration(&d, "A_TTL", time.Second, "")
	s.Duration(&e, "B_TTL", 3*time.Second, "")
	if _, err := s.Parse([]string{"--a-ttl=250ms"}); err != nil || d != 250*time.Millisecond || e != 3*time.Second {
		t.Fatalf("got %v, %v, %v; want 250ms and the default 3s", d, e, err)
	}
}

// --help shows each setting once: its flag with the kind of value it takes,
// its variable, its default (once, zero and empty ones included), then what
// it is for.
func TestSettingsUsageShowsKindAndDefaultOnce(t *testing.T) {
	s := NewSettings("x", func(string) string { return "" })
	var (
		str  string
		n    int
		f    float64
		b    bool
		d    time.Duration
		bare string
	)
	s.String(&str, "X_ADDR", ":8080", "address to listen on")
	s.String(&str, "X_FILE", "", "a file; empty: none")
	s.Int(&n, "X_CONNS", 0, "connections")
	s.Float(&f, "X_RATE", 0.5, "a rate, 0..1")
	s.Bool(&b, "X_ON", false, "switch it on")
	s.Duration(&d, "X_TTL", 1500*time.Millisecond, "a lease's TTL")
	s.FlagSet().StringVar(&bare, "out", "", "the `directory` to write to")
	var w bytes.Buffer
	s.Usage(&w, "x [flags]")
	got := w.String()
	for _, want := range []string{
		"--x-addr string", "env X_ADDR (default :8080)\n      address to listen on\n",
		"--x-file string", "env X_FILE (default \"\")\n      a file; empty: none\n",
		"--x-conns int", "env X_CONNS (default 0)\n",
		"--x-rate float", "env X_RATE (default 0.5)\n",
		"--x-on bool", "env X_ON (default false)\n",
		"--x-ttl duration", "env X_TTL (default 1.5s)\n      a lease's TTL\n",
		"--out directory", "(default \"\")\n      the directory to write to\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("usage lacks %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "default"); n != 7 {
		t.Errorf("%d defaults for 7 settings:\n%s", n, got)
	}
	if strings.Count(got, "X_TTL") != 1 {
		t.Errorf("X_TTL named more than once:\n%s", got)
	}
}

// DurationFlag gives a flag set without settings (a subcommand's own flags)
// the same refusal.
func TestDurationFlag(t *testing.T) {
	fs := flag.NewFlagSet("certs", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var d time.Duration
	DurationFlag(fs, &d, "valid", time.Hour, "lifetime")
	if d != time.Hour {
		t.Fatalf("default %v, want 1h", d)
	}
	if err := fs.Parse([]string{"--valid", "720"}); err == nil || !strings.Contains(err.Error(), "want a duration such as 5s or 250ms") {
		t.Fatalf("--valid 720: %v", err)
	}
	if err := fs.Parse([]string{"--valid", "720h"}); err != nil || d != 720*time.Hour {
		t.Fatalf("--valid 720h: %v, %v", d, err)
	}
}
