// Command reconciler closes the books: it reads the rail's statement through
// rail-proxy and settles every AMBIGUOUS payout from it
// (docs/contracts/reconciliation.md). Subcommands: serve (default), migrate.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"lock.dev/internal/reconcile"
	"lock.dev/internal/serve"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	cmd, cfg, err := reconcile.ParseConfig(os.Args[1:], os.Getenv)
	if err == nil {
		switch cmd {
		case "migrate":
			err = reconcile.Migrate(ctx, cfg)
		default:
			err = reconcile.Run(ctx, cfg)
		}
	}
	stop()
	os.Exit(serve.ExitCode(err, os.Stderr))
}
