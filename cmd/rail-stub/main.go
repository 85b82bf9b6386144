// Command rail-stub is the test double of a payment rail (docs/contracts/rail-stub.md).
package main

import (
	"lock.dev/internal/railstub"
	"lock.dev/internal/service"
)

func main() {
	service.Main(railstub.ParseConfig, service.Commands[railstub.Config]{"serve": railstub.Run})
}
