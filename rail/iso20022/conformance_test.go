package iso20022_test

import (
	"testing"

	"lock.dev/rail/iso20022"
	"lock.dev/rail/railtest"
)

// The ISO 20022 adapter passes the conformance suite against a bank's
// pain.002 and camt.053 replies.
func TestConformance(t *testing.T) {
	railtest.Run(t, iso20022.New(), harness{})
}
