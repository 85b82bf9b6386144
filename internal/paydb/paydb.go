// Package paydb embeds paydb's one migration tree: rail-proxy's rail_high_water and
// rail_submission, payment-resource's payout and ledger_entry
// (docs/contracts/database.md), the reconciler's statement copy, exceptions and
// cursor (docs/contracts/reconciliation.md). Each of the three services' `migrate`
// applies the whole tree.
package paydb

import (
	"embed"

	"lock.dev/internal/dbconn"
)

//go:embed migrations/*.sql
var files embed.FS

// grants is what each runtime login may do, applied by migrate after the
// migrations (docs/contracts/database.md, least privilege).
//
//go:embed grants.sql
var grants string

// Tree returns paydb's migration tree, versioned in goose_paydb_version.
func Tree() dbconn.Tree {
	tree := dbconn.EmbeddedTree(files, "goose_paydb_version", 0x70617964, "paydb")
	tree.Grants = grants
	return tree
}
