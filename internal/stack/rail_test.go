package stack_test

import (
	"context"
	"strings"
	"testing"

	"lock.dev/internal/stack"
)

// A rail protocol or statement source the stack does not know is refused before
// anything starts, naming the option.
func TestStartRefusesUnknownRail(t *testing.T) {
	t.Parallel()
	for _, o := range []stack.Options{{RailProtocol: "swift"}, {StatementSource: "sftp"}} {
		s, err := stack.Start(context.Background(), o)
		if err == nil {
			_ = s.Close()
			t.Fatalf("%+v started", o)
		}
		if !strings.Contains(err.Error(), "RailProtocol") && !strings.Contains(err.Error(), "StatementSource") {
			t.Errorf("%+v: %v, want the option named", o, err)
		}
	}
}
