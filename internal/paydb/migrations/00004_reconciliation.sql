-- +goose Up
-- Statement reconciliation (docs/contracts/reconciliation.md): the reconciler's durable copy of the
-- rail's statement, the exceptions it found, and its cursor; payment-resource's
-- record of each settle; and the payout status NOT_PRESENTED.

CREATE TABLE rail_statement_line (      -- the durable copy; a line is imported once
    seq            bigint      PRIMARY KEY,
    received_at    timestamptz NOT NULL,
    reference      text        NOT NULL,    -- = payout_id when the rail was called by us
    account_id     text        NOT NULL,
    amount_minor   bigint      NOT NULL,
    currency       text        NOT NULL,
    result         text        NOT NULL CHECK (result IN ('ACCEPTED','DECLINED')),
    rail_reference text        NULL,
    decline_reason text        NULL,
    imported_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rail_statement_line_reference_idx ON rail_statement_line (reference);

CREATE TABLE reconciliation_exception (
    exception_id bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind         text        NOT NULL CHECK (kind IN (
                     'PRESENTED_TWICE',          -- two or more ACCEPTED lines for one reference: a double payment
                     'AMOUNT_MISMATCH',          -- a line's account/amount/currency differs from its payout
                     'UNKNOWN_REFERENCE',        -- a line whose reference is no payout
                     'LINE_CONTRADICTS_PAYOUT',  -- e.g. ACCEPTED line for a DECLINED or NOT_PRESENTED payout
                     'PAID_WITHOUT_LINE')),      -- PAID payout, settle window passed, no ACCEPTED line
    payout_id    text        NULL,
    seq          bigint      NULL,
    detail       text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX reconciliation_exception_once_idx
    ON reconciliation_exception (kind, coalesce(payout_id, ''), coalesce(seq, 0));

CREATE TABLE reconciler_cursor (        -- one row: the last statement seq imported
    id       boolean     PRIMARY KEY DEFAULT true CHECK (id),
    last_seq bigint      NOT NULL DEFAULT 0,
    read_at  timestamptz NULL           -- paydb clock at the start of the last complete read
);

-- payment-resource's own record of how a settle moved an AMBIGUOUS payout: what a
-- repeated settle is compared with (identical repeat 200, anything else 409),
-- and the audit of which statement line closed the payout. One row per payout at
-- most; written in the settle's transaction, never changed.
CREATE TABLE payout_settlement (
    payout_id      text        PRIMARY KEY REFERENCES payout,
    outcome        text        NOT NULL CHECK (outcome IN ('PAID','DECLINED','NOT_PRESENTED')),
    rail_reference text        NULL,
    decline_reason text        NULL,
    statement_seq  bigint      NULL,
    settled_at     timestamptz NOT NULL DEFAULT now(),
    CHECK ((outcome = 'NOT_PRESENTED') = (statement_seq IS NULL)),
    CHECK (outcome <> 'PAID' OR rail_reference IS NOT NULL)
);

-- NOT_PRESENTED: the statement proves the rail never received the payout; final.
-- 00002 declared the CHECK inline, so PostgreSQL named it payout_status_check. One
-- statement: the table is never without a status CHECK, and the new one (wider than
-- the old) is validated by one scan of payout under the migration's lock.
ALTER TABLE payout
    DROP CONSTRAINT payout_status_check,
    ADD CONSTRAINT payout_status_check
        CHECK (status IN ('PENDING','CLAIMED','PAID','DECLINED','AMBIGUOUS','NOT_PRESENTED'));

-- +goose Down
-- Fails while a payout is NOT_PRESENTED: going down would lose what the statement proved.
ALTER TABLE payout
    DROP CONSTRAINT payout_status_check,
    ADD CONSTRAINT payout_status_check
        CHECK (status IN ('PENDING','CLAIMED','PAID','DECLINED','AMBIGUOUS'));
DROP TABLE payout_settlement;
DROP TABLE reconciler_cursor;
DROP TABLE reconciliation_exception;
DROP TABLE rail_statement_line;
