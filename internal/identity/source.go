package identity

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"lock.dev/internal/serve"
)

// ReloadEvery is how often a Source looks at its files: a rotated certificate is
// served within it (the contract allows 60 s).
const ReloadEvery = 10 * time.Second

// material is one consistent read of the three files.
type material struct {
	svid   *x509svid.SVID
	bundle *x509bundle.Bundle
	sum    [sha256.Size]byte // of the three files' bytes, to see a change by content
}

// Source is a workload's SVID and trust bundle, read from the files of Settings
// and re-read when they change. It is go-spiffe's x509svid.Source and
// x509bundle.Source, so the TLS configurations built on it (ServerConfig,
// ClientConfig) ask it at every handshake: a rotation needs no restart.
type Source struct {
	set    Settings
	logger *slog.Logger
	cur    atomic.Pointer[material]

	mu     sync.Mutex // one reload at a time
	expiry *prometheus.GaugeVec
}

// Load reads the three files of set; an error names the setting whose file is
// unreadable or wrong (exit 2). The SVID must verify against the bundle: a
// workload whose own certificate its peers would refuse is misconfigured.
func Load(set Settings, logger *slog.Logger) (*Source, error) {
	m, err := read(set)
	if err != nil {
		return nil, err
	}
	s := &Source{set: set, logger: logger}
	s.cur.Store(m)
	s.expiry = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tls_cert_expiry_seconds",
		Help: "When the earliest certificate of each identity file expires, in seconds since the epoch."}, []string{"file"})
	s.setExpiry(m)
	return s, nil
}

func read(set Settings) (*material, error) {
	certPEM, err := os.ReadFile(set.CertFile)
	if err != nil {
		return nil, serve.Invalid("TLS_CERT_FILE", "cannot be read: %v", err)
	}
	keyPEM, err := os.ReadFile(set.KeyFile)
	if err != nil {
		return nil, serve.Invalid("TLS_KEY_FILE", "cannot be read: %v", err)
	}
	caPEM, err := os.ReadFile(set.CAFile)
	if err != nil {
		return nil, serve.Invalid("TLS_CA_FILE", "cannot be read: %v", err)
	}
	svid, err := x509svid.Parse(certPEM, keyPEM)
	if err != nil {
		return nil, serve.Invalid("TLS_CERT_FILE", "with TLS_KEY_FILE is no X.509-SVID: %v", err)
	}
	bundle, err := x509bundle.Parse(svid.ID.TrustDomain(), caPEM)
	if err != nil {
		return nil, serve.Invalid("TLS_CA_FILE", "is no trust bundle: %v", err)
	}
	if bundle.Empty() {
		return nil, serve.Invalid("TLS_CA_FILE", "holds no certificate")
	}
	if _, _, err := x509svid.Verify(svid.Certificates, bundle); err != nil {
		return nil, serve.Invalid("TLS_CERT_FILE", "does not verify against TLS_CA_FILE: %v", err)
	}
	m := &material{svid: svid, bundle: bundle}
	h := sha256.New()
	for _, b := range [][]byte{certPEM, keyPEM, caPEM} {
		_, _ = fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	copy(m.sum[:], h.Sum(nil))
	return m, nil
}

// Register adds tls_cert_expiry_seconds to reg.
func (s *Source) Register(reg prometheus.Registerer) { _ = reg.Register(s.expiry) }

// ExpiryFamilies registers tls_cert_expiry_seconds as Register does, for a
// registry built without running the service (deployment checks).
func ExpiryFamilies(reg prometheus.Registerer) {
	_ = reg.Register(prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tls_cert_expiry_seconds",
		Help: "When the earliest certificate of each identity file expires, in seconds since the epoch."}, []string{"file"}))
}

func (s *Source) setExpiry(m *material) {
	s.expiry.WithLabelValues("cert").Set(float64(earliest(m.svid.Certificates).Unix()))
	s.expiry.WithLabelValues("ca").Set(float64(earliest(m.bundle.X509Authorities()).Unix()))
}

func earliest(certs []*x509.Certificate) time.Time {
	var t time.Time
	for _, c := range certs {
		if t.IsZero() || c.NotAfter.Before(t) {
			t = c.NotAfter
		}
	}
	return t
}

// Reload reads the files again and, when their content changed and forms a
// valid SVID with its key and bundle, serves it from the next handshake on. A
// broken new set keeps the old material and logs tls_reload_failed at ERROR;
// the error is returned too.
func (s *Source) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := read(s.set)
	if err != nil {
		s.logger.Error("identity files changed but cannot be used: the previous certificate is still served",
			"event", "tls_reload_failed", "error", err.Error())
		return err
	}
	old := s.cur.Load()
	if m.sum == old.sum {
		return nil
	}
	if m.svid.ID.TrustDomain() != old.svid.ID.TrustDomain() {
		err := fmt.Errorf("the new SVID %s is of another trust domain than %s", m.svid.ID, old.svid.ID)
		s.logger.Error("identity files changed but cannot be used: the previous certificate is still served",
			"event", "tls_reload_failed", "error", err.Error())
		return err
	}
	s.cur.Store(m)
	s.setExpiry(m)
	s.logger.Info("identity files re-read: the new certificate is served from the next handshake",
		"event", "tls_reloaded", "id", m.svid.ID.String(), "notAfter", m.svid.Certificates[0].NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// Watch re-reads the files every ReloadEvery until ctx ends. A file is replaced
// by a rename (Kubernetes projected volumes, cert-manager), so the three are
// read afresh each time and compared by content, not by modification time.
func (s *Source) Watch(ctx context.Context) {
	t := time.NewTicker(ReloadEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = s.Reload()
		}
	}
}

// ID is the workload's own SPIFFE ID.
func (s *Source) ID() spiffeid.ID { return s.cur.Load().svid.ID }

// TrustDomain is the workload's own trust domain: the default of the peer settings.
func (s *Source) TrustDomain() spiffeid.TrustDomain { return s.ID().TrustDomain() }

// GetX509SVID is the current SVID (x509svid.Source).
func (s *Source) GetX509SVID() (*x509svid.SVID, error) { return s.cur.Load().svid, nil }

// GetX509BundleForTrustDomain is the current bundle for the workload's own trust
// domain (x509bundle.Source); any other trust domain has none, so its workloads
// fail the handshake.
func (s *Source) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	m := s.cur.Load()
	if td != m.bundle.TrustDomain() {
		return nil, fmt.Errorf("no trust bundle for trust domain %q", td)
	}
	return m.bundle, nil
}

// ServerConfig is a server's TLS configuration: TLS 1.3, a client certificate
// required and verified against the bundle (any workload of it: roles are per
// route, Guard's), the SVID served fresh from the Source at each handshake.
func (s *Source) ServerConfig() *tls.Config {
	cfg := tlsconfig.MTLSServerConfig(s, s, tlsconfig.AuthorizeAny())
	cfg.MinVersion = tls.VersionTLS13
	cfg.VerifyConnection = s.reverify(tlsconfig.AuthorizeAny())
	return cfg
}

// ClientConfig is a client's TLS configuration: TLS 1.3, the server verified as
// the workload expect (its SPIFFE ID, not a host name), this workload's SVID
// presented, and sessions resumed from a cache shared by every connection made
// with it (the transport clones the configuration per connection, the cache
// with it).
func (s *Source) ClientConfig(expect spiffeid.ID) *tls.Config {
	cfg := tlsconfig.MTLSClientConfig(s, s, tlsconfig.AuthorizeID(expect))
	cfg.MinVersion = tls.VersionTLS13
	cfg.ClientSessionCache = tls.NewLRUClientSessionCache(256)
	cfg.VerifyConnection = s.reverify(tlsconfig.AuthorizeID(expect))
	return cfg
}

// reverify verifies a resumed session's peer again, against the bundle as it
// is now. Go calls VerifyPeerCertificate (where go-spiffe verifies) only on a
// full handshake; without this, a session ticket would keep letting in a peer
// whose authority has left the bundle, or whose certificate has expired, since
// the session began.
func (s *Source) reverify(authorize tlsconfig.Authorizer) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if !cs.DidResume {
			return nil
		}
		if len(cs.PeerCertificates) == 0 {
			return ErrNoPeer
		}
		id, chains, err := x509svid.Verify(cs.PeerCertificates, s)
		if err != nil {
			return fmt.Errorf("resumed session: %w", err)
		}
		return authorize(id, chains)
	}
}

// ErrNoPeer is a request that arrived without a verified peer identity on a
// service that requires one: the caller is refused, whatever it asked.
var ErrNoPeer = errors.New("no verified peer identity on this connection")
