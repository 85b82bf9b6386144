package lockserver

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"lock.dev/internal/grant"
	"lock.dev/internal/serve"
	"lock.dev/lockapi"
)

// grants is lock-server's side of docs/contracts/signed-grants.md: the key every
// grant is signed with (nil: grants are not signed) and the key set GET /v1/keys
// publishes.
type grants struct {
	signer    *grant.Signer
	published *grant.KeySet
}

// loadGrants reads LOCK_SERVER_SIGNING_KEY_FILE and
// LOCK_SERVER_PREVIOUS_PUBLIC_KEYS_FILE. A file that cannot be read or holds no
// usable key is a bad setting (exit 2, naming it): a lock-server that silently
// stopped signing would leave every verifying fence point refusing everything.
func loadGrants(cfg Config, logger *slog.Logger) (grants, error) {
	var g grants
	if cfg.SigningKeyFile != "" {
		key, loose, err := grant.ReadSigningKey(cfg.SigningKeyFile)
		if err != nil {
			return g, serve.Invalid("LOCK_SERVER_SIGNING_KEY_FILE", "%v", err)
		}
		if g.signer, err = grant.NewSigner(key); err != nil {
			return g, serve.Invalid("LOCK_SERVER_SIGNING_KEY_FILE", "%v", err)
		}
		if loose {
			logger.Warn("the signing key file can be read by other users than its owner: anyone who reads it can mint grants; make it mode 0600",
				"event", "signing_key_file_readable", "setting", "LOCK_SERVER_SIGNING_KEY_FILE")
		}
		g.published = g.signer.PublicKeys()
	}
	if cfg.PreviousPublicKeysFile != "" {
		prev, ignored, err := grant.ReadKeySet(cfg.PreviousPublicKeysFile)
		if err != nil {
			return g, serve.Invalid("LOCK_SERVER_PREVIOUS_PUBLIC_KEYS_FILE", "%v", err)
		}
		if ignored > 0 {
			logger.Warn("keys of other types than Ed25519 in LOCK_SERVER_PREVIOUS_PUBLIC_KEYS_FILE are not published",
				"event", "previous_keys_ignored", "ignoredKeys", ignored)
		}
		g.published = g.published.Join(prev)
	}
	if g.signer == nil {
		logger.Info("grants are not signed: LOCK_SERVER_SIGNING_KEY_FILE is empty; fence points cannot verify tokens (docs/contracts/signed-grants.md)",
			"event", "grants_not_signed")
	} else {
		logger.Info("grants are signed", "event", "grants_signed", "keyId", g.signer.KeyID(), "publishedKeyIds", g.published.IDs())
	}
	return g, nil
}

// sign is the grant of token on lock to owner, a worker of the workload holder
// (its SPIFFE ID, the claim wid; "" without identities: no wid), acquired at
// acquiredAt, or "" when grants are not signed.
func (g grants) sign(lock string, token int64, owner, holder string, acquiredAt time.Time) (string, error) {
	if g.signer == nil {
		return "", nil
	}
	return g.signer.SignFor(lock, token, owner, holder, acquiredAt)
}

// keys is GET /v1/keys: the JWK Set of the current key and the previous ones
// ({"keys":[]} when nothing is signed and nothing was announced).
func (g grants) keys(w http.ResponseWriter, _ *http.Request) {
	set := g.published
	if set == nil {
		set = &grant.KeySet{}
	}
	lockapi.WriteJSON(w, http.StatusOK, set)
}

// Keygen is `lock-server keygen --out DIR`: it writes DIR/signing-key.pem (0600)
// and DIR/jwks.json (0644), creating DIR (0700) if needed and refusing to
// overwrite either file, and says what it wrote on stdout.
func Keygen(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("lock-server keygen", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out := fs.String("out", "", "directory to write "+grant.SigningKeyFile+" and "+grant.KeySetFile+" to (created 0700 if needed)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "Usage: lock-server keygen --out DIR\n\nMakes an Ed25519 key pair for signing grants (docs/contracts/signed-grants.md):\n"+
				"  DIR/%s  the private key (PKCS#8 PEM, mode 0600): LOCK_SERVER_SIGNING_KEY_FILE\n"+
				"  DIR/%s       its public key as a JWK Set (mode 0644): RAIL_PROXY_GRANT_KEYS_FILE, PAYMENT_GRANT_KEYS_FILE\n"+
				"Existing files are never overwritten.\n", grant.SigningKeyFile, grant.KeySetFile)
			return serve.ErrHelp
		}
		return &serve.UsageError{Msg: fmt.Sprintf("lock-server keygen: %v", err)}
	}
	if fs.NArg() > 0 {
		return &serve.UsageError{Msg: fmt.Sprintf("lock-server keygen: unexpected argument %q", fs.Arg(0))}
	}
	if *out == "" {
		return &serve.UsageError{Msg: "lock-server keygen: --out DIR is required"}
	}
	kid, err := grant.Keygen(*out)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s/%s (private key, 0600) and %s/%s (public JWK Set); key id %s\n",
		*out, grant.SigningKeyFile, *out, grant.KeySetFile, kid)
	return nil
}
