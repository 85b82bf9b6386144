// Command healthcheck asks one URL whether a service is ready and exits 0 when
// it answers 200, 1 otherwise. It exists for the container image: the image's
// base (distroless static) has no shell and no curl, so a compose health check
// runs this binary instead:
//
//	healthcheck http://127.0.0.1:8083/readyz
//
// Kubernetes probes the same paths itself (httpGet) and does not need it.
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"lock.dev/internal/version"
)

// timeout bounds the whole check; readiness itself answers within 2 s
// (docs/contracts/observability.md: its slowest component, rail-proxy's rail probe,
// has 1 s).
const timeout = 3 * time.Second

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usage is what --help prints, and a wrong call prints on stderr.
const usage = `usage: healthcheck URL
  GET URL (http or https, no redirects followed, 3 s at most) and exit 0 when it
  answers 200, 1 otherwise; 2 for a wrong call. --version prints the version.
`

func run(args []string, stdout, stderr io.Writer) int {
	if version.Requested(args) {
		fmt.Fprintln(stdout, version.String())
		return 0
	}
	// Asking for help is not a wrong call: the usage on stdout, exit 0, as every
	// other lock.dev binary answers --help.
	if len(args) == 1 && (args[0] == "--help" || args[0] == "-help" || args[0] == "-h") {
		fmt.Fprint(stdout, usage)
		return 0
	}
	if len(args) != 1 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	u, err := url.Parse(args[0])
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		fmt.Fprintf(stderr, "healthcheck: %q is not an http(s) URL\n", args[0])
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		fmt.Fprintf(stderr, "healthcheck: %v\n", err)
		return 2
	}
	// No redirects: a probe that follows one is asking somebody else.
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "healthcheck: %s: %v\n", u.Redacted(), err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "healthcheck: %s answered %d: %s\n", u.Redacted(), resp.StatusCode, body)
		return 1
	}
	return 0
}
