package reconcile

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"lock.dev/lockapi"
)

// settleClient posts settles to payment-resource (docs/contracts/reconciliation.md) with the bearer
// token. A settle is idempotent at the server (an identical repeat changes
// nothing), so the transport resending one it never wrote is harmless.
type settleClient struct {
	base  string
	token string
	http  *http.Client
}

// newSettleClient is a client of payment-resource at base over mutual TLS with
// tlsCfg (nil: plaintext); the bearer token is sent as well.
func newSettleClient(base, token string, tlsCfg *tls.Config) *settleClient {
	return &settleClient{
		base:  strings.TrimRight(base, "/"),
		token: token,
		http:  &http.Client{Timeout: HTTPTimeout, Transport: newTransport(tlsCfg)},
	}
}

// settleVerdict is what payment-resource made of a settle.
type settleVerdict int

const (
	settleDone      settleVerdict = iota + 1 // 200: the payout is now what was asked
	settleRefused                            // 409 (final otherwise, or an executor owns it) or 404 (no such payout): a person looks
	settleMalformed                          // 400: a bug of ours; this payout is skipped
)

// errSettleBroken says no settle can succeed as things stand — the token is wrong
// (401) or the endpoint is off (404) — or payment-resource could not be reached:
// the pass stops settling and the next one tries again.
var errSettleBroken = errors.New("settles cannot be posted")

// settle posts one settle. The error is errSettleBroken (wrapped) when the pass
// should stop settling.
func (c *settleClient) settle(ctx context.Context, payoutID string, req lockapi.SettleRequest) (settleVerdict, *lockapi.Problem, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return 0, nil, err
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/payouts/"+url.PathEscape(payoutID)+"/settle", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer "+c.token)
	status, b, err := roundTrip(c.http, r)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: payment-resource: %w", errSettleBroken, err)
	}
	if status == http.StatusOK {
		return settleDone, nil, nil
	}
	perr := replyError(status, b)
	var p *lockapi.Problem
	errors.As(perr, &p)
	switch {
	case status == http.StatusConflict, status == http.StatusNotFound && p != nil && strings.HasPrefix(p.Detail, "no payout"):
		return settleRefused, p, nil
	case status == http.StatusBadRequest:
		return settleMalformed, p, nil
	case status == http.StatusUnauthorized:
		return 0, p, fmt.Errorf("%w: payment-resource refused the bearer token (is PAYMENT_SETTLE_TOKEN the same on both?): %w", errSettleBroken, perr)
	case status == http.StatusNotFound:
		return 0, p, fmt.Errorf("%w: payment-resource has no settle endpoint (is PAYMENT_SETTLE_TOKEN set there?): %w", errSettleBroken, perr)
	default:
		return 0, p, fmt.Errorf("%w: payment-resource answered: %w", errSettleBroken, perr)
	}
}

func (c *settleClient) close() { c.http.CloseIdleConnections() }
