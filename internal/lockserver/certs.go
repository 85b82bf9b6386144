package lockserver

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/identity"
	"lock.dev/internal/serve"
)

// Certs is `lock-server certs --out DIR [--trust-domain lock.dev] [--names a,b,…]
// [--valid 720h]` (docs/contracts/workload-identity.md): a throwaway authority
// (DIR/ca.pem, DIR/ca.key) and an X.509-SVID per name (DIR/{name}.pem,
// DIR/{name}.key), keys 0600, DIR created 0700 if needed — for demos, compose
// and tests. If any file of the set exists it writes nothing and is a usage
// error (exit 2, one line): an authority replaced by mistake would cut every
// workload holding the old one off from the others.
func Certs(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("lock-server certs", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out := fs.String("out", "", "directory to write the authority and the SVIDs to (created 0700 if needed)")
	td := fs.String("trust-domain", identity.DefaultTrustDomain, "the SPIFFE trust domain")
	names := fs.String("names", strings.Join(identity.DefaultNames(), ","), "the workloads to issue SVIDs for, comma-separated")
	valid := new(time.Duration)
	serve.DurationFlag(fs, valid, "valid", identity.DefaultValid, "the SVIDs' lifetime (the authority lives ten times as long)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "Usage: lock-server certs --out DIR [--trust-domain %s] [--names a,b,…] [--valid %s]\n\n"+
				"Writes a throwaway authority and an X.509-SVID (spiffe://TRUST-DOMAIN/NAME) per name\n"+
				"(docs/contracts/workload-identity.md), for demos, compose and tests:\n"+
				"  DIR/ca.pem, DIR/ca.key (0600)        the authority: TLS_CA_FILE is DIR/ca.pem\n"+
				"  DIR/NAME.pem, DIR/NAME.key (0600)    a workload's TLS_CERT_FILE and TLS_KEY_FILE\n"+
				"Default names: %s. Existing files are never overwritten.\n",
				identity.DefaultTrustDomain, identity.DefaultValid, strings.Join(identity.DefaultNames(), ","))
			return serve.ErrHelp
		}
		return &serve.UsageError{Msg: fmt.Sprintf("lock-server certs: %v", err)}
	}
	if fs.NArg() > 0 {
		return &serve.UsageError{Msg: fmt.Sprintf("lock-server certs: unexpected argument %q", fs.Arg(0))}
	}
	if *out == "" {
		return &serve.UsageError{Msg: "lock-server certs: --out DIR is required"}
	}
	if *valid <= 0 {
		return &serve.UsageError{Msg: fmt.Sprintf("lock-server certs: --valid must be positive, got %s", *valid)}
	}
	var list []string
	for _, n := range strings.Split(*names, ",") {
		if n = strings.TrimSpace(n); n != "" {
			list = append(list, n)
		}
	}
	if len(list) == 0 {
		return &serve.UsageError{Msg: "lock-server certs: --names must name at least one workload"}
	}
	trust, err := spiffeid.TrustDomainFromString(*td)
	if err != nil {
		return &serve.UsageError{Msg: fmt.Sprintf("lock-server certs: --trust-domain %q: %v", *td, err)}
	}
	for _, n := range list {
		if _, err := spiffeid.FromSegments(trust, n); err != nil {
			return &serve.UsageError{Msg: fmt.Sprintf("lock-server certs: --names: %q is no SPIFFE ID path segment: %v", n, err)}
		}
	}
	err = identity.WriteCerts(identity.CertsOptions{Dir: *out, TrustDomain: *td, Names: list, Valid: *valid})
	switch {
	case errors.Is(err, identity.ErrExists):
		return &serve.UsageError{Msg: "lock-server certs: " + err.Error()}
	case err != nil:
		return fmt.Errorf("lock-server certs: %w", err)
	}
	fmt.Fprintf(stdout, "wrote %s/ca.pem, %s/ca.key and an SVID with its key for %s in trust domain %s, valid %s\n",
		*out, *out, strings.Join(list, ", "), *td, *valid)
	return nil
}
