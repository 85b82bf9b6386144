package gate

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
)

// pprofAddrEnv names a development aid, off by default and no setting
// (docs/contracts/configuration.md): when it is set to a loopback address
// (127.0.0.1:6060), rail-proxy also serves Go's /debug/pprof/ there, on a listener
// of its own, so the real binary can be profiled under a benchmark
// (docs/contracts/rail-proxy.md#performance). It is refused on anything but a
// loopback address: a profile shows memory contents.
const pprofAddrEnv = "LOCKDEV_PPROF_ADDR"

// startPprof serves /debug/pprof/ on addr when addr is set; an address that is
// not loopback, or that cannot be listened on, is an error.
func startPprof(addr string) error {
	if addr == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s: %w", pprofAddrEnv, err)
	}
	if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && !strings.EqualFold(host, "localhost") {
		return fmt.Errorf("%s: must be a loopback address, got %q", pprofAddrEnv, addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s: %w", pprofAddrEnv, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5e9}
	go func() { _ = srv.Serve(ln) }()
	fmt.Fprintf(os.Stderr, "rail-proxy: %s: serving /debug/pprof/ on %s\n", pprofAddrEnv, ln.Addr())
	return nil
}
