// Command reconciler closes the books: it reads the rail's statement — through
// rail-proxy, or from the camt.053 files that appear in a directory — and settles
// every AMBIGUOUS payout from it (docs/contracts/reconciliation.md). Subcommands:
// serve (default), migrate, and exceptions (list, show, resolve: an operator's
// view of the reconciliation exceptions and the decisions recorded beside them,
// docs/operations/reconciliation-exceptions.md).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"lock.dev/internal/reconcile"
	"lock.dev/internal/service"
)

func main() {
	// exceptions has verbs and arguments of its own, and none of serve's
	// settings: it is parsed apart from the service's command line.
	if len(os.Args) > 1 && os.Args[1] == reconcile.ExceptionsCommand {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		code := reconcile.Exceptions(ctx, os.Args[2:], os.Getenv, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	service.Main(reconcile.ParseConfig, service.Commands[reconcile.Config]{"serve": reconcile.Run, "migrate": reconcile.Migrate})
}
