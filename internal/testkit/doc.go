// Package testkit is the one test kit of the module: a metric reader that
// parses the Prometheus exposition with expfmt (metrics.go), one polling wait
// for a fact (eventually.go), the re-exec TestMain of the cmd/ tests
// (reexec.go) and the cancelled synchronous-replication wait (syncwait.go). Its
// TCP fault proxy is the subpackage faultproxy, which has no testing import so
// that pgcluster's standby relay — also used by lockdemo — is the same code;
// faultproxy.go here binds one to a test's lifetime.
//
// It is an ordinary package imported by tests, and by the stack and demo code
// that reads a service's metrics.
package testkit
