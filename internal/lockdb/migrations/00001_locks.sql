-- +goose Up
-- lock-server's tables (docs/contracts/database.md). A lock_lease row is never deleted: its
-- token is the lock's memory.
CREATE TABLE lock_lease (
    lock_name   text        PRIMARY KEY,
    owner_id    text        NULL,          -- NULL while free
    token       bigint      NOT NULL,      -- the last token issued for this lock
    acquired_at timestamptz NULL,
    expires_at  timestamptz NULL
);

CREATE TABLE lock_grant (                  -- history, one row per grant
    lock_name   text        NOT NULL,
    token       bigint      NOT NULL,
    owner_id    text        NOT NULL,
    acquired_at timestamptz NOT NULL,
    ttl_ms      integer     NOT NULL,
    expires_at  timestamptz NOT NULL,      -- moved forward by each renewal
    released_at timestamptz NULL,          -- set by a release; NULL when it simply expired
    PRIMARY KEY (lock_name, token)
);

-- +goose Down
DROP TABLE lock_grant;
DROP TABLE lock_lease;
