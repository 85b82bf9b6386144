package stack

import (
	"maps"
	"path/filepath"

	"lock.dev/internal/grant"
)

// GrantEnv makes a key pair in dir with the code of `lock-server keygen` and
// returns the settings that turn signed grants on
// (docs/contracts/signed-grants.md): lock-server signs every grant with the private
// key, rail-proxy and payment-resource verify with the public key set. Merge it
// into Options.Env with MergeEnv.
func GrantEnv(dir string) (map[string]map[string]string, error) {
	if _, err := grant.Keygen(dir); err != nil {
		return nil, err
	}
	keys := filepath.Join(dir, grant.KeySetFile)
	return map[string]map[string]string{
		"lock-server":      {"LOCK_SERVER_SIGNING_KEY_FILE": filepath.Join(dir, grant.SigningKeyFile)},
		"rail-proxy":       {"RAIL_PROXY_GRANT_KEYS_FILE": keys},
		"payment-resource": {"PAYMENT_GRANT_KEYS_FILE": keys},
	}, nil
}

// MergeEnv merges per-service settings; a later map wins for the same variable.
func MergeEnv(envs ...map[string]map[string]string) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, e := range envs {
		for service, vars := range e {
			if out[service] == nil {
				out[service] = map[string]string{}
			}
			maps.Copy(out[service], vars)
		}
	}
	return out
}
