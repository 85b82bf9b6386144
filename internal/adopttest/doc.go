// Package adopttest checks the example of docs/adopting.md from outside: it
// builds examples/adopt — a module of its own that requires lock.dev as a team
// would — and runs it against a real lock-server over mutual TLS, and it checks
// what that module's graph pulls in. It holds tests only.
package adopttest
