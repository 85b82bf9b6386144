package railtest

import "lock.dev/rail"

// check is the suite's body (checks are added here).
func check(a rail.Adapter, h Harness) []Failure {
	return nil
}
