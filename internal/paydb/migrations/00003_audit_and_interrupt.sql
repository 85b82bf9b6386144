-- +goose Up
-- The later migration of rail-proxy's tables (docs/contracts/database.md).
-- The audit-trail read (GET /v1/rail/submissions?payoutId=) by index, not by a scan.
CREATE INDEX rail_submission_payout_idx ON rail_submission (payout_id, submission_id);
-- When the janitor may take this intent for a dead proxy's: set at admission from the
-- admitting replica's own RAIL_PROXY_INTERRUPTED_AFTER (submitted_at + that bound), so
-- replicas with different timeouts never resolve each other's calls in flight. NULL on
-- rows admitted before this column existed (the janitor then uses its own bound), and
-- on rows that are not intents.
ALTER TABLE rail_submission ADD COLUMN interrupt_at timestamptz NULL;

-- +goose Down
ALTER TABLE rail_submission DROP COLUMN interrupt_at;
DROP INDEX rail_submission_payout_idx;
