-- +goose Up
-- Statements from files (docs/contracts/reconciliation.md, "Statements from
-- files"): the reconciler in dir mode imports each camt.053 file of a directory
-- once, keeps per account how far the imported statements cover the rail's
-- books, and records a file whose bytes changed after its import.

-- Every file imported, once per name (result 'imported', with the number of
-- statement lines it added), and every other version of an imported name, once
-- per (name, sha256) (result 'changed': nothing of it imported). A file skipped as
-- invalid has no row: it is imported when it is replaced by a valid one.
CREATE TABLE statement_file (
    file_id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text        NOT NULL,
    sha256      text        NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    result      text        NOT NULL CHECK (result IN ('imported','changed')),
    entries     integer     NULL,
    imported_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((result = 'imported') = (entries IS NOT NULL AND entries >= 0))
);
CREATE UNIQUE INDEX statement_file_imported_uidx ON statement_file (name) WHERE result = 'imported';
CREATE UNIQUE INDEX statement_file_version_uidx ON statement_file (name, sha256);

-- Per account, the moment up to which the imported statements cover the rail's
-- books: the latest statement period end (Stmt/FrToDt/ToDtTm) imported for it,
-- never later than paydb's clock at its import; it only moves forward. The
-- settle window of an account's payouts is judged against it in dir mode.
CREATE TABLE statement_coverage (
    account_id text        PRIMARY KEY,
    covered_to timestamptz NOT NULL
);

-- STATEMENT_FILE_CHANGED: a file whose name was imported came back with other
-- bytes; it names that version's statement_file row. The kind CHECK was last set
-- by 00009 under the name PostgreSQL gave 00004's inline CHECK; one statement, so
-- the table is never without one. The once-index gains the file, so each
-- changed version is recorded once.
ALTER TABLE reconciliation_exception ADD COLUMN file_id bigint NULL REFERENCES statement_file;
ALTER TABLE reconciliation_exception
    DROP CONSTRAINT reconciliation_exception_kind_check,
    ADD CONSTRAINT reconciliation_exception_kind_check CHECK (kind IN (
        'PRESENTED_TWICE', 'AMOUNT_MISMATCH', 'UNKNOWN_REFERENCE',
        'LINE_CONTRADICTS_PAYOUT', 'PAID_WITHOUT_LINE', 'UNSTORABLE_LINE',
        'BENEFICIARY_MISMATCH', 'ATTEMPT_MISMATCH', 'STATEMENT_FILE_CHANGED'));
DROP INDEX reconciliation_exception_once_idx;
CREATE UNIQUE INDEX reconciliation_exception_once_idx
    ON reconciliation_exception (kind, coalesce(payout_id, ''), coalesce(seq, 0), coalesce(file_id, 0));

-- An ACCEPTED line whose account and rail reference are already in the copy is
-- not imported again (overlapping statements): the import looks them up here.
CREATE INDEX rail_statement_line_rail_reference_idx ON rail_statement_line (account_id, rail_reference);

-- +goose Down
-- Fails while a STATEMENT_FILE_CHANGED exception exists: going down would lose it.
DROP INDEX rail_statement_line_rail_reference_idx;
ALTER TABLE reconciliation_exception
    DROP CONSTRAINT reconciliation_exception_kind_check,
    ADD CONSTRAINT reconciliation_exception_kind_check CHECK (kind IN (
        'PRESENTED_TWICE', 'AMOUNT_MISMATCH', 'UNKNOWN_REFERENCE',
        'LINE_CONTRADICTS_PAYOUT', 'PAID_WITHOUT_LINE', 'UNSTORABLE_LINE',
        'BENEFICIARY_MISMATCH', 'ATTEMPT_MISMATCH'));
DROP INDEX reconciliation_exception_once_idx;
CREATE UNIQUE INDEX reconciliation_exception_once_idx
    ON reconciliation_exception (kind, coalesce(payout_id, ''), coalesce(seq, 0));
ALTER TABLE reconciliation_exception DROP COLUMN file_id;
DROP TABLE statement_coverage;
DROP TABLE statement_file;
