// Command payment-resource serves payouts and their ledger (docs/contracts/payments.md):
// `payment-resource [serve]` serves, `payment-resource migrate` applies paydb's
// migrations and exits.
package main

import (
	"lock.dev/internal/payment"
	"lock.dev/internal/service"
)

func main() {
	service.Main(payment.ParseConfig, service.Commands[payment.Config]{"serve": payment.Run, "migrate": payment.Migrate})
}
