package fencepg_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/fence"
	"lock.dev/fence/fencepg"
)

// A ledger's write handler behind fence.Middleware: the grant is verified,
// then the token is compared with the account's mark in the transaction that
// writes. Schema runs once, in the ledger's migration.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://ledger@db.internal/ledger")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, fencepg.Schema); err != nil {
		fmt.Println(err)
		return
	}

	write := func(w http.ResponseWriter, r *http.Request) {
		claims, _ := fence.FromContext(r.Context()) // set by fence.Middleware
		tx, err := pool.Begin(r.Context())
		if err != nil {
			http.Error(w, "database unavailable", http.StatusServiceUnavailable)
			return
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(r.Context())) }()
		err = fencepg.Advance(r.Context(), tx, claims.Lock, claims.Token)
		var stale *fencepg.StaleError
		switch {
		case errors.As(err, &stale):
			http.Error(w, fmt.Sprintf("fenced out: token %d, mark %d", stale.Presented, stale.Mark), http.StatusConflict)
			return
		case err != nil:
			http.Error(w, "database unavailable", http.StatusServiceUnavailable)
			return
		}
		if _, err := tx.Exec(r.Context(), `INSERT INTO ledger_entry (account, amount_minor) VALUES ($1, $2)`,
			r.PathValue("account"), 125000); err != nil {
			http.Error(w, "database unavailable", http.StatusServiceUnavailable)
			return
		}
		if err := tx.Commit(r.Context()); err != nil {
			http.Error(w, "database unavailable", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
	_ = write
}
