// Package paydb embeds paydb's one migration tree: rail-proxy's rail_high_water and
// rail_submission, payment-resource's payout and ledger_entry
// (docs/contracts/database.md), the reconciler's statement copy, exceptions and
// cursor (docs/contracts/reconciliation.md). Each of the three services' `migrate`
// applies the whole tree.
package paydb

import (
	"embed"
	"io/fs"

	"lock.dev/internal/dbconn"
)

//go:embed migrations/*.sql
var files embed.FS

// Tree returns paydb's migration tree, versioned in goose_paydb_version.
func Tree() dbconn.Tree {
	sub, err := fs.Sub(files, "migrations")
	if err != nil { // the embed pattern guarantees the directory
		panic(err)
	}
	return dbconn.Tree{FS: sub, Table: "goose_paydb_version", LockID: 0x70617964, Database: "paydb"}
}
