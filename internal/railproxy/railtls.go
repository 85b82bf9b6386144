package railproxy

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"reflect"
	"sync"
	"time"

	"lock.dev/internal/identity"
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
)

// This file is the TLS of the hop to the rail (docs/contracts/rail-proxy.md,
// "The hop to the rail over TLS"). Two kinds of rail:
//
//   - rail-stub, or any rail that is a workload of the trust domain: mutual TLS
//     with the proxy's own SVID, the rail verified by its SPIFFE ID (RAIL_ID),
//     never by a host name; TLS 1.3, as between all of the project's services.
//   - a real rail, which is no SPIFFE workload (RAIL_TLS_SERVER_NAME set):
//     ordinary TLS, 1.2 allowed, the host name RAIL_TLS_SERVER_NAME verified
//     against RAIL_TLS_CA_FILE or the system roots, and a client certificate
//     (RAIL_TLS_CERT_FILE, RAIL_TLS_KEY_FILE) when the rail asks for one.

// RailTLS is the rail hop's TLS settings.
type RailTLS struct {
	// ID is RAIL_ID: the SPIFFE ID the rail must present; empty: rail-stub in
	// the proxy's own trust domain.
	ID string
	// ServerName is RAIL_TLS_SERVER_NAME: set, the rail is a real one, spoken to
	// in ordinary TLS and verified by this host name.
	ServerName string
	CAFile     string // RAIL_TLS_CA_FILE: the real rail's roots, PEM; empty: the system roots
	CertFile   string // RAIL_TLS_CERT_FILE: the client certificate a real rail may ask for, PEM
	KeyFile    string // RAIL_TLS_KEY_FILE: its key, PEM
}

// bindRailTLS binds the rail hop's TLS settings.
func bindRailTLS(s *serve.Settings, p *RailTLS) {
	s.String(&p.ID, "RAIL_ID", "", "SPIFFE ID the rail must present over mutual TLS; empty: spiffe://{this workload's trust domain}/rail-stub")
	s.String(&p.ServerName, "RAIL_TLS_SERVER_NAME", "", "a real rail (no SPIFFE workload): ordinary TLS, TLS 1.2 allowed, this host name verified; empty: none, the rail is verified by RAIL_ID")
	s.String(&p.CAFile, "RAIL_TLS_CA_FILE", "", "with RAIL_TLS_SERVER_NAME: the roots the real rail's certificate is verified against, PEM; empty: the system roots")
	s.String(&p.CertFile, "RAIL_TLS_CERT_FILE", "", "with RAIL_TLS_SERVER_NAME: client certificate presented to the real rail, PEM, re-read when it changes")
	s.String(&p.KeyFile, "RAIL_TLS_KEY_FILE", "", "with RAIL_TLS_SERVER_NAME: the client certificate's key, PEM")
}

// check refuses, naming the setting, rail TLS settings that contradict each
// other or the identity settings: RAIL_BASE_URL must be https once the proxy
// has an identity or a real rail's name is set, and the real rail's files only
// go with its name.
func (r RailTLS) check(id identity.Settings, baseURL string) error {
	if err := identity.CheckPeer("RAIL_ID", r.ID); err != nil {
		return err
	}
	if r.ServerName == "" {
		for _, f := range []struct{ env, v string }{{"RAIL_TLS_CA_FILE", r.CAFile}, {"RAIL_TLS_CERT_FILE", r.CertFile}, {"RAIL_TLS_KEY_FILE", r.KeyFile}} {
			if f.v != "" {
				return serve.Invalid(f.env, "is only used with RAIL_TLS_SERVER_NAME (a real rail); without it the rail is a workload verified by its SPIFFE ID (RAIL_ID)")
			}
		}
		return id.CheckURL("RAIL_BASE_URL", baseURL)
	}
	if r.ID != "" {
		return serve.Invalid("RAIL_ID", "must be empty when RAIL_TLS_SERVER_NAME is set: a real rail is verified by its host name, not a SPIFFE ID")
	}
	if u, err := url.Parse(baseURL); err != nil || u.Scheme != "https" {
		return serve.Invalid("RAIL_BASE_URL", "must be an https URL: RAIL_TLS_SERVER_NAME is set, got %q", service.RedactURL(baseURL))
	}
	if (r.CertFile == "") != (r.KeyFile == "") {
		if r.CertFile == "" {
			return serve.Invalid("RAIL_TLS_CERT_FILE", "must be set with RAIL_TLS_KEY_FILE")
		}
		return serve.Invalid("RAIL_TLS_KEY_FILE", "must be set with RAIL_TLS_CERT_FILE")
	}
	return nil
}

// railTLSConfig is the TLS configuration of every call to the rail — the
// payment hop, its health and the statement's reads: nil for a plaintext rail
// (http://, only under UNSAFE_NO_AUTH) and for an https rail without identity
// and without RAIL_TLS_SERVER_NAME (then the URL's host name is verified
// against the system roots, dialHop). An error names the setting (exit 2).
func railTLSConfig(cfg Config, sv *service.Service) (*tls.Config, error) {
	r := cfg.RailTLS
	if r.ServerName != "" {
		return realRailTLS(r, sv.Logger)
	}
	if sv.Identity == nil {
		return nil, nil
	}
	id, err := identity.ParsePeer("RAIL_ID", r.ID, sv.Identity.TrustDomain(), identity.NameRailStub)
	if err != nil {
		return nil, err
	}
	// go-spiffe's configuration asks the Source for the SVID and the bundle at
	// every handshake, so a rotation reaches the next connection; clones of it
	// (one per connection, and the health transport's) keep those callbacks
	// and the session cache.
	return sv.ClientTLS(id), nil
}

// realRailTLS is ordinary TLS to a real rail: TLS 1.2 at least, the host name
// verified, a client certificate only when given.
func realRailTLS(r RailTLS, logger *slog.Logger) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: r.ServerName,
		ClientSessionCache: tls.NewLRUClientSessionCache(256)}
	if r.CAFile != "" {
		pem, err := os.ReadFile(r.CAFile)
		if err != nil {
			return nil, serve.Invalid("RAIL_TLS_CA_FILE", "cannot be read: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, serve.Invalid("RAIL_TLS_CA_FILE", "holds no PEM certificate")
		}
		cfg.RootCAs = pool
	}
	if r.CertFile != "" {
		kp, err := newKeyPairFiles(r.CertFile, r.KeyFile, logger)
		if err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = kp.get
	}
	return cfg, nil
}

// keyPairReloadEvery is how often the real rail's client certificate files are
// looked at again, from a handshake: within the minute certificates rotate in.
const keyPairReloadEvery = 10 * time.Second

// keyPairFiles is the client certificate of a real rail, re-read when its files
// change (by content); a broken new pair keeps the old one and logs
// tls_reload_failed at ERROR.
type keyPairFiles struct {
	certFile, keyFile string
	logger            *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	certPEM []byte
	keyPEM  []byte
	checked time.Time
}

func newKeyPairFiles(certFile, keyFile string, logger *slog.Logger) (*keyPairFiles, error) {
	k := &keyPairFiles{certFile: certFile, keyFile: keyFile, logger: logger}
	certPEM, keyPEM, cert, err := readKeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	k.cert, k.certPEM, k.keyPEM, k.checked = cert, certPEM, keyPEM, time.Now()
	return k, nil
}

func readKeyPair(certFile, keyFile string) (certPEM, keyPEM []byte, cert *tls.Certificate, err error) {
	if certPEM, err = os.ReadFile(certFile); err != nil {
		return nil, nil, nil, serve.Invalid("RAIL_TLS_CERT_FILE", "cannot be read: %v", err)
	}
	if keyPEM, err = os.ReadFile(keyFile); err != nil {
		return nil, nil, nil, serve.Invalid("RAIL_TLS_KEY_FILE", "cannot be read: %v", err)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, nil, serve.Invalid("RAIL_TLS_CERT_FILE", "with RAIL_TLS_KEY_FILE is no certificate and key: %v", err)
	}
	return certPEM, keyPEM, &c, nil
}

// get is tls.Config.GetClientCertificate: the pair in force, re-read first when
// it was last looked at more than keyPairReloadEvery ago. The rail's request
// for a certificate is answered with it whatever CAs the rail names.
func (k *keyPairFiles) get(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if time.Since(k.checked) < keyPairReloadEvery {
		return k.cert, nil
	}
	k.checked = time.Now()
	certPEM, keyPEM, cert, err := readKeyPair(k.certFile, k.keyFile)
	switch {
	case err != nil:
		k.logger.Error("the rail's client certificate files changed but cannot be used: the previous certificate is still presented",
			"event", "tls_reload_failed", "error", err.Error())
	case !bytes.Equal(certPEM, k.certPEM) || !bytes.Equal(keyPEM, k.keyPEM):
		k.cert, k.certPEM, k.keyPEM = cert, certPEM, keyPEM
		k.logger.Info("the rail's client certificate files re-read: the new certificate is presented from this handshake on",
			"event", "tls_reloaded", "file", k.certFile)
	}
	return k.cert, nil
}

// handshakeAlerts are the TLS alerts only a peer's handshake sends: a server
// sends one when it refuses the handshake, before its application has a byte
// of the connection. Received on a fresh connection before any byte of the
// reply, such an alert means the rail never saw the request — under TLS 1.3 a
// refused client certificate arrives only after the client's first write,
// since the client's side of the handshake ends with its Finished
// (docs/contracts/rail-proxy.md, "The hop to the rail over TLS").
//
// Left out on purpose: close_notify (an orderly close: EOF), and alerts a
// record layer or an application sends at any time — unexpected_message,
// bad_record_mac, record_overflow, decode_error, internal_error,
// user_canceled, no_renegotiation: after any of those the rail may have read
// the request, so the call stays ambiguous.
var handshakeAlerts = map[tls.AlertError]bool{
	40:  true, // handshake_failure
	42:  true, // bad_certificate
	43:  true, // unsupported_certificate
	44:  true, // certificate_revoked
	45:  true, // certificate_expired
	46:  true, // certificate_unknown
	47:  true, // illegal_parameter
	48:  true, // unknown_ca
	49:  true, // access_denied
	51:  true, // decrypt_error: a handshake signature or Finished did not verify
	70:  true, // protocol_version
	71:  true, // insufficient_security
	86:  true, // inappropriate_fallback
	109: true, // missing_extension
	110: true, // unsupported_extension
	112: true, // unrecognized_name
	113: true, // bad_certificate_status_response
	115: true, // unknown_psk_identity
	116: true, // certificate_required
	120: true, // no_application_protocol
}

// handshakeAlert reports whether err carries a TLS alert the peer sent that
// only a handshake sends (handshakeAlerts). crypto/tls reports a received
// alert as a *net.OpError "remote error" wrapping its unexported alert type (a
// uint8, the alert's number), which errors.As does not find as a
// tls.AlertError; the number is read from that type, never from the text. An
// alert this side sent is no OpError "remote error": not the rail's refusal.
func handshakeAlert(err error) (tls.AlertError, bool) {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "remote error" || op.Err == nil {
		return 0, false
	}
	var a tls.AlertError
	if !errors.As(op.Err, &a) {
		v := reflect.ValueOf(op.Err)
		if v.Kind() != reflect.Uint8 || v.Type().PkgPath() != "crypto/tls" {
			return 0, false
		}
		a = tls.AlertError(v.Uint())
	}
	return a, handshakeAlerts[a]
}

// errHandshakeRefused wraps the alert of a handshake the rail refused after
// the request was written (handshakeAlert): nothing reached its application.
var errHandshakeRefused = errors.New("the rail refused the TLS handshake before reading the request")

func refusedError(a tls.AlertError, err error) error {
	return fmt.Errorf("%w (alert %d: %v)", errHandshakeRefused, uint8(a), err)
}
