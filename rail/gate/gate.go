// Package gate runs rail-proxy — the gate every payment passes before it
// reaches the rail — around a rail adapter (lock.dev/rail). A team whose rail
// speaks a language of its own builds its own rail-proxy binary with it:
//
//	func main() { gate.Main(acme.New()) }
//
// The binary is rail-proxy in everything but the language: the same serve and
// migrate subcommands, the same settings (docs/contracts/configuration.md), the
// same guarantees (docs/contracts/rail-proxy.md, docs/integrating-your-rail.md).
// RAIL_PROTOCOL defaults to the adapter's name and may only be set to it.
package gate

import (
	"context"
	"os"

	"lock.dev/internal/railproxy"
	"lock.dev/internal/service"
	"lock.dev/rail"
)

// Main runs rail-proxy speaking to the rail with a, and exits: serve (the
// default) or migrate, with the settings of rail-proxy's environment and flags.
// A nil a is rail-proxy itself: the built-in adapter RAIL_PROTOCOL names.
func Main(a rail.Adapter) {
	parse := railproxy.ParseConfig
	if a != nil {
		parse = railproxy.ParseConfigWith(a)
	}
	service.Main(parse, service.Commands[railproxy.Config]{
		"serve": func(ctx context.Context, cfg railproxy.Config) error {
			applyMemoryLimit(os.Getenv)
			if err := startPprof(os.Getenv(pprofAddrEnv)); err != nil {
				return err
			}
			return railproxy.Run(ctx, cfg)
		},
		"migrate": railproxy.Migrate,
	})
}
