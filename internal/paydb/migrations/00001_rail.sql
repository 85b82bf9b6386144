-- +goose Up
-- rail-proxy's tables (docs/contracts/database.md): the per-account high-water mark and the
-- audit trail of every admission attempt.
CREATE TABLE rail_high_water (
    account_id     text        PRIMARY KEY,
    highest_token  bigint      NOT NULL CHECK (highest_token > 0),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE rail_submission (
    submission_id   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payout_id       text        NOT NULL,
    account_id      text        NOT NULL,
    presented_token bigint      NOT NULL,
    owner_id        text        NOT NULL,
    idempotency_key text        NOT NULL,
    amount_minor    bigint      NOT NULL,
    currency        text        NOT NULL,
    beneficiary     text        NOT NULL,
    outcome         text        NULL
        CHECK (outcome IN ('FENCED','DUPLICATE','ACKED','REJECTED','TIMEOUT','UNSENT')),
    rail_reference  text        NULL,
    decline_reason  text        NULL,
    submitted_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    resolved_at     timestamptz NULL,
    CHECK ((outcome IS NULL) = (resolved_at IS NULL))
);

-- The authority on "one forwardable attempt per payout": the index, not a prior SELECT.
CREATE UNIQUE INDEX rail_submission_attempt_uidx ON rail_submission (payout_id)
    WHERE outcome IS NULL OR outcome IN ('ACKED','REJECTED','TIMEOUT');

CREATE INDEX rail_submission_account_idx ON rail_submission (account_id, submitted_at);
CREATE INDEX rail_submission_unresolved_idx ON rail_submission (submitted_at) WHERE outcome IS NULL;

-- +goose Down
DROP TABLE rail_submission;
DROP TABLE rail_high_water;
