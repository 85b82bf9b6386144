// Command reconciler closes the books: it reads the rail's statement — through
// rail-proxy, or from the camt.053 files that appear in a directory — and settles
// every AMBIGUOUS payout from it (docs/contracts/reconciliation.md). Subcommands:
// serve (default), migrate.
package main

import (
	"lock.dev/internal/reconcile"
	"lock.dev/internal/service"
)

func main() {
	service.Main(reconcile.ParseConfig, service.Commands[reconcile.Config]{"serve": reconcile.Run, "migrate": reconcile.Migrate})
}
