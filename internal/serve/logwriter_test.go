package serve

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// lockedBuffer is an io.Writer safe for the writer's goroutine and the test.
type lockedBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	writes int
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes++
	return l.b.Write(p)
}

// The batching log writer loses no line, splits none, and keeps each writer's
// lines in order, also when a burst goes past its buffer bound; Close writes
// what is left, and lines after Close are written directly.
func TestLogWriterKeepsEveryLineInOrder(t *testing.T) {
	t.Parallel()
	out := &lockedBuffer{}
	w := NewLogWriter(out)
	const writers, lines = 8, 2000
	pad := strings.Repeat("x", 200) // 8 × 2000 × ~210 B: several times maxLogBatch
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range lines {
				fmt.Fprintf(w, "%d %d %s\n", g, i, pad)
			}
		})
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(w, "after close\n")
	out.mu.Lock()
	defer out.mu.Unlock()
	got := strings.Split(strings.TrimSuffix(out.b.String(), "\n"), "\n")
	if len(got) != writers*lines+1 || got[len(got)-1] != "after close" {
		t.Fatalf("%d lines written, want %d, last %q", len(got), writers*lines+1, got[len(got)-1])
	}
	next := make([]int, writers)
	for _, l := range got[:len(got)-1] {
		var g, i int
		var p string
		if _, err := fmt.Sscanf(l, "%d %d %s", &g, &i, &p); err != nil || p != pad || g < 0 || g >= writers {
			t.Fatalf("line split or mangled: %.60q", l)
		}
		if i != next[g] {
			t.Fatalf("writer %d: line %d after line %d", g, i, next[g]-1)
		}
		next[g]++
	}
	if out.writes >= writers*lines {
		t.Logf("no batching happened: %d writes for %d lines", out.writes, writers*lines)
	}
}
