package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/fence"
	"lock.dev/fence/fencepg"
)

// The ledger is the team's own service: entries per account, each written
// only by the current holder of the account's lock.

// migration is the ledger's schema: fencepg's mark table and its own.
var migration = []string{
	fencepg.Schema,
	`CREATE TABLE IF NOT EXISTS ledger_entry (
		id           bigserial   PRIMARY KEY,
		account      text        NOT NULL,
		amount_minor bigint      NOT NULL,
		token        bigint      NOT NULL, -- the fencing token it was written under
		owner        text        NOT NULL,
		written_at   timestamptz NOT NULL DEFAULT clock_timestamp()
	)`,
}

// insertEntry is the ledger's write, made after fencepg.Advance in the same
// transaction.
const insertEntry = `INSERT INTO ledger_entry (account, amount_minor, token, owner) VALUES ($1, $2, $3, $4) RETURNING id`

// ledgerServer is the ledger running on its own port.
type ledgerServer struct {
	url   string
	close func()
}

// lockName is the lock a write to an account is fenced on: the workers lease
// the same name.
func lockName(account string) string { return "ledger:" + account }

// newLedger is the ledger's HTTP API: POST /accounts/{account}/entries behind
// fence's middleware.
func newLedger(pool *pgxpool.Pool, v *fence.Verifier, opts []fence.Option, logger *slog.Logger) http.Handler {
	opts = append(opts, fence.OnRefusal(func(r *http.Request, status int, err error) {
		// The reason, lock and presented token; never the grant.
		logger.Warn("fenced write refused", "status", status, "error", err.Error(), "path", r.URL.Path)
	}))
	guard := fence.Middleware(v, func(r *http.Request) (string, error) {
		return lockName(r.PathValue("account")), nil
	}, opts...)
	mux := http.NewServeMux()
	mux.Handle("POST /accounts/{account}/entries", guard(writeEntry(pool)))
	return mux
}

// entryRequest is the body of a write.
type entryRequest struct {
	AmountMinor int64 `json:"amountMinor"`
}

// writeEntry writes one entry under the verified grant's token: the token is
// compared with the account's mark and the entry written in one transaction,
// so no older holder's write can land after a newer holder's.
func writeEntry(pool *pgxpool.Pool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		claims, ok := fence.FromContext(r.Context())
		if !ok {
			problem(w, http.StatusInternalServerError, "INTERNAL", "no verified grant", nil)
			return
		}
		var req entryRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil || req.AmountMinor <= 0 {
			problem(w, http.StatusBadRequest, "INVALID_REQUEST", "the body must be {\"amountMinor\": a positive integer}", nil)
			return
		}
		ctx := r.Context()
		tx, err := pool.Begin(ctx)
		if err != nil {
			problem(w, http.StatusServiceUnavailable, "UNAVAILABLE", "the ledger's database cannot be reached", nil)
			return
		}
		// A cancelled request never leaves the transaction open.
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			_ = tx.Rollback(rctx)
		}()
		err = fencepg.Advance(ctx, tx, claims.Lock, claims.Token)
		var stale *fencepg.StaleError
		switch {
		case errors.As(err, &stale):
			problem(w, http.StatusConflict, "FENCED_OUT", fmt.Sprintf("token %d is older than the mark %d", stale.Presented, stale.Mark),
				map[string]any{"presentedToken": stale.Presented, "highestToken": stale.Mark})
			return
		case err != nil:
			problem(w, http.StatusServiceUnavailable, "UNAVAILABLE", "the ledger's database failed", nil)
			return
		}
		var id int64
		if err := tx.QueryRow(ctx, insertEntry, r.PathValue("account"), req.AmountMinor, claims.Token, claims.Subject).Scan(&id); err != nil {
			problem(w, http.StatusServiceUnavailable, "UNAVAILABLE", "the ledger's database failed", nil)
			return
		}
		if err := tx.Commit(ctx); err != nil {
			problem(w, http.StatusServiceUnavailable, "UNAVAILABLE", "the ledger's database failed", nil)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{"entryId": id, "token": claims.Token})
	})
}

// problem answers an RFC 9457 problem, as lock.dev's services do.
func problem(w http.ResponseWriter, status int, code, detail string, members map[string]any) {
	body := map[string]any{"type": "about:blank", "title": http.StatusText(status), "status": status, "detail": detail, "code": code}
	for k, v := range members {
		body[k] = v
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// startLedger migrates the ledger's database and serves the ledger on a free
// port of 127.0.0.1 — mutual TLS with the ledger's SVID, or plaintext under
// -unsafe-no-auth — until close.
func startLedger(ctx context.Context, c config, ids identities) (*ledgerServer, error) {
	keys, _, err := fence.ReadKeySet(c.keysFile)
	if err != nil {
		return nil, fmt.Errorf("-keys %s", err)
	}
	v, err := fence.NewVerifier(keys, 0)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, c.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("-db: %w", err)
	}
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, ddl := range migration {
		if _, err := pool.Exec(mctx, ddl); err != nil {
			pool.Close()
			return nil, fmt.Errorf("migrate the ledger: %w", err)
		}
	}
	var opts []fence.Option
	if ids.ledgerServer == nil {
		opts = append(opts, fence.WithoutMutualTLS())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		pool.Close()
		return nil, err
	}
	logger := slog.New(slog.DiscardHandler)
	srv := &http.Server{Handler: newLedger(pool, v, opts, logger), TLSConfig: ids.ledgerServer, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	scheme := "http"
	go func() {
		defer close(done)
		if ids.ledgerServer != nil {
			_ = srv.ServeTLS(ln, "", "")
		} else {
			_ = srv.Serve(ln)
		}
	}()
	if ids.ledgerServer != nil {
		scheme = "https"
	}
	return &ledgerServer{url: scheme + "://" + ln.Addr().String(), close: func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
		pool.Close()
	}}, nil
}
