package railproxy

import (
	"lock.dev/internal/grant"
	"lock.dev/internal/serve"
)

// loadGrantKeys reads RAIL_PROXY_GRANT_KEYS_FILE (docs/contracts/signed-grants.md):
// nil when it is empty. A file that cannot be read or holds no usable Ed25519 key
// is a bad setting (exit 2): a proxy that quietly fell back to not verifying would
// take any made-up token at its word.
func loadGrantKeys(path string) (*grant.KeySet, int, error) {
	if path == "" {
		return nil, 0, nil
	}
	set, ignored, err := grant.ReadKeySet(path)
	if err != nil {
		return nil, 0, serve.Invalid("RAIL_PROXY_GRANT_KEYS_FILE", "%v", err)
	}
	return set, ignored, nil
}
