package rail_test

import (
	"lock.dev/rail"
	"lock.dev/rail/gate"
	"lock.dev/rail/stubjson"
)

// acme is a team's adapter for its own rail. To stay short it speaks
// rail-stub's language under its own name; a real one builds its rail's
// payment, health and statement requests and reads its answers and statement
// pages (docs/integrating-your-rail.md), and passes lock.dev/rail/railtest.
type acme struct{ rail.Adapter }

func (acme) Protocol() string { return "acme" }

// A team's own rail-proxy: the whole of its main. The binary has rail-proxy's
// subcommands (serve, migrate), settings and guarantees; RAIL_PROTOCOL
// defaults to "acme" and may only be set to it.
func Example() {
	gate.Main(acme{stubjson.New()})
}
