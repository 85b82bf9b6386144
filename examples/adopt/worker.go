package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// write posts one entry to the ledger for account, with the fencing headers
// present puts on the request, and says what the ledger answered: "201
// Created", or the status, code and why.
func write(ctx context.Context, hc *http.Client, ledgerURL, account string, present func(*http.Request)) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	body, err := json.Marshal(entryRequest{AmountMinor: 125000})
	if err != nil {
		return 0, "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ledgerURL+"/accounts/"+account+"/entries", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	present(req)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("write to the ledger: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return 0, "", fmt.Errorf("read the ledger's answer: %w", err)
	}
	if resp.StatusCode == http.StatusCreated {
		return resp.StatusCode, "201 Created", nil
	}
	var p struct{ Code, Reason, Detail string }
	_ = json.Unmarshal(b, &p)
	why := p.Detail
	if p.Reason != "" { // a refused grant: its reason says it all
		why = p.Reason
	}
	words := strconv.Itoa(resp.StatusCode) + " " + p.Code + " " + why
	return resp.StatusCode, strings.Join(strings.Fields(words), " "), nil
}

// story is what the program shows: two workers, one account, and the stale
// one refused.
func story(ctx context.Context, c config, ids identities, ledgerURL string, out io.Writer) error {
	var opts []lockclient.Option
	if ids.toLockServer != nil {
		opts = append(opts, lockclient.WithTLSConfig(ids.toLockServer))
	}
	locks, err := lockclient.New(c.lockServer, opts...)
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{TLSClientConfig: ids.toLedger}}
	defer hc.CloseIdleConnections()
	name := lockName(c.account)
	say := func(what string, token int64, present func(*http.Request), want int) error {
		status, answer, err := write(ctx, hc, ledgerURL, c.account, present)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s under token %d: %s\n", what, token, answer)
		if status != want {
			return fmt.Errorf("%s: answered %q, want %d", what, answer, want)
		}
		return nil
	}

	// Lock waits until the lease is held; ctx bounds the wait.
	a, err := locks.Lock(ctx, name, "worker-a", c.ttl)
	if err != nil {
		return fmt.Errorf("worker-a takes %s: %w", name, err)
	}
	fmt.Fprintf(out, "worker-a holds %s with token %d\n", name, a.Token())
	if err := say("worker-a writes", a.Token(), a.SetHeaders, http.StatusCreated); err != nil {
		return err
	}
	// A token is believed only with the grant of it: a larger number is
	// refused before the mark is even read.
	const madeUp = lockapi.MaxInt64
	forged := func(r *http.Request) {
		a.SetHeaders(r)
		r.Header.Set(lockapi.HeaderFencingToken, strconv.FormatInt(madeUp, 10))
	}
	if err := say("worker-a presents a made-up token", madeUp, forged, http.StatusUnauthorized); err != nil {
		return err
	}

	// worker-b waits for the lock while worker-a holds it.
	type locked struct {
		lease *lockclient.Lease
		err   error
	}
	bc := make(chan locked, 1)
	go func() {
		l, err := locks.Lock(ctx, name, "worker-b", c.ttl)
		bc <- locked{l, err}
	}()
	// worker-a is paused — a GC pause, a VM migration — past its lease. Here
	// the lease is released rather than waited out, but worker-a keeps the
	// lease's token and grant, as a paused process does.
	if err := a.Release(ctx); err != nil {
		return fmt.Errorf("worker-a's lease ends: %w", err)
	}
	bl := <-bc
	if bl.err != nil {
		return fmt.Errorf("worker-b takes %s: %w", name, bl.err)
	}
	b := bl.lease
	defer func() { _ = b.Release(context.WithoutCancel(ctx)) }()
	fmt.Fprintf(out, "worker-b holds %s with token %d\n", name, b.Token())
	if err := say("worker-b writes", b.Token(), b.SetHeaders, http.StatusCreated); err != nil {
		return err
	}
	// worker-a wakes up, still believing it holds the lock: its grant is
	// genuine, its token is not the newest.
	return say("worker-a, stale, writes", a.Token(), a.SetHeaders, http.StatusConflict)
}
