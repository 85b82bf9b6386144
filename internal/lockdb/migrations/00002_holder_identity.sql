-- +goose Up
-- The workload that acquired a lease (docs/contracts/workload-identity.md): the
-- verified SPIFFE ID of its TLS peer. Only that workload renews or releases the
-- lease; the grants history names it beside the self-asserted owner id. NULL on
-- leases and grants made without identities (UNSAFE_NO_AUTH) and before this
-- column existed.
ALTER TABLE lock_lease ADD COLUMN holder_identity text NULL;
ALTER TABLE lock_grant ADD COLUMN holder_identity text NULL;

-- +goose Down
ALTER TABLE lock_grant DROP COLUMN holder_identity;
ALTER TABLE lock_lease DROP COLUMN holder_identity;
