-- +goose Up
-- A person's decision on a reconciliation exception (docs/contracts/reconciliation.md,
-- "Deciding an exception"; docs/operations/reconciliation-exceptions.md): who
-- decided, what, why and when, recorded beside the exception by
-- `reconciler exceptions resolve`. An exception is decided once: the primary key
-- is the once-constraint, and a second decision is refused, never an overwrite.
-- Like the exception itself, a decision settles or unsettles nothing: it is the
-- record that a person looked and what they concluded.
--
-- decided_login and decided_at are paydb's own (the login the decision was
-- written with, and paydb's clock): the operators' login may insert only the
-- other four columns (internal/paydb/grants.sql), so neither can be written by
-- hand. No login may UPDATE or DELETE a row: the table is an audit table.
CREATE TABLE reconciliation_decision (
    exception_id  bigint      PRIMARY KEY REFERENCES reconciliation_exception,
    decision      text        NOT NULL CHECK (decision IN (
                      'accepted-as-is',       -- the books and the rail stand as they are; nothing to correct
                      'corrected-in-ledger',  -- the books were corrected by a ledger posting outside lock.dev
                      'refunded',             -- the money paid in error came back (recalled by the rail, returned by the payee)
                      'written-off')),        -- the money paid in error will not come back; the loss is booked
    decided_by    text        NOT NULL CHECK (decided_by ~ '[^[:space:]]' AND char_length(decided_by) <= 200),
    note          text        NOT NULL CHECK (note ~ '[^[:space:]]' AND char_length(note) <= 4000),
    decided_login text        NOT NULL DEFAULT CAST(session_user AS text),
    decided_at    timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
-- Fails while a decision exists: going down would lose who decided what.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM reconciliation_decision) THEN
        RAISE EXCEPTION 'reconciliation_decision holds decisions: going down would lose them';
    END IF;
END $$;
-- +goose StatementEnd
DROP TABLE reconciliation_decision;
