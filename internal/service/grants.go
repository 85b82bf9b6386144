package service

import (
	"lock.dev/internal/grant"
	"lock.dev/internal/serve"
)

// GrantKeys are the public keys a fence point verifies grants with
// (docs/contracts/signed-grants.md), as read from the JWK Set file of a setting.
type GrantKeys struct {
	setting string
	set     *grant.KeySet // nil: grants are not verified
	ignored int           // keys in the file that are not usable Ed25519 keys
}

// ReadGrantKeys reads the JWK Set file path of setting env; an empty path means
// grants are not verified. A file that cannot be read or holds no usable Ed25519
// key is a bad setting (exit 2): a service that quietly fell back to not
// verifying would take any made-up token at its word.
func ReadGrantKeys(env, path string) (GrantKeys, error) {
	k := GrantKeys{setting: env}
	if path == "" {
		return k, nil
	}
	set, ignored, err := grant.ReadKeySet(path)
	if err != nil {
		return k, serve.Invalid(env, "%v", err)
	}
	k.set, k.ignored = set, ignored
	return k, nil
}

// GrantGate is the gate that checks grants with keys. It registers
// grant_rejected_total in the service's registry, verifying or not, and logs what
// it does: the key ids it verifies with, or at WARN (grants_not_verified) that
// the setting is empty.
func (s *Service) GrantGate(keys GrantKeys) (*grant.Gate, error) {
	gate, err := grant.NewGate(keys.set, 0, s.Registry, s.Logger)
	if err != nil {
		return nil, err
	}
	gate.Announce(keys.setting, keys.ignored)
	return gate, nil
}
