package payment

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"lock.dev/lockapi"
)

// DefaultClientTimeout bounds each Client call when Client.Timeout is zero.
const DefaultClientTimeout = 10 * time.Second

// maxIdleConnsPerHost is how many idle connections a client keeps to its
// payment-resource (NewTLSClient).
const maxIdleConnsPerHost = 32

// maxAnswerBytes bounds an answer's body: a full list of 1000 payouts is far below it.
const maxAnswerBytes = 8 << 20

// Client is payment-resource's Go client. A problem answer comes back as a
// *lockapi.Problem (use errors.As and look at Code); any other error is a
// transport failure or an answer that is not the API's.
//
// It never sends X-Idempotency-Key (the transport hazard,
// docs/contracts/executor.md): without it a POST is never silently resent by
// net/http on a reused connection, so a claim is never presented twice (a second
// presentation of the same token would come back FENCED_OUT and mislead the
// caller).
type Client struct {
	BaseURL string
	HTTP    *http.Client
	// Timeout bounds each call, connecting and reading the whole answer
	// included; zero means DefaultClientTimeout.
	Timeout time.Duration
}

// NewClient returns a client of the payment-resource at baseURL
// (e.g. http://127.0.0.1:8082).
//
// A claim or a post is presented once: the client follows no redirect (a 307 or
// 308 would send it again, to an address nobody configured, and a 301–303 would
// turn it into a GET of something else) and uses no proxy from the environment
// (a proxy may retry a request on its own). A redirect comes back as an error.
func NewClient(baseURL string) *Client { return NewTLSClient(baseURL, nil) }

// NewTLSClient is NewClient calling over mutual TLS with cfg (the caller's
// Source.ClientConfig expecting payment-resource's SPIFFE ID); nil: plaintext.
// Its idle connections are kept per host, so a worker's calls reuse one
// connection and pay no handshake.
func NewTLSClient(baseURL string, cfg *tls.Config) *Client {
	// A transport of its own: closing its idle connections, or several services
	// in one process, then touch nothing shared.
	tr, ok := http.DefaultTransport.(*http.Transport)
	if ok {
		tr = tr.Clone()
	} else {
		tr = &http.Transport{}
	}
	tr.Proxy = nil
	tr.TLSClientConfig = cfg
	// Over mutual TLS a new connection costs a handshake (certificate
	// verification both ways), so connections are kept: net/http keeps only 2
	// idle per host by default, and an executor's workers (EXECUTOR_WORKERS,
	// each with a call in flight) would then open and drop connections at every
	// burst. 32 covers the executor's and reconciler's usual concurrency; more
	// in flight still works, the extra connections are just not kept.
	tr.MaxIdleConnsPerHost = maxIdleConnsPerHost
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), HTTP: &http.Client{Transport: tr, CheckRedirect: noRedirect}}
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Create creates a payout, or returns the existing one when it has the same five
// fields (PAYOUT_CONFLICT when they differ).
func (c *Client) Create(ctx context.Context, req lockapi.SubmissionRequest) (lockapi.Payout, error) {
	var p lockapi.Payout
	err := c.do(ctx, http.MethodPost, "/v1/payouts", nil, nil, req, &p)
	return p, err
}

// Get reads one payout.
func (c *Client) Get(ctx context.Context, id string) (lockapi.Payout, error) {
	var p lockapi.Payout
	err := c.do(ctx, http.MethodGet, "/v1/payouts/"+url.PathEscape(id), nil, nil, nil, &p)
	return p, err
}

// List reads payouts oldest updatedAt first. Empty status or accountID, a nil
// updatedBefore and a zero limit do not filter (the server's default limit applies).
func (c *Client) List(ctx context.Context, status, accountID string, updatedBefore *time.Time, limit int) ([]lockapi.Payout, error) {
	q := url.Values{}
	if status != "" {
		q.Set("status", status)
	}
	if accountID != "" {
		q.Set("accountId", accountID)
	}
	if updatedBefore != nil {
		q.Set("updatedBefore", updatedBefore.UTC().Format(time.RFC3339Nano))
	}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var l lockapi.PayoutList
	if err := c.do(ctx, http.MethodGet, "/v1/payouts", q, nil, nil, &l); err != nil {
		return nil, err
	}
	if l.Payouts == nil {
		l.Payouts = []lockapi.Payout{}
	}
	return l.Payouts, nil
}

// Claim claims a payout with token for owner (fence point (a)), without a grant.
func (c *Client) Claim(ctx context.Context, id string, token int64, owner string) (lockapi.Payout, error) {
	return c.ClaimWithGrant(ctx, id, token, "", owner)
}

// ClaimWithGrant is Claim presenting grant, lock-server's signed grant of token
// (docs/contracts/signed-grants.md; "" sends none).
func (c *Client) ClaimWithGrant(ctx context.Context, id string, token int64, grant, owner string) (lockapi.Payout, error) {
	var p lockapi.Payout
	err := c.do(ctx, http.MethodPost, "/v1/payouts/"+url.PathEscape(id)+"/claim", nil, lockapi.FencingHeaders(token, grant, owner), nil, &p)
	return p, err
}

// Post records the rail's outcome for a payout claimed with token by owner,
// without a grant.
func (c *Client) Post(ctx context.Context, id string, token int64, owner string, req lockapi.PostRequest) (lockapi.Payout, error) {
	return c.PostWithGrant(ctx, id, token, "", owner, req)
}

// PostWithGrant is Post presenting grant, lock-server's signed grant of token
// (docs/contracts/signed-grants.md; "" sends none).
func (c *Client) PostWithGrant(ctx context.Context, id string, token int64, grant, owner string, req lockapi.PostRequest) (lockapi.Payout, error) {
	var p lockapi.Payout
	err := c.do(ctx, http.MethodPost, "/v1/payouts/"+url.PathEscape(id)+"/post", nil, lockapi.FencingHeaders(token, grant, owner), req, &p)
	return p, err
}

func (c *Client) do(ctx context.Context, method, path string, q url.Values, h http.Header, in, out any) error {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultClientTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := c.BaseURL + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("payment-resource %s %s: encode: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return fmt.Errorf("payment-resource %s %s: %w", method, path, err)
	}
	// No re-readable body: together with never sending an idempotency key,
	// the transport has no grounds to present a request twice.
	req.GetBody = nil
	for k, vs := range h {
		req.Header[k] = vs
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json, application/problem+json")
	hc := http.Client{}
	if c.HTTP != nil {
		hc = *c.HTTP
	}
	// Whatever client the caller gave: a redirect is an answer, never followed.
	hc.CheckRedirect = noRedirect
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("payment-resource %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := lockapi.ReadAllLimited(resp.Body, maxAnswerBytes)
	if err != nil {
		return fmt.Errorf("payment-resource %s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("payment-resource %s %s: decoding the %d answer: %w", method, path, resp.StatusCode, err)
		}
		return nil
	}
	if p := lockapi.ReadProblem(resp, b); p != nil {
		return p
	}
	return fmt.Errorf("payment-resource %s %s: unexpected %d answer", method, path, resp.StatusCode)
}
