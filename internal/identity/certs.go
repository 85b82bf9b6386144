package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// DefaultValid is the leaves' lifetime lock-server certs gives by default.
const DefaultValid = 720 * time.Hour

// CertsOptions are lock-server certs' flags.
type CertsOptions struct {
	Dir         string        // --out: created 0700 if needed
	TrustDomain string        // --trust-domain; empty: DefaultTrustDomain
	Names       []string      // --names; empty: DefaultNames
	Valid       time.Duration // --valid: the leaves' lifetime; the CA lives ten times as long; 0: DefaultValid
}

// ErrExists is WriteCerts refusing a directory that already holds a file of the
// set: it overwrites nothing, and writes nothing.
var ErrExists = errors.New("refusing to overwrite")

// WriteCerts writes a throwaway authority and an X.509-SVID per name
// (docs/contracts/workload-identity.md): DIR/ca.pem, DIR/ca.key, and
// DIR/{name}.pem with DIR/{name}.key, keys 0600. For demos, compose and tests;
// production issues SVIDs with its own authority (cert-manager with
// csi-driver-spiffe, or SPIRE). Each leaf also names localhost, 127.0.0.1, ::1
// and its name as DNS names, so curl and compose's service names verify it as a
// web server too; its one URI SAN is what workloads verify.
func WriteCerts(o CertsOptions) error {
	if o.TrustDomain == "" {
		o.TrustDomain = DefaultTrustDomain
	}
	if len(o.Names) == 0 {
		o.Names = DefaultNames()
	}
	if o.Valid == 0 {
		o.Valid = DefaultValid
	}
	if o.Valid < 0 {
		return fmt.Errorf("--valid must be positive, got %s", o.Valid)
	}
	td, err := spiffeid.TrustDomainFromString(o.TrustDomain)
	if err != nil {
		return fmt.Errorf("--trust-domain: %w", err)
	}
	ids := make([]spiffeid.ID, len(o.Names))
	files := []string{"ca.pem", "ca.key"}
	for i, n := range o.Names {
		if ids[i], err = spiffeid.FromSegments(td, n); err != nil {
			return fmt.Errorf("--names: %q: %w", n, err)
		}
		files = append(files, n+".pem", n+".key")
	}
	for _, f := range files {
		if _, err := os.Lstat(filepath.Join(o.Dir, f)); err == nil || !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w %s: it exists (or cannot be checked); nothing was written", ErrExists, filepath.Join(o.Dir, f))
		}
	}
	out := map[string][]byte{}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"lock.dev throwaway authority"}, CommonName: o.TrustDomain},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(10 * o.Valid),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	out["ca.pem"] = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	if out["ca.key"], err = keyPEM(caKey); err != nil {
		return err
	}
	for i, n := range o.Names {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{Organization: []string{"lock.dev"}, CommonName: n},
			NotBefore:    now.Add(-time.Minute),
			NotAfter:     now.Add(o.Valid),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			URIs:         []*url.URL{ids[i].URL()},
			DNSNames:     []string{"localhost", n},
			IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		out[n+".pem"] = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		if out[n+".key"], err = keyPEM(key); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return err
	}
	for _, f := range files {
		mode := fs.FileMode(0o644)
		if filepath.Ext(f) == ".key" {
			mode = 0o600
		}
		// O_EXCL: a file that appeared since the check is not overwritten.
		fh, err := os.OpenFile(filepath.Join(o.Dir, f), os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
		if err != nil {
			return err
		}
		if _, err := fh.Write(out[f]); err != nil {
			fh.Close()
			return err
		}
		if err := fh.Close(); err != nil {
			return err
		}
	}
	return nil
}

// Files are the identity settings of name's SVID in a directory WriteCerts wrote.
func Files(dir, name string) Settings {
	return Settings{CertFile: filepath.Join(dir, name+".pem"), KeyFile: filepath.Join(dir, name+".key"), CAFile: filepath.Join(dir, "ca.pem")}
}

func keyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
