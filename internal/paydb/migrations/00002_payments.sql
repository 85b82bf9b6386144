-- +goose Up
-- payment-resource's tables (docs/contracts/database.md).
CREATE TABLE payout (
    payout_id      text        PRIMARY KEY,
    account_id     text        NOT NULL,
    amount_minor   bigint      NOT NULL CHECK (amount_minor > 0),
    currency       text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    beneficiary    text        NOT NULL,
    status         text        NOT NULL DEFAULT 'PENDING'
        CHECK (status IN ('PENDING','CLAIMED','PAID','DECLINED','AMBIGUOUS')),
    fence_token    bigint      NOT NULL DEFAULT 0,
    claimed_by     text        NULL,
    rail_reference text        NULL,
    decline_reason text        NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payout_status_idx ON payout (status, updated_at);

CREATE TABLE ledger_entry (
    entry_id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payout_id    text        NOT NULL UNIQUE REFERENCES payout,
    account_id   text        NOT NULL,
    amount_minor bigint      NOT NULL CHECK (amount_minor < 0),   -- a debit of the account
    currency     text        NOT NULL,
    posted_token bigint      NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE ledger_entry;
DROP TABLE payout;
