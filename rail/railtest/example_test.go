package railtest_test

import (
	"fmt"

	"lock.dev/rail"
	"lock.dev/rail/internal/stubharness"
	"lock.dev/rail/railtest"
	"lock.dev/rail/stubjson"
)

// acceptAll reads every reply as an accept: the mistake the suite exists for.
type acceptAll struct{ rail.Adapter }

func (acceptAll) ReadAnswer(rail.Payment, rail.Reply) rail.Answer {
	return rail.Answer{Verdict: rail.Accepted, RailReference: "RS-1"}
}

// An adapter's own tests run the suite with a Harness that writes its rail's
// replies (in a test: railtest.Run(t, adapter, harness)). rail-stub's adapter
// conforms; one that takes a decline for an accept does not.
func ExampleCheck() {
	fmt.Println(len(railtest.Check(stubjson.New(), stubharness.Harness{})))
	broken := railtest.Check(acceptAll{stubjson.New()}, stubharness.Harness{})
	fmt.Println(len(broken) > 0)
	// Output:
	// 0
	// true
}
