package gate

import (
	"runtime/debug"
)

// defaultMemoryLimit is rail-proxy's soft memory limit when GOMEMLIMIT is not
// set (docs/contracts/rail-proxy.md#performance). Go's collector lets the heap
// grow to twice what is live — and counts goroutine stacks in what is live, so a
// burst of submissions in flight, each holding a goroutine, doubles into garbage
// that is only collected late. Near the limit the collector runs sooner; far below
// it (every steady load measured) nothing changes. It is a soft limit: the
// runtime never fails an allocation over it, and caps the collector's CPU at half.
const defaultMemoryLimit = 48 << 20

// applyMemoryLimit sets the default unless the operator set GOMEMLIMIT (which the
// runtime has already applied).
func applyMemoryLimit(getenv func(string) string) {
	if getenv("GOMEMLIMIT") != "" {
		return
	}
	debug.SetMemoryLimit(defaultMemoryLimit)
}
