// Command payment-resource serves payouts and their ledger (docs/contracts/payments.md):
// `payment-resource [serve]` serves, `payment-resource migrate` applies paydb's
// migrations and exits.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"lock.dev/internal/payment"
	"lock.dev/internal/serve"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx)
	stop()
	os.Exit(code)
}

func run(ctx context.Context) int {
	cmd, cfg, err := payment.ParseConfig(os.Args[1:], os.Getenv)
	if err == nil {
		switch cmd {
		case "migrate":
			err = payment.Migrate(ctx, cfg)
		default:
			err = payment.Run(ctx, cfg)
		}
	}
	return serve.ExitCode(err, os.Stderr)
}
