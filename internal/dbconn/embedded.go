package dbconn

import (
	"embed"
	"io/fs"
)

// EmbeddedTree is the tree of the .sql files under migrations/ in files (a
// database package's //go:embed migrations/*.sql), versioned in table and
// serialised by the advisory lock lockID; database names it in messages.
func EmbeddedTree(files embed.FS, table string, lockID int64, database string) Tree {
	sub, err := fs.Sub(files, "migrations")
	if err != nil { // the embed pattern guarantees the directory
		panic(err)
	}
	return Tree{FS: sub, Table: table, LockID: lockID, Database: database}
}
