// Command rail-proxy is fence point (c): the only process permitted to call the
// payment rail (docs/contracts/rail-proxy.md). Subcommands: serve (default), migrate.
package main

import (
	"context"
	"os"

	"lock.dev/internal/railproxy"
	"lock.dev/internal/service"
)

func main() {
	service.Main(railproxy.ParseConfig, service.Commands[railproxy.Config]{
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
