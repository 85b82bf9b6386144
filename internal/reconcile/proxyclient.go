package reconcile

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"lock.dev/lockapi"
)

// pageLimit is the statement page the reconciler asks for: rail-proxy's largest.
const pageLimit = 1000

// maxReply bounds a reply read from rail-proxy or payment-resource: a full page
// of 1000 lines is about 300 KiB.
const maxReply = 8 << 20

// statementClient reads the rail's statement through rail-proxy
// (docs/contracts/reconciliation.md, "The statement, read through rail-proxy").
// A GET moves no money: a failed read is retried by the next pass.
type statementClient struct {
	base string
	http *http.Client
}

// newStatementClient is a client of rail-proxy at base over mutual TLS with
// tlsCfg (nil: plaintext).
func newStatementClient(base string, tlsCfg *tls.Config) *statementClient {
	return &statementClient{
		base: strings.TrimRight(base, "/"),
		http: &http.Client{Timeout: HTTPTimeout, Transport: newTransport(tlsCfg)},
	}
}

// newTransport is a transport for one service, over mutual TLS with tlsCfg
// (nil: plaintext). A pass makes its calls one after another, so a few idle
// connections keep every call after the first free of a handshake.
func newTransport(tlsCfg *tls.Config) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.TLSClientConfig = tlsCfg
	t.MaxIdleConnsPerHost = 4
	t.IdleConnTimeout = 30 * time.Second
	return t
}

// page reads up to limit lines after seq after, and checks the page is one: seqs
// strictly increasing from after, at most limit lines, every line with its
// beneficiary, next the last seq of a full page and null otherwise. A reconciler
// must never import a statement it had to guess at: a line without a beneficiary
// (a rail-proxy older than the statement's beneficiary) fails the read, and with
// it the pass, so the cursor stays before it and the line is copied, whole, once
// rail-proxy serves it (docs/contracts/reconciliation.md).
func (c *statementClient) page(ctx context.Context, after int64, limit int) (lockapi.Statement, error) {
	q := url.Values{"after": {strconv.FormatInt(after, 10)}, "limit": {strconv.Itoa(limit)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/rail/statement?"+q.Encode(), nil)
	if err != nil {
		return lockapi.Statement{}, err
	}
	req.Header.Set("Accept", "application/json")
	status, body, err := roundTrip(c.http, req)
	if err != nil {
		return lockapi.Statement{}, fmt.Errorf("read the statement after %d: %w", after, err)
	}
	if status != http.StatusOK {
		return lockapi.Statement{}, fmt.Errorf("read the statement after %d: %w", after, replyError(status, body))
	}
	var st lockapi.Statement
	if err := json.Unmarshal(body, &st); err != nil || st.Lines == nil {
		return lockapi.Statement{}, fmt.Errorf("read the statement after %d: the reply is not a statement page", after)
	}
	if len(st.Lines) > limit {
		return lockapi.Statement{}, fmt.Errorf("read the statement after %d: %d lines, %d were asked for", after, len(st.Lines), limit)
	}
	prev := after
	for _, l := range st.Lines {
		if l.Seq <= prev {
			return lockapi.Statement{}, fmt.Errorf("read the statement after %d: seq %d does not follow %d", after, l.Seq, prev)
		}
		if l.Result != lockapi.ResultAccepted && l.Result != lockapi.ResultDeclined {
			return lockapi.Statement{}, fmt.Errorf("read the statement after %d: line %d has result %q", after, l.Seq, l.Result)
		}
		if l.Beneficiary == "" {
			return lockapi.Statement{}, fmt.Errorf("read the statement after %d: line %d has no beneficiary", after, l.Seq)
		}
		prev = l.Seq
	}
	full := len(st.Lines) == limit
	if full != (st.Next != nil) || (st.Next != nil && *st.Next != prev) {
		return lockapi.Statement{}, fmt.Errorf("read the statement after %d: next does not name the last line of a full page", after)
	}
	return st, nil
}

// livez is the railProxy readiness check: rail-proxy answers its liveness.
func (c *statementClient) livez(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, HealthTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/livez", nil)
	if err != nil {
		return err
	}
	status, _, err := roundTrip(c.http, req)
	if err != nil {
		return fmt.Errorf("rail-proxy: %w", err)
	}
	if status != http.StatusOK {
		return fmt.Errorf("rail-proxy: /livez answered %d", status)
	}
	return nil
}

func (c *statementClient) close() { c.http.CloseIdleConnections() }

func roundTrip(hc *http.Client, req *http.Request) (int, []byte, error) {
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxReply+1))
	if err != nil {
		return 0, nil, fmt.Errorf("read the reply: %w", err)
	}
	if len(b) > maxReply {
		return 0, nil, errors.New("the reply is too large")
	}
	return resp.StatusCode, b, nil
}

// replyError is an unexpected answer: its problem when it is one.
func replyError(status int, body []byte) error {
	var p lockapi.Problem
	if err := json.Unmarshal(body, &p); err == nil && p.Code != "" {
		p.Status = status
		return &p
	}
	return fmt.Errorf("unexpected status %d", status)
}
