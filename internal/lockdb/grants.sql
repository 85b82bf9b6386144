-- lockdb's privileges for lock-server's runtime login (docs/contracts/database.md,
-- least privilege). Not a migration: lock-server's `migrate` applies it after the
-- migrations, each run, for the login LOCKDB_ROLE_LOCK_SERVER names, written
-- {{role}}. Before it, migrate revokes everything the login holds in the schema
-- and grants USAGE on the schema and SELECT on goose_lockdb_version, so a
-- privilege taken out of this file is taken from the login on the next run.
-- lock_grant is the grants' history: appended and its expiry and release
-- recorded, never deleted.

-- role: LOCKDB_ROLE_LOCK_SERVER
-- lock-server (internal/lockserver/store.go): the lease upsert, renew and
-- release, the history.
GRANT SELECT, INSERT, UPDATE ON lock_lease TO {{role}};
-- the history: a grant's row is written once, then only its expiry (renew) and
-- release recorded; who was granted what is never rewritten.
GRANT SELECT, INSERT ON lock_grant TO {{role}};
GRANT UPDATE (expires_at, released_at) ON lock_grant TO {{role}};
