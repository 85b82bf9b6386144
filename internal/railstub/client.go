package railstub

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

// Client reads and steers a rail-stub over HTTP: the ground truth for tests,
// lockdemo and the invariant checker.
type Client struct {
	BaseURL string
	HTTP    *http.Client
}

// clientTimeout bounds every call of a Client whose HTTP client has no timeout of
// its own; a full page of calls is a few megabytes on loopback.
const clientTimeout = 30 * time.Second

// maxReplyBytes bounds a reply: a full page of 10 000 calls is about 4 MiB.
const maxReplyBytes = 64 << 20

// NewClient is a Client for the stub at baseURL (e.g. http://127.0.0.1:8084).
func NewClient(baseURL string) *Client { return NewTLSClient(baseURL, nil) }

// NewTLSClient is NewClient calling over mutual TLS with cfg (the caller's
// Source.ClientConfig expecting rail-stub's SPIFFE ID); nil: plaintext.
func NewTLSClient(baseURL string, cfg *tls.Config) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.TLSClientConfig = cfg
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), HTTP: &http.Client{Timeout: clientTimeout, Transport: tr}}
}

// Calls returns every call the stub has booked, in arrival order, page by page.
func (c *Client) Calls(ctx context.Context) ([]Call, error) {
	var all []Call
	after := int64(0)
	for {
		page, err := c.CallsPage(ctx, after, MaxPageLimit)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if len(page) < MaxPageLimit {
			return all, nil
		}
		after = page[len(page)-1].Seq
	}
}

// CallsPage returns up to limit calls with seq > after.
func (c *Client) CallsPage(ctx context.Context, after int64, limit int) ([]Call, error) {
	q := url.Values{"after": {strconv.FormatInt(after, 10)}, "limit": {strconv.Itoa(limit)}}
	var list CallList
	if err := c.do(ctx, http.MethodGet, "/rail/v1/calls?"+q.Encode(), nil, http.StatusOK, &list); err != nil {
		return nil, err
	}
	return list.Calls, nil
}

// SetChaos replaces every knob; a nil seed keeps the current seed and the
// generator's position. It returns the settings now in force.
func (c *Client) SetChaos(ctx context.Context, latencyMs int, declineRate, dropRate float64, seed *int64) (Chaos, error) {
	body := map[string]any{"latencyMs": latencyMs, "declineRate": declineRate, "dropRate": dropRate}
	if seed != nil {
		body["seed"] = *seed
	}
	var out Chaos
	err := c.do(ctx, http.MethodPut, "/rail/v1/admin/chaos", body, http.StatusOK, &out)
	return out, err
}

// Chaos returns the settings in force.
func (c *Client) Chaos(ctx context.Context) (Chaos, error) {
	var out Chaos
	err := c.do(ctx, http.MethodGet, "/rail/v1/admin/chaos", nil, http.StatusOK, &out)
	return out, err
}

// Reset clears the call log; the next call is seq 1.
func (c *Client) Reset(ctx context.Context) error {
	return c.do(ctx, http.MethodDelete, "/rail/v1/calls", nil, http.StatusNoContent, nil)
}

// Health is nil when the stub answers 200 on /rail/v1/health.
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/rail/v1/health", nil, http.StatusOK, nil)
}

// Pay presents one payment. An accept and a decline are both replies (Status
// says which); a dropped connection is the transport's error. It is for tests and
// demonstrations: a Pay that fails is never retried, since the rail may have acted.
func (c *Client) Pay(ctx context.Context, p PaymentRequest) (PaymentReply, error) {
	var reply PaymentReply
	b, err := json.Marshal(p)
	if err != nil {
		return reply, fmt.Errorf("encode payment: %w", err)
	}
	// No GetBody: the transport must never be able to resend a payment.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.BaseURL+"/rail/v1/payments", io.NopCloser(bytes.NewReader(b)))
	if err != nil {
		return reply, fmt.Errorf("rail payment: %w", err)
	}
	req.ContentLength = int64(len(b))
	req.Header.Set("Content-Type", "application/json")
	status, body, err := c.roundTrip(req)
	if err != nil {
		return reply, err
	}
	if status != http.StatusOK && status != http.StatusUnprocessableEntity {
		return reply, replyError(req, status, body)
	}
	if err := json.Unmarshal(body, &reply); err != nil {
		return reply, fmt.Errorf("POST /rail/v1/payments: decode reply: %w", err)
	}
	return reply, nil
}

func (c *Client) do(ctx context.Context, method, path string, in any, want int, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s %s: encode: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	status, b, err := c.roundTrip(req)
	if err != nil {
		return err
	}
	if status != want {
		return replyError(req, status, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: decode reply: %w", method, path, err)
		}
	}
	return nil
}

func (c *Client) roundTrip(req *http.Request) (int, []byte, error) {
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: clientTimeout}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, err := lockapi.ReadAllLimited(resp.Body, maxReplyBytes)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: read reply: %w", req.Method, req.URL.Path, err)
	}
	if p := lockapi.ReadProblem(resp, b); p != nil && resp.StatusCode >= 400 {
		return resp.StatusCode, b, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, p)
	}
	return resp.StatusCode, b, nil
}

func replyError(req *http.Request, status int, body []byte) error {
	const max = 200
	if len(body) > max {
		body = body[:max]
	}
	return fmt.Errorf("%s %s: unexpected status %d: %s", req.Method, req.URL.Path, status, strings.TrimSpace(string(body)))
}
