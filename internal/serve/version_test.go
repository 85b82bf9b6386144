package serve

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// --version answers before any setting is read: a bad environment variable does
// not stop it, it prints one line, and ExitCode makes it exit 0 with nothing on
// stderr (docs/contracts/configuration.md).
func TestSettingsVersion(t *testing.T) {
	env := map[string]string{"RAIL_READ_TIMEOUT": "not-a-duration"}
	s := NewSettings("x", func(k string) string { return env[k] })
	var out bytes.Buffer
	s.stdout = &out
	var d time.Duration
	s.Duration(&d, "RAIL_READ_TIMEOUT", 2*time.Second, "read bound")
	_, err := s.Parse([]string{"--version"})
	if !errors.Is(err, ErrVersion) {
		t.Fatalf("Parse(--version) = %v, want ErrVersion", err)
	}
	if out.String() != "dev\n" {
		t.Fatalf("--version printed %q, want one line \"dev\"", out.String())
	}
	var stderr bytes.Buffer
	if code := ExitCode(err, &stderr); code != 0 || stderr.Len() != 0 {
		t.Fatalf("ExitCode(ErrVersion) = %d with stderr %q, want 0 and nothing", code, stderr.String())
	}
}
