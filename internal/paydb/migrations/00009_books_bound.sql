-- +goose Up
-- The books bind every move (docs/contracts/books.md).
--
-- A submission the books do not hold as presented is recorded, already resolved,
-- as UNBOOKED: never forwardable, so rail_submission_attempt_uidx (whose
-- predicate names the forwardable outcomes) is unchanged. 00001 declared the
-- outcome CHECK inline, so PostgreSQL named it rail_submission_outcome_check. One
-- statement: the table is never without an outcome CHECK; older replicas write
-- only the outcomes they know, all still allowed.
ALTER TABLE rail_submission
    DROP CONSTRAINT rail_submission_outcome_check,
    ADD CONSTRAINT rail_submission_outcome_check
        CHECK (outcome IN ('FENCED','DUPLICATE','ACKED','REJECTED','TIMEOUT','UNSENT','UNBOOKED'));

-- The beneficiary is part of what the rail was presented. Lines copied before
-- this column existed have none (NULL, and a settle does not compare it); every
-- line copied from now on must carry it: the CHECK is NOT VALID, so PostgreSQL
-- enforces it on new and updated rows and never checks the old ones.
ALTER TABLE rail_statement_line ADD COLUMN beneficiary text NULL;
ALTER TABLE rail_statement_line
    ADD CONSTRAINT rail_statement_line_beneficiary_present CHECK (beneficiary IS NOT NULL) NOT VALID;

-- BENEFICIARY_MISMATCH: a line whose beneficiary is not its payout's (its
-- account, amount and currency equal); ATTEMPT_MISMATCH: a payout whose own
-- holder presented it with fields the books refused, left CLAIMED for a person.
ALTER TABLE reconciliation_exception
    DROP CONSTRAINT reconciliation_exception_kind_check,
    ADD CONSTRAINT reconciliation_exception_kind_check CHECK (kind IN (
        'PRESENTED_TWICE', 'AMOUNT_MISMATCH', 'UNKNOWN_REFERENCE',
        'LINE_CONTRADICTS_PAYOUT', 'PAID_WITHOUT_LINE', 'UNSTORABLE_LINE',
        'BENEFICIARY_MISMATCH', 'ATTEMPT_MISMATCH'));

-- The payout's history: one row per move payment-resource makes (creation,
-- claim, post, settle), written in the transaction that makes it, never updated
-- or deleted. It is the claim history "only the books move money" is checked
-- against: a rail_submission row the gate admitted must match a claim recorded
-- here with its token and owner. actor is the caller's verified workload
-- identity, NULL while the caller is not identified.
CREATE TABLE payout_history (
    history_id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payout_id      text        NOT NULL REFERENCES payout,
    status         text        NOT NULL
        CHECK (status IN ('PENDING','CLAIMED','PAID','DECLINED','AMBIGUOUS','NOT_PRESENTED')),
    fence_token    bigint      NOT NULL,   -- the payout's fence_token after the move
    owner_id       text        NULL,       -- X-Owner-Id of a claim or post; NULL for creation and settle
    actor          text        NULL,
    rail_reference text        NULL,
    decline_reason text        NULL,
    recorded_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX payout_history_payout_idx ON payout_history (payout_id, history_id);

-- +goose Down
-- Fails while an UNBOOKED row, a line with a beneficiary compared away, or a
-- BENEFICIARY_MISMATCH/ATTEMPT_MISMATCH exception exists: going down would lose it.
DROP TABLE payout_history;
ALTER TABLE reconciliation_exception
    DROP CONSTRAINT reconciliation_exception_kind_check,
    ADD CONSTRAINT reconciliation_exception_kind_check CHECK (kind IN (
        'PRESENTED_TWICE', 'AMOUNT_MISMATCH', 'UNKNOWN_REFERENCE',
        'LINE_CONTRADICTS_PAYOUT', 'PAID_WITHOUT_LINE', 'UNSTORABLE_LINE'));
ALTER TABLE rail_statement_line DROP CONSTRAINT rail_statement_line_beneficiary_present;
ALTER TABLE rail_statement_line DROP COLUMN beneficiary;
ALTER TABLE rail_submission
    DROP CONSTRAINT rail_submission_outcome_check,
    ADD CONSTRAINT rail_submission_outcome_check
        CHECK (outcome IN ('FENCED','DUPLICATE','ACKED','REJECTED','TIMEOUT','UNSENT'));
