// Command executor works payouts: it takes account leases from lock-server, claims
// payouts at payment-resource and submits them through rail-proxy (docs/contracts/executor.md).
package main

import (
	"lock.dev/internal/executor"
	"lock.dev/internal/service"
)

func main() {
	service.Main(executor.ParseConfig, service.Commands[executor.Config]{"run": executor.Run})
}
