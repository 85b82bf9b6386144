// Package lockdb embeds lock-server's migration tree: lock_lease and lock_grant
// (docs/contracts/database.md).
package lockdb

import (
	"embed"
	"io/fs"

	"lock.dev/internal/dbconn"
)

//go:embed migrations/*.sql
var files embed.FS

// Tree returns lockdb's migration tree, versioned in goose_lockdb_version.
func Tree() dbconn.Tree {
	sub, err := fs.Sub(files, "migrations")
	if err != nil { // the embed pattern guarantees the directory
		panic(err)
	}
	return dbconn.Tree{FS: sub, Table: "goose_lockdb_version", LockID: 0x6c6f636b, Database: "lockdb"}
}
