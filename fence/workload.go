package fence

import (
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// MatchWorkload compares a verified grant's wid with caller, the SPIFFE ID the
// caller's mutual TLS handshake proved ("" when it proved none), as
// docs/contracts/workload-identity.md has a resource serving mutual TLS do: a
// grant read or copied by another workload is worthless to it. A grant without
// wid passes only when requireWid is false (lock-server not yet upgraded to
// write wid); otherwise, and for a caller without identity or with another one,
// the answer is a *Rejection with reason workload_mismatch.
func MatchWorkload(c Claims, caller string, requireWid bool) error {
	if r := matchWorkload(c, caller, requireWid); r != nil {
		return r
	}
	return nil
}

func matchWorkload(c Claims, caller string, requireWid bool) *Rejection {
	switch {
	case c.Workload == "" && requireWid:
		return reject(ReasonWorkloadMismatch, "the grant names no workload (wid), and this service requires one")
	case c.Workload == "":
		return nil
	case caller == "":
		return reject(ReasonWorkloadMismatch, "the caller presents no verified workload identity")
	case c.Workload != caller:
		return reject(ReasonWorkloadMismatch, "the grant was not granted to workload %s (the caller)", caller)
	}
	return nil
}

// errNoPeer: the connection proved no workload identity.
var errNoPeer = errors.New("the caller presents no verified workload identity")

// PeerID is the SPIFFE ID of the client certificate cs's handshake verified —
// the one URI SAN of an X.509-SVID, read by go-spiffe. It is an error when cs is
// nil (plaintext) or holds no client certificate. PeerID trusts that the
// server's TLS configuration verified the certificate against its trust bundle
// (tls.RequireAndVerifyClientCert, or go-spiffe's tlsconfig.MTLSServerConfig
// with an authorizer): a server that asks for a certificate without verifying
// it proves nothing, and no code reading the state afterwards can tell.
func PeerID(cs *tls.ConnectionState) (spiffeid.ID, error) {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return spiffeid.ID{}, errNoPeer
	}
	id, err := x509svid.IDFromCert(cs.PeerCertificates[0])
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("the caller's certificate is not an X.509-SVID: %w", err)
	}
	return id, nil
}
