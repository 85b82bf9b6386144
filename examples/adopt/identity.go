package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"lock.dev/workload"
)

// The trust domain and the SPIFFE IDs, as `lock-server certs` writes them.
const (
	trustDomain  = "lock.dev"
	lockServerID = "spiffe://lock.dev/lock-server"
	ledgerID     = "spiffe://lock.dev/ledger"
)

// identities are the TLS configurations of the program's three parts; all nil
// when it runs plaintext.
type identities struct {
	ledgerServer *tls.Config // the ledger: any workload of the trust domain may call; the grant decides who writes
	toLockServer *tls.Config // a worker calling lock-server, as executor
	toLedger     *tls.Config // a worker calling the ledger, as executor
}

func loadIdentities(c config) (identities, error) {
	if c.certsDir == "" {
		return identities{}, nil
	}
	// The workers' side: lock.dev/workload, as lock.dev's own clients load it.
	executor, err := workload.Load(workload.FilesIn(c.certsDir, "executor"), slog.New(slog.DiscardHandler))
	if err != nil {
		return identities{}, fmt.Errorf("the executor's SVID: %w", err)
	}
	toLockServer, err := executor.ClientTLS(lockServerID)
	if err != nil {
		return identities{}, err
	}
	toLedger, err := executor.ClientTLS(ledgerID)
	if err != nil {
		return identities{}, err
	}
	// The ledger's side: go-spiffe's server configuration, which requires a
	// client certificate and verifies it against the bundle — what
	// fence.Middleware relies on when it reads the caller's SPIFFE ID.
	files := workload.FilesIn(c.certsDir, "ledger")
	td, err := spiffeid.TrustDomainFromString(trustDomain)
	if err != nil {
		return identities{}, err
	}
	bundle, err := x509bundle.Load(td, files.Bundle)
	if err != nil {
		return identities{}, fmt.Errorf("the trust bundle: %w", err)
	}
	svid, err := x509svid.Load(files.Cert, files.Key)
	if err != nil {
		return identities{}, fmt.Errorf("the ledger's SVID: %w", err)
	}
	server := tlsconfig.MTLSServerConfig(svid, bundle, tlsconfig.AuthorizeMemberOf(td))
	server.MinVersion = tls.VersionTLS13
	return identities{ledgerServer: server, toLockServer: toLockServer, toLedger: toLedger}, nil
}
