package gate_test

import (
	"lock.dev/rail/gate"
	"lock.dev/rail/iso20022"
)

// A rail-proxy binary of a team's own: its main is this line, with the
// team's adapter in place of a built-in one. The binary keeps rail-proxy's
// subcommands, settings and guarantees (docs/integrating-your-rail.md).
func ExampleMain() {
	gate.Main(iso20022.New())
}
