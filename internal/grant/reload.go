package grant

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"time"
)

// KeysReloadEvery is how often a fence point re-reads its key set file: a
// rotation published to the file reaches the gate within this, with no restart.
const KeysReloadEvery = 10 * time.Second

// KeyFile is a gate's key set file, re-read on change (docs/contracts/workload-identity.md):
// each read is compared by content hash, so a file replaced by a rename (as
// Kubernetes projected volumes and ConfigMaps do) with the same modification
// time is still seen.
type KeyFile struct {
	gate    *Gate
	path    string
	setting string

	mu  sync.Mutex // one reload at a time
	sum [sha256.Size]byte
}

// WatchFile makes g's key set follow the file at path (named by setting in
// logs), whose content at start-up hashed to sum (ReadKeySetSum). A gate that
// verifies nothing has no file to follow: nil.
func (g *Gate) WatchFile(setting, path string, sum [sha256.Size]byte) *KeyFile {
	if !g.Verifying() || path == "" {
		return nil
	}
	return &KeyFile{gate: g, path: path, setting: setting, sum: sum}
}

// Reload reads the file again and, when its content changed and holds a usable
// key set, verifies with that set from the next request on — with an empty
// cache, so a grant of a key just removed does not pass on its remembered
// verdict. A file that cannot be read or parsed keeps the old set and logs
// grant_keys_reload_failed at ERROR; the error is returned too.
func (k *KeyFile) Reload() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	set, ignored, sum, err := ReadKeySetSum(k.path)
	if err == nil && sum == k.sum {
		return nil
	}
	if err == nil {
		err = k.gate.verifier.SetKeys(set)
	}
	if err != nil {
		err = errors.New(k.setting + " " + err.Error())
		k.gate.logger.Error("the grant key set file changed but cannot be used: grants are still verified with the previous set",
			"event", "grant_keys_reload_failed", "setting", k.setting, "error", err.Error())
		return err
	}
	k.sum = sum
	k.gate.logger.Info("grant key set re-read: grants are verified with the new set from the next request on",
		"event", "grant_keys_reloaded", "setting", k.setting, "keyIds", set.IDs(), "ignoredKeys", ignored)
	return nil
}

// Watch calls Reload every KeysReloadEvery until ctx ends. A nil KeyFile
// watches nothing.
func (k *KeyFile) Watch(ctx context.Context) {
	if k == nil {
		return
	}
	t := time.NewTicker(KeysReloadEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = k.Reload()
		}
	}
}
