// Command rail-proxy is fence point (c): the only process permitted to call the
// payment rail (docs/contracts/rail-proxy.md). Subcommands: serve (default), migrate.
// It speaks the built-in adapter RAIL_PROTOCOL names (stub or iso20022); a rail
// of another language gets a binary of its own (lock.dev/rail/gate,
// docs/integrating-your-rail.md).
package main

import "lock.dev/rail/gate"

func main() { gate.Main(nil) }
