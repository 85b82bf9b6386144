package railproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/identity"
	"lock.dev/internal/paydb"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// The benchmarks measure the admission path against the real rail-stub at zero
// latency, on a throwaway PostgreSQL with durable settings (fsync and
// synchronous_commit on), as the project's CI comparison measures the
// database's own ceiling for the same SQL (docs/performance.md). Settings (environment):
//
//	BENCH_DURABLE         0 runs PostgreSQL without fsync, to separate the cost of
//	                      the two commits' WAL flushes from the proxy's own
//	BENCH_CLIENTS         concurrent clients (32)
//	BENCH_ACCOUNTS        accounts, split disjointly between clients (1000)
//	BENCH_PAYDB_MAX_CONNS the proxy's pool (32: one per client, like pgbench -c 32)
//	BENCH_RATE            BenchmarkAddedLatency's offered load per second (1500)
//	BENCH_INFLIGHT        BenchmarkInflightRSS's submissions in flight (2000)
//	BENCH_BOOKS_CHECK     true runs BenchmarkAdmission's and BenchmarkAddedLatency's
//	                      proxy with RAIL_PROXY_BOOKS_CHECK on, every submission booked
//	                      in paydb's payout table before the clock starts; false (the
//	                      default) runs it off, as the ceiling's measurement does
//	                      (docs/contracts/books.md)
//	BENCH_IDENTITY        true runs BenchmarkAdmission with both hops over mutual TLS:
//	                      its clients presenting the executor's SVID to the proxy,
//	                      the proxy its own to rail-stub (TLS 1.3, session cache,
//	                      keep-alive connections); false (the default) runs them
//	                      plaintext, as the ceiling's measurement does; grants are not
//	                      verified either way (docs/contracts/workload-identity.md)
//	BENCH_IDLE_CONNS      BenchmarkIdleConnRSS's idle connections (1000)
//	BENCH_BINARY          BenchmarkIdleConnRSS's rail-proxy binary; empty builds cmd/rail-proxy

func benchEnv(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// benchBooks is BENCH_BOOKS_CHECK: whether the proxy checks the books.
func benchBooks(b *testing.B) bool { return benchBool(b, "BENCH_BOOKS_CHECK") }

// benchIdentity is BENCH_IDENTITY: whether the proxy serves mutual TLS.
func benchIdentity(b *testing.B) bool { return benchBool(b, "BENCH_IDENTITY") }

// benchBool reads a boolean setting of the benchmarks; unset is false.
func benchBool(b *testing.B, name string) bool {
	v := os.Getenv(name)
	if v == "" {
		return false
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		b.Fatalf("%s=%q: %v", name, v, err)
	}
	return on
}

// benchCerts writes a throwaway certificate set and returns its directory.
func benchCerts(b *testing.B) string {
	b.Helper()
	dir := filepath.Join(b.TempDir(), "certs")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: dir}); err != nil {
		b.Fatal(err)
	}
	return dir
}

// benchTLS is the executor's client configuration towards rail-proxy, from the
// certificate set in dir: TLS 1.3 with a session cache (identity.Source.ClientConfig).
func benchTLS(b *testing.B, dir string) *tls.Config {
	b.Helper()
	src, err := identity.Load(identity.Files(dir, identity.NameExecutor), slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	return src.ClientConfig(spiffeid.RequireFromString(identity.DefaultID(identity.NameRailProxy)))
}

// cpuTime is the CPU time, user and system, this process has used so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchSystem is a durable paydb, a zero-latency rail-stub and a proxy.
type benchSystem struct {
	proxyURL string
	stubURL  string
	client   *http.Client
	dbURL    string
	books    bool // the proxy checks the books: book every submission first (book)
}

func startBenchSystem(b *testing.B, stubLatencyMs int, books bool) *benchSystem {
	return startBenchSystemID(b, stubLatencyMs, books, false)
}

// startBenchSystemID is startBenchSystem with the proxy serving mutual TLS
// when tlsOn, its client presenting the executor's SVID.
func startBenchSystemID(b *testing.B, stubLatencyMs int, books, tlsOn bool) *benchSystem {
	b.Helper()
	ctx := context.Background()
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{Durable: os.Getenv("BENCH_DURABLE") != "0"})
	if err != nil {
		b.Fatalf("PostgreSQL: %v", err)
	}
	b.Cleanup(func() { _ = cluster.Stop() })
	if err := cluster.CreateDatabase(ctx, "paydb", ""); err != nil {
		b.Fatal(err)
	}
	dbURL := cluster.URL("paydb")
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := paydb.Tree().Migrate(ctx, pool, nil); err != nil {
		b.Fatal(err)
	}
	pool.Close()

	// With identities, both hops are mutual TLS: the clients to the proxy, and
	// the proxy to rail-stub (its SVID verified by RAIL_ID's default).
	var certs string
	var stub *stub
	if tlsOn {
		certs = benchCerts(b)
		stub = startTLSStub(b, certs, identity.NameRailStub, stubLatencyMs)
	} else {
		stub = startStub(b, stubLatencyMs)
	}
	cfg := testConfig(dbURL, stub.URL)
	cfg.BooksCheck = books
	cfg.LogLevel = "info" // production's level: one submission_resolved line per submission
	cfg.PaydbMaxConns = benchEnv("BENCH_PAYDB_MAX_CONNS", 32)
	scheme, transport := "http://", &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096}
	if tlsOn {
		// Mutual TLS with the proxy's own SVID; UnsafeNoAuth only lifts the
		// refusal to start without a grant key set, so that the two runs differ
		// by TLS alone.
		cfg.Identity = identity.Files(certs, identity.NameRailProxy)
		cfg.Identity.UnsafeNoAuth = true
		scheme, transport.TLSClientConfig = "https://", benchTLS(b, certs)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	cfg.Listener = ln
	cfg.LogOutput = io.Discard
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(rctx, cfg) }()
	b.Cleanup(func() {
		cancel()
		<-done
	})
	s := &benchSystem{
		proxyURL: scheme + ln.Addr().String(),
		stubURL:  stub.URL,
		dbURL:    dbURL,
		books:    books,
		client:   &http.Client{Transport: transport, Timeout: 30 * time.Second},
	}
	testkit.WaitHTTP(b, s.client, 20*time.Second, s.proxyURL+"/readyz", http.StatusOK)
	return s
}

// book writes, when the proxy checks the books, the payout rows that book the
// planned submissions as payment-resource leaves them once claimed (CLAIMED by
// owner bench under the planned token, as presented), in one statement, before
// the clock starts.
func (s *benchSystem) book(b *testing.B, l *load, plans ...[]planned) {
	b.Helper()
	if !s.books {
		return
	}
	all := slices.Concat(plans...)
	ids, accounts, tokens := make([]string, len(all)), make([]string, len(all)), make([]int64, len(all))
	for i, p := range all {
		ids[i], accounts[i], tokens[i] = l.payoutID(p), l.accountID(p), p.token
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, s.dbURL)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `
		INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary, status, fence_token, claimed_by)
		SELECT id, acct, 125000, 'EUR', 'NL91ABNA0417164300', 'CLAIMED', token, 'bench'
		  FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(id, acct, token)`, ids, accounts, tokens); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE payout"); err != nil {
		b.Fatal(err)
	}
}

// load is a generator of submissions: client c owns accounts c, c+clients, …,
// tokens per account increase, payout ids are unique — so every submission is
// admitted and ACKED, the path the ceiling measures.
type load struct {
	accounts int
	tokens   []atomic.Int64
	payout   atomic.Int64
	prefix   string
}

func newLoad(accounts int) *load {
	return &load{accounts: accounts, tokens: make([]atomic.Int64, accounts), prefix: strconv.FormatInt(time.Now().UnixNano(), 36)}
}

// planned is one submission of the load: its payout, account and token.
type planned struct {
	id      int64
	account int
	token   int64
}

// plan draws client's i-th submission.
func (l *load) plan(client, clients, i int) planned {
	per := max(1, l.accounts/clients)
	a := (client + clients*(i%per)) % l.accounts
	return planned{account: a, token: l.tokens[a].Add(1), id: l.payout.Add(1)}
}

// plans draws client's submissions from..to-1, in order.
func (l *load) plans(client, clients, from, to int) []planned {
	out := make([]planned, 0, max(0, to-from))
	for i := from; i < to; i++ {
		out = append(out, l.plan(client, clients, i))
	}
	return out
}

func (l *load) payoutID(p planned) string  { return fmt.Sprintf("p-%s-%d", l.prefix, p.id) }
func (l *load) accountID(p planned) string { return fmt.Sprintf("a-%d", p.account) }

func (l *load) request(url string, client, clients, i int) *http.Request {
	return l.requestFor(url, l.plan(client, clients, i))
}

// requestFor is the submission of p, as the bench's executor sends it.
func (l *load) requestFor(url string, p planned) *http.Request {
	body := fmt.Sprintf(`{"payoutId":"p-%s-%d","accountId":"a-%d","amountMinor":125000,"currency":"EUR","beneficiary":"NL91ABNA0417164300"}`, l.prefix, p.id, p.account)
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/rail/submissions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(lockapi.HeaderFencingToken, strconv.FormatInt(p.token, 10))
	req.Header.Set(lockapi.HeaderOwnerID, "bench")
	req.Header.Set(lockapi.HeaderIdempotencyKey, fmt.Sprintf("p-%d:%d", p.id, p.token))
	return req
}

func do(c *http.Client, req *http.Request, want int) error {
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkAdmission: closed loop, BENCH_CLIENTS clients, every submission
// ACKED by a zero-latency rail-stub. Reports submissions/s, latency p50/p99 and
// the CPU time per submission of this process — the clients, the proxy and the
// rail-stub, not PostgreSQL. Each client makes its share of the b.N
// submissions, drawn (and, with BENCH_BOOKS_CHECK, booked) before the clock
// starts. With BENCH_IDENTITY the proxy serves mutual TLS; the warm-up
// submissions make each client's connection and its handshake.
func BenchmarkAdmission(b *testing.B) {
	s := startBenchSystemID(b, 0, benchBooks(b), benchIdentity(b))
	clients := benchEnv("BENCH_CLIENTS", 32)
	l := newLoad(benchEnv("BENCH_ACCOUNTS", 1000))
	plans := make([][]planned, clients)
	for c := range clients {
		// Submission 0 warms the pools and the statement caches.
		plans[c] = l.plans(c, clients, 0, 1+b.N/clients+min(1, max(0, b.N%clients-c)))
	}
	s.book(b, l, plans...)
	for c := range clients {
		if err := do(s.client, l.requestFor(s.proxyURL, plans[c][0]), http.StatusOK); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([][]time.Duration, clients)
	var failed atomic.Int64
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime(b)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for _, p := range plans[c][1:] {
				req := l.requestFor(s.proxyURL, p)
				t0 := time.Now()
				if err := do(s.client, req, http.StatusOK); err != nil {
					failed.Add(1)
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), cpuTime(b)-cpu0
	b.StopTimer()
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d of %d submissions not ACKED", f, b.N)
	}
	all := slices.Concat(lat...)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "submissions/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/submission")
	b.ReportMetric(ms(percentile(all, 0.50)), "p50-ms")
	b.ReportMetric(ms(percentile(all, 0.99)), "p99-ms")
	b.ReportMetric(0, "ns/op")
}

// openLoop offers n requests at rate per second, each on its own goroutine at
// its scheduled time, and returns their latencies.
func openLoop(b *testing.B, n int, rate float64, do func(i int) error) []time.Duration {
	lat := make([]time.Duration, n)
	var failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		time.Sleep(time.Until(at))
		wg.Go(func() {
			t0 := time.Now()
			if err := do(i); err != nil {
				failed.Add(1)
			}
			lat[i] = time.Since(t0)
		})
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d of %d requests failed", f, n)
	}
	return lat
}

// BenchmarkAddedLatency: at BENCH_RATE submissions per second (set it to half
// of BenchmarkAdmission's throughput), the latency of calling the rail-stub
// directly and of submitting through the proxy; reports both and their
// difference at p50 and p99 — the latency the proxy adds.
func BenchmarkAddedLatency(b *testing.B) {
	s := startBenchSystem(b, 0, benchBooks(b))
	rate := float64(benchEnv("BENCH_RATE", 1500))
	l := newLoad(benchEnv("BENCH_ACCOUNTS", 1000))
	// The submissions through the proxy, warm-up's then the measured ones: 64
	// clients' worth, drawn (and booked) before the clock starts.
	draw := func(n int) []planned {
		out := make([]planned, n)
		for i := range out {
			out[i] = l.plan(i%64, 64, i/64)
		}
		return out
	}
	warm, measured := draw(200), draw(b.N)
	s.book(b, l, warm, measured)
	direct := func(i int) error {
		body := fmt.Sprintf(`{"reference":"d-%s-%d","accountId":"a","amountMinor":1,"currency":"EUR","beneficiary":"NL91ABNA0417164300"}`, l.prefix, i)
		req, _ := http.NewRequest(http.MethodPost, s.stubURL+"/rail/v1/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		return do(s.client, req, http.StatusOK)
	}
	via := func(ps []planned) func(i int) error {
		return func(i int) error { return do(s.client, l.requestFor(s.proxyURL, ps[i]), http.StatusOK) }
	}
	openLoop(b, 200, rate, direct) // warm-up
	openLoop(b, 200, rate, via(warm))
	b.ResetTimer()
	d := openLoop(b, b.N, rate, direct)
	v := openLoop(b, b.N, rate, via(measured))
	b.StopTimer()
	dp50, dp99 := percentile(d, .5), percentile(d, .99)
	vp50, vp99 := percentile(v, .5), percentile(v, .99)
	b.ReportMetric(ms(dp50), "direct-p50-ms")
	b.ReportMetric(ms(dp99), "direct-p99-ms")
	b.ReportMetric(ms(vp50), "proxy-p50-ms")
	b.ReportMetric(ms(vp99), "proxy-p99-ms")
	b.ReportMetric(ms(vp50-dp50), "added-p50-ms")
	b.ReportMetric(ms(vp99-dp99), "added-p99-ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkInflightRSS: a rail-proxy process of its own (the real binary, built
// by the benchmark) holds BENCH_INFLIGHT submissions in flight against a rail-stub
// that answers in 1 s; reports the child's peak resident set (VmHWM).
func BenchmarkInflightRSS(b *testing.B) {
	dbURL := benchPaydb(b, pgcluster.Options{MaxConnections: 100})
	stub := startStub(b, 1000)
	inflight := benchEnv("BENCH_INFLIGHT", 2000)

	// The real binary, built here, so the figure is rail-proxy's and not the test
	// binary's.
	// It measures memory held by submissions in flight, of made-up payouts: the
	// books check is off.
	url, stderr, pid := startBinary(b, "UNSAFE_NON_DURABLE_DB=true", "PAYDB_URL="+dbURL, "RAIL_BASE_URL="+stub.URL, "LOG_LEVEL=warn",
		"RAIL_PROXY_BOOKS_CHECK=false")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096}, Timeout: 30 * time.Second}
	l := newLoad(inflight)
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		var wg sync.WaitGroup
		var failed atomic.Int64
		for i := range inflight {
			wg.Go(func() {
				if err := do(client, l.request(url, i, inflight, n), http.StatusOK); err != nil {
					failed.Add(1)
				}
			})
		}
		// While they are all held by the rail, read what the child says of itself.
		time.Sleep(700 * time.Millisecond)
		peak, err := testkit.Scrape(context.Background(), client, url+"/metrics")
		if err != nil {
			b.Fatal(err)
		}
		wg.Wait()
		if f := failed.Load(); f > 0 {
			b.Fatalf("%d of %d failed: %s", f, inflight, stderr.String())
		}
		for _, k := range []string{"go_goroutines", "go_memstats_stack_inuse_bytes", "go_memstats_heap_inuse_bytes", "rail_submission_inflight"} {
			v, _ := peak.Value(k)
			unit := k
			if strings.HasSuffix(k, "_bytes") {
				v, unit = v/(1<<20), strings.TrimSuffix(k, "_bytes")+"-MiB"
			}
			b.ReportMetric(v, unit)
		}
	}
	b.StopTimer()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && (f[0] == "VmHWM:" || f[0] == "VmRSS:") {
			kb, _ := strconv.ParseFloat(f[1], 64)
			b.ReportMetric(kb/1024, strings.TrimSuffix(f[0], ":")+"-MiB")
		}
	}
	b.ReportMetric(0, "ns/op")
}

// benchPaydb starts a throwaway cluster with opts and returns the URL of a
// migrated paydb on it, stopped when the benchmark ends.
func benchPaydb(b *testing.B, opts pgcluster.Options) string {
	b.Helper()
	ctx := context.Background()
	cluster, err := pgcluster.Start(ctx, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cluster.Stop() })
	if err := cluster.CreateDatabase(ctx, "paydb", ""); err != nil {
		b.Fatal(err)
	}
	dbURL := cluster.URL("paydb")
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := paydb.Tree().Migrate(ctx, pool, nil); err != nil {
		b.Fatal(err)
	}
	return dbURL
}

// BenchmarkIdleConnRSS: the real rail-proxy binary (built by the benchmark)
// holds BENCH_IDLE_CONNS idle keep-alive connections, each having answered one
// GET /livez; reports the process's resident set before and after they were
// opened, and the difference per connection. With BENCH_IDENTITY the proxy
// serves mutual TLS and each connection is a full handshake with the
// executor's SVID (no session resumption: each is a workload's first).
func BenchmarkIdleConnRSS(b *testing.B) {
	dbURL := benchPaydb(b, pgcluster.Options{})
	n := benchEnv("BENCH_IDLE_CONNS", 1000)
	tlsOn := benchIdentity(b)
	var certs, railURL string
	if tlsOn {
		// a proxy with identity calls the rail over mutual TLS only
		certs = benchCerts(b)
		railURL = startTLSStub(b, certs, identity.NameRailStub, 0).URL
	} else {
		railURL = startStub(b, 0).URL
	}
	env := []string{"UNSAFE_NON_DURABLE_DB=true", "PAYDB_URL=" + dbURL, "RAIL_BASE_URL=" + railURL, "LOG_LEVEL=warn",
		"RAIL_PROXY_BOOKS_CHECK=false"}
	var cfg *tls.Config
	if tlsOn {
		id := identity.Files(certs, identity.NameRailProxy)
		env = append(env, "TLS_CERT_FILE="+id.CertFile, "TLS_KEY_FILE="+id.KeyFile, "TLS_CA_FILE="+id.CAFile)
		cfg = benchTLS(b, certs)
		cfg.ClientSessionCache = nil // every connection a full handshake
	}
	addr, pid := startBinaryAddr(b, env...)
	rss := func() float64 {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				return kb / 1024
			}
		}
		b.Fatal("no VmRSS")
		return 0
	}
	// open makes one connection and has it answer GET /livez, leaving it open.
	open := func() (net.Conn, error) {
		d := &net.Dialer{Timeout: 10 * time.Second}
		var c net.Conn
		var err error
		if cfg != nil {
			c, err = tls.DialWithDialer(d, "tcp", addr, cfg)
		} else {
			c, err = d.Dial("tcp", addr)
		}
		if err != nil {
			return nil, err
		}
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: rail-proxy\r\n\r\n"); err != nil {
			c.Close()
			return nil, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			c.Close()
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			c.Close()
			return nil, fmt.Errorf("GET /livez: %d", resp.StatusCode)
		}
		return c, nil
	}
	// A few connections first, so the figure is the connections' and not the
	// first handshake's one-time allocations.
	for range 10 {
		c, err := open()
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
	time.Sleep(time.Second)
	b.ResetTimer()
	for range b.N {
		before := rss()
		conns := make([]net.Conn, 0, n)
		for range n {
			c, err := open()
			if err != nil {
				b.Fatalf("connection %d: %v", len(conns), err)
			}
			conns = append(conns, c)
		}
		time.Sleep(time.Second)
		after := rss()
		for _, c := range conns {
			c.Close()
		}
		b.ReportMetric(before, "rss-before-MiB")
		b.ReportMetric(after, "rss-after-MiB")
		b.ReportMetric((after-before)*1024/float64(n), "KiB/conn")
	}
	b.ReportMetric(0, "ns/op")
}

// startBinaryAddr builds cmd/rail-proxy, starts it with env on a free loopback
// port and HEALTH_ADDR on another, waits until the plaintext health listener
// answers /livez, and returns the main listener's address and the process id.
func startBinaryAddr(b *testing.B, env ...string) (addr string, pid int) {
	b.Helper()
	bin := os.Getenv("BENCH_BINARY")
	if bin == "" {
		bin = filepath.Join(b.TempDir(), "rail-proxy")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "lock.dev/cmd/rail-proxy").CombinedOutput(); err != nil {
			b.Fatalf("go build: %v\n%s", err, out)
		}
	}
	free := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	addr, health := free(), free()
	cmd := exec.Command(bin)
	cmd.Env = append(append(os.Environ(), "RAIL_PROXY_ADDR="+addr, "HEALTH_ADDR="+health, "UNSAFE_NO_AUTH=true"), env...)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitLive(b, "http://"+health)
	return addr, cmd.Process.Pid
}
