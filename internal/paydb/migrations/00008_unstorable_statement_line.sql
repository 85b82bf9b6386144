-- +goose Up
-- A statement line whose text paydb cannot store and show as it is (NUL, other
-- control characters, U+FFFD, over its length bound; docs/contracts/reconciliation.md)
-- is not copied: the reconciler records it as an UNSTORABLE_LINE exception, and a
-- payout it names stays AMBIGUOUS until a person decides. 00004 declared the kind
-- CHECK inline, so PostgreSQL named it reconciliation_exception_kind_check. One
-- statement: the table is never without a kind CHECK; older reconcilers write
-- only the kinds they know, all still allowed.
ALTER TABLE reconciliation_exception
    DROP CONSTRAINT reconciliation_exception_kind_check,
    ADD CONSTRAINT reconciliation_exception_kind_check CHECK (kind IN (
        'PRESENTED_TWICE', 'AMOUNT_MISMATCH', 'UNKNOWN_REFERENCE',
        'LINE_CONTRADICTS_PAYOUT', 'PAID_WITHOUT_LINE', 'UNSTORABLE_LINE'));

-- +goose Down
-- Fails while an UNSTORABLE_LINE exception exists: going down would lose it.
ALTER TABLE reconciliation_exception
    DROP CONSTRAINT reconciliation_exception_kind_check,
    ADD CONSTRAINT reconciliation_exception_kind_check CHECK (kind IN (
        'PRESENTED_TWICE', 'AMOUNT_MISMATCH', 'UNKNOWN_REFERENCE',
        'LINE_CONTRADICTS_PAYOUT', 'PAID_WITHOUT_LINE'));
