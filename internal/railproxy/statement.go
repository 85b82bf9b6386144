package railproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockapi"
	"lock.dev/rail"
)

// The statement (docs/contracts/reconciliation.md): what the rail says it was presented, read
// through the proxy so that the proxy stays the only process that talks to the
// rail. Reading it moves no money, so none of the payment path's hazards apply:
// it goes over a transport of its own (never the payments pool), and a failed
// read is simply retried by its caller. It is still bounded: connecting by
// RAIL_CONNECT_TIMEOUT, the whole read by RAIL_READ_TIMEOUT.

// MaxStatementLimit is the default and largest page of GET /v1/rail/statement.
const MaxStatementLimit = 1000

// StageStatement is RAIL_UNAVAILABLE's stage when the statement cannot be read.
const StageStatement = "statement"

// maxStatementReply bounds a statement page read from the rail: 1000 calls are
// about 400 KiB; anything far beyond is not the page asked for.
const maxStatementReply = 8 << 20

// Values of rail_statement_read_total{result}.
var statementResults = []string{"ok", "error"}

// newStatementMetric registers rail_statement_read_total, zero-initialised
// (docs/contracts/observability.md): one count per read of the rail's statement,
// by result.
func newStatementMetric(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rail_statement_read_total",
		Help: "Reads of the rail's statement, by result.",
	}, []string{"result"})
	reg.MustRegister(c)
	for _, r := range statementResults {
		c.WithLabelValues(r)
	}
	return c
}

// statementReader reads a page of the rail's statement through the adapter
// (rail-stub: its call log, GET /rail/v1/calls; ISO 20022: camt.053), which maps
// it to statement lines, field for field, the beneficiary included.
type statementReader struct {
	rail        *railClient
	http        *http.Client
	readTimeout time.Duration
	reads       *prometheus.CounterVec
	logger      *slog.Logger
}

// handleStatement is GET /v1/rail/statement. Its rail client is built from the
// payment client's settings but shares nothing with it.
func handleStatement(rc *railClient, reads *prometheus.CounterVec, logger *slog.Logger) http.HandlerFunc {
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	s := &statementReader{
		rail:        rc,
		http:        &http.Client{Transport: newRailTransport(rc.connectTimeout, DefaultRailIdleConnTimeout, 2, nil, rc.tls), CheckRedirect: noRedirect},
		readTimeout: rc.readTimeout,
		reads:       reads,
		logger:      logger,
	}
	return s.serve
}

func (s *statementReader) serve(w http.ResponseWriter, r *http.Request) {
	after, limit, errs := parseStatementQuery(r.URL.RawQuery)
	if len(errs) > 0 {
		lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
		return
	}
	st, err := s.read(r.Context(), after, limit)
	if err != nil {
		s.reads.WithLabelValues("error").Inc()
		s.logger.Warn("the rail's statement could not be read", "event", "statement_read_failed",
			"stage", StageStatement, "after", after, "limit", limit, "error", err.Error())
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeRailUnavailable,
			"the rail's statement could not be read: "+err.Error()+"; reading it is safe to retry",
			map[string]any{"stage": StageStatement}))
		return
	}
	s.reads.WithLabelValues("ok").Inc()
	lockapi.WriteJSON(w, http.StatusOK, st)
}

// read fetches one page from the rail. A reply that is not a well-formed page —
// one the adapter does not read whole, a status other than 2xx, seqs not
// strictly increasing from after, more lines than asked, a result other than
// ACCEPTED or DECLINED, a line without its reference, account, currency or
// beneficiary — is an error: a reconciler must never import a statement it had
// to guess at. The gate checks all but the first itself, whatever the adapter.
// The text itself is passed on as the rail gave it; whether paydb can store it
// is the reconciler's judgement (docs/contracts/reconciliation.md).
func (s *statementReader) read(ctx context.Context, after int64, limit int) (lockapi.Statement, error) {
	ctx, cancel := context.WithTimeout(ctx, s.readTimeout)
	defer cancel()
	a := s.rail.adapter
	if a == nil {
		return lockapi.Statement{}, errors.New("rail client not configured")
	}
	sr, err := safely(a, func() (rail.Request, error) { return a.StatementRequest(after, limit), nil })
	if err != nil {
		return lockapi.Statement{}, err
	}
	req, err := s.rail.request(ctx, sr)
	if err != nil {
		return lockapi.Statement{}, err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return lockapi.Statement{}, fmt.Errorf("no whole reply within RAIL_READ_TIMEOUT %s: %w", s.readTimeout, err)
		}
		return lockapi.Statement{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxStatementReply+1))
	if err != nil {
		return lockapi.Statement{}, fmt.Errorf("reading the rail's reply: %w", err)
	}
	if len(b) > maxStatementReply {
		return lockapi.Statement{}, fmt.Errorf("the rail's reply exceeds %d bytes", maxStatementReply)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return lockapi.Statement{}, fmt.Errorf("the rail answered %d", resp.StatusCode)
	}
	lines, err := safely(a, func() ([]lockapi.StatementLine, error) {
		return a.ReadStatement(rail.Reply{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Body: b}, after, limit)
	})
	if err != nil {
		return lockapi.Statement{}, fmt.Errorf("the %s adapter: %w", a.Protocol(), err)
	}
	if len(lines) > limit {
		return lockapi.Statement{}, fmt.Errorf("the rail returned %d lines, %d were asked for", len(lines), limit)
	}
	st := lockapi.Statement{Lines: make([]lockapi.StatementLine, 0, len(lines))}
	prev := after
	for _, l := range lines {
		switch {
		case l.Seq <= prev:
			return lockapi.Statement{}, fmt.Errorf("the rail's seq %d does not follow %d", l.Seq, prev)
		case l.Result != lockapi.ResultAccepted && l.Result != lockapi.ResultDeclined:
			return lockapi.Statement{}, fmt.Errorf("line %d has result %q, neither ACCEPTED nor DECLINED", l.Seq, l.Result)
		case l.Reference == "" || l.AccountID == "" || l.Currency == "" || l.Beneficiary == "":
			return lockapi.Statement{}, fmt.Errorf("line %d lacks its reference, account, currency or beneficiary", l.Seq)
		}
		prev = l.Seq
		l.ReceivedAt = l.ReceivedAt.UTC()
		st.Lines = append(st.Lines, l)
	}
	if len(st.Lines) == limit {
		next := prev
		st.Next = &next
	}
	return st, nil
}

// parseStatementQuery reads after (an integer ≥ 0, default 0) and limit (1 to
// 1000, default 1000), each at most once, canonical decimal digits only, and
// nothing else.
func parseStatementQuery(raw string) (after int64, limit int, errs []lockapi.FieldError) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return 0, 0, []lockapi.FieldError{{Field: "query", Problem: "is not a well-formed query string"}}
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if k != "after" && k != "limit" {
			errs = append(errs, lockapi.FieldError{Field: k, Problem: "is not a known parameter"})
		}
	}
	after, limit = 0, MaxStatementLimit
	if vs, ok := q["after"]; ok {
		n, problem := canonicalInt(vs, 0, lockapi.MaxInt64)
		if problem != "" {
			errs = append(errs, lockapi.FieldError{Field: "after", Problem: problem})
		}
		after = n
	}
	if vs, ok := q["limit"]; ok {
		n, problem := canonicalInt(vs, 1, MaxStatementLimit)
		if problem != "" {
			errs = append(errs, lockapi.FieldError{Field: "limit", Problem: problem})
		}
		limit = int(n)
	}
	return after, limit, errs
}

// canonicalInt reads one decimal value within [lo, hi]: no sign, no leading zero,
// no spaces — a number that could be written two ways could be read two ways.
func canonicalInt(vs []string, lo, hi int64) (int64, string) {
	if len(vs) != 1 {
		return 0, "must appear at most once"
	}
	bounds := "must be an integer between " + strconv.FormatInt(lo, 10) + " and " + strconv.FormatInt(hi, 10)
	v := vs[0]
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || strconv.FormatInt(n, 10) != v || n < lo || n > hi {
		return 0, bounds
	}
	return n, ""
}
