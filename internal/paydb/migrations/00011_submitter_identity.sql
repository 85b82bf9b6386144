-- +goose Up
-- The workload that presented a submission (docs/contracts/workload-identity.md):
-- the verified SPIFFE ID of rail-proxy's TLS peer, so the audit trail names a
-- workload, not only the self-asserted X-Owner-Id. NULL on rows written without
-- identities (UNSAFE_NO_AUTH) and before this column existed.
ALTER TABLE rail_submission ADD COLUMN submitter_identity text NULL;

-- +goose Down
ALTER TABLE rail_submission DROP COLUMN submitter_identity;
