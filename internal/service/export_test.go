package service

import "testing"

// For roles_stack_test.go (package service_test, which may import the
// services): the logins and the migrate of roles_test.go.

// MakeLogins creates a login per role setting (makeLogins) and returns, for
// each setting, a function giving a database URL with that login.
func MakeLogins(t *testing.T, adminURL string, urls ...string) (Roles, func(dbURL, env string) string) {
	ls := makeLogins(t, adminURL, urls...)
	var envs []string
	for env := range ls {
		envs = append(envs, env)
	}
	return ls.roles(envs...), func(dbURL, env string) string { return ls.url(t, dbURL, env) }
}
