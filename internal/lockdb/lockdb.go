// Package lockdb embeds lock-server's migration tree: lock_lease and lock_grant
// (docs/contracts/database.md).
package lockdb

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

// Tree returns lockdb's migration tree, versioned in goose_lockdb_version.
func Tree() dbconn.Tree {
	tree := dbconn.EmbeddedTree(files, "goose_lockdb_version", 0x6c6f636b, "lockdb")
	tree.Grants = grants
	return tree
}
