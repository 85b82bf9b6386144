// Package lockdb embeds lock-server's migration tree: lock_lease and lock_grant
// (docs/contracts/database.md).
package lockdb

import (
	"embed"

	"lock.dev/internal/dbconn"
)

//go:embed migrations/*.sql
var files embed.FS

// Tree returns lockdb's migration tree, versioned in goose_lockdb_version.
func Tree() dbconn.Tree {
	return dbconn.EmbeddedTree(files, "goose_lockdb_version", 0x6c6f636b, "lockdb")
}
