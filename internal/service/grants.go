package service

import (
	"context"
	"crypto/sha256"

	"lock.dev/internal/grant"
	"lock.dev/internal/serve"
)

// GrantKeys are the public keys a fence point verifies grants with
// (docs/contracts/signed-grants.md), as read from the JWK Set file of a setting.
type GrantKeys struct {
	setting string
	path    string
	set     *grant.KeySet // nil: grants are not verified
	ignored int           // keys in the file that are not usable Ed25519 keys
	sum     [sha256.Size]byte
}

// ReadGrantKeys reads the JWK Set file path of setting env; an empty path means
// grants are not verified. A file that cannot be read or holds no usable Ed25519
// key is a bad setting (exit 2): a service that quietly fell back to not
// verifying would take any made-up token at its word.
func ReadGrantKeys(env, path string) (GrantKeys, error) {
	k := GrantKeys{setting: env, path: path}
	if path == "" {
		return k, nil
	}
	set, ignored, sum, err := grant.ReadKeySetSum(path)
	if err != nil {
		return k, serve.Invalid(env, "%v", err)
	}
	k.set, k.ignored, k.sum = set, ignored, sum
	return k, nil
}

// GrantGate is the gate that checks grants with keys. It registers
// grant_rejected_total in the service's registry, verifying or not, and logs what
// it does: the key ids it verifies with, or at WARN (grants_not_verified) that
// the setting is empty (which only UNSAFE_NO_AUTH lets a service start with:
// auth_enabled then reads 0). When the service serves mutual TLS, a grant's
// wid must name the caller's workload (docs/contracts/workload-identity.md);
// widRequired is GRANT_WID_REQUIRED: false accepts a grant without wid during
// a rolling upgrade. The key set file is re-read every 10 s until ctx ends (a
// rotation needs no restart; a broken file keeps the old set and logs
// grant_keys_reload_failed).
func (s *Service) GrantGate(ctx context.Context, keys GrantKeys, widRequired bool) (*grant.Gate, error) {
	gate, err := grant.NewGate(keys.set, 0, s.Registry, s.Logger)
	if err != nil {
		return nil, err
	}
	gate.BindWorkload(s.Identity != nil, widRequired)
	gate.Announce(keys.setting, keys.ignored)
	if keys.set == nil {
		s.NoteAuthMissing(keys.setting + " is empty: grants are not verified")
	}
	go gate.WatchFile(keys.setting, keys.path, keys.sum).Watch(ctx)
	return gate, nil
}
