package demo

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The services' log lockdemo makes in the temp directory is removed after a
// pass, and kept after a failure (or with --keep) with its path said; a file
// --log names is never removed. (Run closes it after every server has stopped:
// close(ok && err == nil && !cfg.Keep).)
func TestServiceLogRemovedAfterAPassOnly(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		named   bool // --log FILE
		passed  bool // a pass without --keep
		removed bool
	}{
		{"made, pass", false, true, true},
		{"made, failure or --keep", false, false, false},
		{"--log, pass", true, true, false},
		{"--log, failure", true, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			path := ""
			if c.named {
				path = filepath.Join(dir, "services.log")
			}
			l, err := openLog(path, dir)
			if err != nil {
				t.Fatal(err)
			}
			if !c.named && !strings.HasPrefix(filepath.Base(l.path), "lockdemo-") {
				t.Fatalf("made %s", l.path)
			}
			if _, err := l.file.WriteString(`{"level":"INFO","msg":"a service"}` + "\n"); err != nil {
				t.Fatal(err)
			}
			if l.removedAfter(c.passed) != c.removed {
				t.Errorf("removedAfter(%t) = %t, want %t", c.passed, !c.removed, c.removed)
			}
			var stderr bytes.Buffer
			l.close(c.passed, newProgress(&stderr))
			_, err = os.Stat(l.path)
			if gone := os.IsNotExist(err); gone != c.removed {
				t.Errorf("file removed %t, want %t (%v)", gone, c.removed, err)
			}
			if said := strings.Contains(stderr.String(), "kept in "+l.path); said == c.passed {
				t.Errorf("stderr %q: where the logs are kept said %t, want %t", stderr.String(), said, !c.passed)
			}
		})
	}
}
