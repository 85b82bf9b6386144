// Package workload gives a program the mutual-TLS configuration of its
// workload identity, for calling lock.dev's services — lock-server through
// lockclient above all (docs/contracts/workload-identity.md).
//
// Every call between lock.dev's workloads is mutual TLS: each workload holds an
// X.509-SVID, a certificate whose one URI SAN is its SPIFFE ID
// (spiffe://lock.dev/executor), and trusts a bundle of authorities. A client
// presents its SVID and accepts a server only when the server's SVID carries
// the SPIFFE ID the client expects — not a host name. Load reads the three PEM
// files (certificate chain, key, bundle) that SPIRE, cert-manager's
// csi-driver-spiffe or `lock-server certs` write; Watch re-reads them as they
// rotate, and every handshake uses what was read last, so a rotation needs no
// restart:
//
//	id, err := workload.Load(workload.Files{Cert: "/svid/tls.crt", Key: "/svid/tls.key", Bundle: "/svid/ca.crt"}, logger)
//	go id.Watch(ctx)
//	cfg, err := id.ClientTLS("spiffe://lock.dev/lock-server")
//	locks, err := lockclient.New("https://lock-server:8081", lockclient.WithTLSConfig(cfg))
//
// SVID parsing and chain verification are go-spiffe's; this package only
// exposes the project's own loading, the one its services use.
package workload

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/identity"
)

// Files name a workload's identity files, all PEM.
type Files struct {
	Cert   string // the X.509-SVID, leaf first, then intermediates (TLS_CERT_FILE)
	Key    string // its private key (TLS_KEY_FILE)
	Bundle string // the trust bundle: the authorities of the trust domain (TLS_CA_FILE)
}

// FilesIn names the files of workload name in dir as `lock-server certs --out
// dir` writes them: dir/{name}.pem, dir/{name}.key and dir/ca.pem.
func FilesIn(dir, name string) Files {
	s := identity.Files(dir, name)
	return Files{Cert: s.CertFile, Key: s.KeyFile, Bundle: s.CAFile}
}

// Identity is a workload's SVID and trust bundle, as last read from its files.
type Identity struct {
	src *identity.Source
}

// Load reads f. It fails when a file cannot be read, the certificate and key
// are no X.509-SVID, or the SVID does not verify against the bundle (its peers
// would refuse it). logger receives reloads and failed reloads (nil: nowhere).
func Load(f Files, logger *slog.Logger) (*Identity, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	src, err := identity.Load(identity.Settings{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.Bundle}, logger)
	if err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	return &Identity{src: src}, nil
}

// ID is the workload's own SPIFFE ID, as its SVID names it.
func (id *Identity) ID() string { return id.src.ID().String() }

// ClientTLS returns a client's configuration that presents this workload's
// SVID and accepts only a server whose SVID is server, a SPIFFE ID such as
// spiffe://lock.dev/lock-server (TLS 1.3). It reads the SVID and bundle at
// each handshake, so it follows Reload and Watch.
func (id *Identity) ClientTLS(server string) (*tls.Config, error) {
	want, err := spiffeid.FromString(server)
	if err != nil {
		return nil, fmt.Errorf("workload: server SPIFFE ID %q: %w", server, err)
	}
	return id.src.ClientConfig(want), nil
}

// Reload reads the files again. New content that forms a valid SVID is used
// from the next handshake on; a broken set keeps the previous one and is
// returned (and logged) as an error.
func (id *Identity) Reload() error {
	if err := id.src.Reload(); err != nil {
		return fmt.Errorf("workload: %w", err)
	}
	return nil
}

// Watch re-reads the files every ReloadEvery until ctx ends. Files are compared
// by content, not modification time, since a rotation replaces them by a rename.
func (id *Identity) Watch(ctx context.Context) { id.src.Watch(ctx) }

// ReloadEvery is how often Watch re-reads the files.
const ReloadEvery = identity.ReloadEvery
