// Package version is the version a binary was built with. It is set at link
// time, once, for every binary of the module:
//
//	go build -ldflags "-X lock.dev/internal/version.version=1.4.0" ./cmd/...
//
// (the Dockerfile passes its VERSION build argument this way). A binary built
// without it, `go run` and `go test` included, is "dev" (docs/contracts/configuration.md).
package version

import "strings"

// version is written by the linker and read by String only: the one piece of
// package state, fixed before main runs.
var version = "dev"

// String is the version this binary was built with, "dev" when none was given.
func String() string {
	if v := strings.TrimSpace(version); v != "" {
		return v
	}
	return "dev"
}

// Requested reports whether args ask for the version: --version or -version
// among the arguments, before a "--" that ends the flags.
func Requested(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "--version", "-version":
			return true
		}
	}
	return false
}
