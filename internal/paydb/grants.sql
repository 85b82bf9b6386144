-- paydb's privileges per runtime login (docs/contracts/database.md, least
-- privilege). Not a migration: every paydb service's `migrate` applies it after
-- the migrations, each run, for the logins its PAYDB_ROLE_* settings name.
--
-- Before these statements migrate revokes everything each named login holds in
-- the schema (tables, sequences, functions) and grants it USAGE on the schema
-- and SELECT on goose_paydb_version (the services check the schema's version at
-- start): so a privilege taken out of this file is taken from the login on the
-- next run. The statements before the first "-- role:" line run once; each
-- "-- role: SETTING" section runs for the login that setting names, written
-- {{role}} (in a DO block: current_setting('lockdev.grant_role')). No login
-- gets DELETE or TRUNCATE: rail_submission, ledger_entry, payout_history,
-- rail_statement_line and reconciliation_decision are audit tables, and no
-- service removes a row of any other. Identity columns draw their values without a grant on their sequences
-- (rail-proxy's group admission draws its own). The functions are SECURITY
-- INVOKER: the caller's grants on the tables they touch are what they may do.

-- rail-proxy's admission functions, whatever their versions and signatures:
-- nobody else's (a new function is PUBLIC's until this runs).
DO $$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.proname LIKE 'rail\_admit\_group%' AND p.pronamespace = current_schema()::regnamespace LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $$;

-- role: PAYDB_ROLE_RAIL_PROXY
-- rail-proxy (internal/railproxy/store.go, groupstore.go): the high-water
-- upsert, the intent and its resolution, the books check's read of the payout.
GRANT SELECT, INSERT, UPDATE ON rail_high_water TO {{role}};
-- an attempt is written once and only its resolution filled in later: what was
-- presented, by whom, is never rewritten.
GRANT SELECT, INSERT ON rail_submission TO {{role}};
GRANT UPDATE (outcome, rail_reference, decline_reason, resolved_at) ON rail_submission TO {{role}};
GRANT SELECT ON payout TO {{role}};
-- the group admission draws the attempts' ids itself, in arrival order, and
-- inserts them OVERRIDING SYSTEM VALUE: nextval needs USAGE on the sequence.
GRANT USAGE ON SEQUENCE rail_submission_submission_id_seq TO {{role}};
DO $$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.proname LIKE 'rail\_admit\_group%' AND p.pronamespace = current_schema()::regnamespace LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, current_setting('lockdev.grant_role'));
    END LOOP;
END $$;

-- role: PAYDB_ROLE_PAYMENT
-- payment-resource (internal/payment/store.go): the payouts, their history and
-- ledger (appended, never rewritten), the settlements it records; the settle's
-- evidence is read from rail-proxy's attempts and the reconciler's tables.
GRANT SELECT, INSERT, UPDATE ON payout TO {{role}};
GRANT SELECT, INSERT ON ledger_entry, payout_history, payout_settlement TO {{role}};
GRANT SELECT ON rail_submission, rail_statement_line, reconciler_cursor, reconciliation_exception TO {{role}};
-- a NOT_PRESENTED settle's window is judged against the payout's account's
-- coverage (statements from files) as well as the cursor's read_at.
GRANT SELECT ON statement_coverage TO {{role}};

-- role: PAYDB_ROLE_RECONCILER
-- the reconciler (internal/reconcile/store.go): the statement's copy (appended),
-- its exceptions, its cursor, the statement files it imported (appended) and
-- each account's coverage; it reads the payouts and rail-proxy's attempts.
GRANT SELECT, INSERT ON rail_statement_line, reconciliation_exception, statement_file TO {{role}};
GRANT SELECT, INSERT, UPDATE ON reconciler_cursor, statement_coverage TO {{role}};
GRANT SELECT ON payout, rail_submission TO {{role}};

-- role: PAYDB_ROLE_OPERATOR
-- the operators' login, for `reconciler exceptions` (internal/reconcile/decisionstore.go):
-- it reads an exception and its context — the payout, its history and
-- settlement, its attempts, the statement lines and files — and records a
-- decision beside it. It inserts the decision's own four columns only:
-- decided_login and decided_at keep their defaults (the login, paydb's clock),
-- and no decision is ever updated or removed. It moves no payout and writes no
-- exception, statement line or cursor.
GRANT SELECT ON reconciliation_exception, reconciliation_decision, payout, payout_history, payout_settlement,
    rail_statement_line, rail_submission, statement_file TO {{role}};
GRANT INSERT (exception_id, decision, decided_by, note) ON reconciliation_decision TO {{role}};
