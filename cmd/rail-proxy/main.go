// Command rail-proxy is fence point (c): the only process permitted to call the
// payment rail (docs/contracts/rail-proxy.md). Subcommands: serve (default), migrate.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"lock.dev/internal/railproxy"
	"lock.dev/internal/serve"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	cmd, cfg, err := railproxy.ParseConfig(os.Args[1:], os.Getenv)
	if err == nil && cmd == "serve" {
		applyMemoryLimit(os.Getenv)
		err = startPprof(os.Getenv(pprofAddrEnv))
	}
	if err == nil {
		switch cmd {
		case "migrate":
			err = railproxy.Migrate(ctx, cfg)
		default:
			err = railproxy.Run(ctx, cfg)
		}
	}
	stop()
	os.Exit(serve.ExitCode(err, os.Stderr))
}
