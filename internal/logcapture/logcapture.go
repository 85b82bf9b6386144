// Package logcapture collects a service's JSON log lines in memory so tests can
// assert on the events docs/contracts/observability.md pins.
package logcapture

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
)

// Buffer is an io.Writer several goroutines may write to at once.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Lines decodes every line written so far as a JSON object; a line that is not
// one is returned as {"unparsed": line}, so a test sees it rather than losing it.
func (s *Buffer) Lines() []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader([]byte(s.String())))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		m := map[string]any{}
		if err := json.Unmarshal(line, &m); err != nil {
			m = map[string]any{"unparsed": string(line)}
		}
		out = append(out, m)
	}
	return out
}

// Events returns the lines whose "event" is event.
func (s *Buffer) Events(event string) []map[string]any {
	var out []map[string]any
	for _, l := range s.Lines() {
		if l["event"] == event {
			out = append(out, l)
		}
	}
	return out
}

// Problems are the captured WARN and ERROR lines, at most the last max, one a
// line: what a failing test shows of the services' logs.
func (s *Buffer) Problems(max int) string {
	var out []string
	for _, l := range s.Lines() {
		if lvl, _ := l["level"].(string); lvl == "WARN" || lvl == "ERROR" {
			out = append(out, fmt.Sprint(l))
		}
	}
	if len(out) > max {
		out = out[len(out)-max:]
	}
	return strings.Join(out, "\n")
}
