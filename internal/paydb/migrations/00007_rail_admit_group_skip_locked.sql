-- +goose Up
-- rail_admit_group_skip_locked: group admission that never waits for a mark row
-- another transaction holds (docs/contracts/rail-proxy.md#group-admission-rail_proxy_max_group).
--
-- rail_admit_group (00005, 00006) locks every member's mark row with FOR UPDATE
-- and creates the missing ones with ON CONFLICT DO NOTHING; both wait for a row
-- another transaction holds (a replica paused between its statement and its
-- COMMIT), so one held account made the whole group, and every submission queued
-- behind it, wait as long as that transaction lived. Here a member whose account's
-- mark row another transaction holds is not decided: it comes back with
-- o_deferred, nothing written for it and its mark untouched, to be admitted on its
-- own (the pinned one-by-one statements, which wait for its own row only, within its own
-- bound). Every other member is decided exactly as rail_admit_group decides it.
-- Its rows have one column more, so it is a function of its own: replicas running
-- the previous release keep calling rail_admit_group, which stays.
--
--   * step 1 locks the rows that exist with FOR UPDATE SKIP LOCKED, in account
--     order: a row another transaction holds (locked, or updated and not yet
--     committed) is skipped, never waited for. Only when some account was not
--     locked does it look further: an account whose row is visible but was not
--     locked is held by another transaction (deferred); the remaining ones have
--     no committed row and are created, in account order, with the mark they end
--     the group at, in a subtransaction; a row another transaction is creating
--     makes that INSERT wait at most lock_timeout (1 ms, set on the function),
--     and then they are created one at a time, each in a subtransaction, so that
--     only the accounts another transaction is creating are deferred; an account
--     created and committed by another transaction meanwhile (DO NOTHING) is
--     deferred too.
--     The group never waits for a row lock, so it can take part in no deadlock;
--   * steps 2 and 3 are rail_admit_group's (00006), over the members not
--     deferred: the mark each meets is its account's as the group's earlier
--     members left it; a payout with a forwardable attempt (committed, or an
--     earlier member of the group) is DUPLICATE; ids drawn in arrival order;
--     one INSERT in payout order. A forwardable attempt of the same payout that
--     another transaction inserted and has not committed makes that INSERT wait
--     at most lock_timeout: the statement then fails with lock_not_available,
--     nothing is written, and the caller admits the members one by one.
-- +goose StatementBegin
CREATE FUNCTION rail_admit_group_skip_locked(
    p_account     text[],
    p_token       bigint[],
    p_payout      text[],
    p_owner       text[],
    p_idem        text[],
    p_amount      bigint[],
    p_currency    text[],
    p_beneficiary text[],
    p_fencing     boolean,
    p_interrupt_ms bigint)
RETURNS TABLE (o_ord integer, o_deferred boolean, o_submission_id bigint, o_submitted_at timestamptz,
               o_outcome text, o_passed_fence boolean, o_mark bigint)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET lock_timeout = '1ms'
AS $fn$
DECLARE
    n         integer := cardinality(p_account);
    v_accts   text[];            -- the accounts decided here: those locked, in account order, then the created ones
    v_marks   bigint[];          -- their marks as the group's decided members so far have left them
    v_m0      bigint[];          -- the marks of the locked accounts, as locked
    v_nexist  integer;
    v_missing text[];            -- the group's accounts whose row step 1 did not lock
    v_held    text[] := '{}';    -- accounts whose mark row another transaction holds: their members are deferred
    v_new     text[] := '{}';    -- accounts with no committed mark row
    v_created text[] := '{}';    -- accounts whose mark row this group created
    v_taken   text[];            -- payouts that have a forwardable attempt
    v_ord     integer[] := '{}'; -- the decided members' ordinals, in arrival order
    v_ids     bigint[];
    v_met     bigint[] := '{}';
    v_passed  boolean[] := '{}';
    v_outcome text[] := '{}';
    v_ret_id  bigint[];
    v_ret_at  timestamptz[];
    v_a       text;
    v_one     text;
    j         integer := 0;
    k         integer;
BEGIN
    SELECT coalesce(array_agg(l.account_id ORDER BY l.account_id), '{}'),
           coalesce(array_agg(l.highest_token ORDER BY l.account_id), '{}')
      INTO v_accts, v_marks
      FROM (SELECT h.account_id, h.highest_token
              FROM rail_high_water h
             WHERE h.account_id = ANY (p_account)
             ORDER BY h.account_id
               FOR UPDATE SKIP LOCKED) l;
    v_m0 := v_marks;
    v_nexist := cardinality(v_accts);

    SELECT coalesce(array_agg(DISTINCT u.a), '{}') INTO v_missing
      FROM unnest(p_account) AS u(a)
     WHERE NOT u.a = ANY (v_accts);
    IF cardinality(v_missing) > 0 THEN
        SELECT coalesce(array_agg(h.account_id), '{}') INTO v_held
          FROM rail_high_water h
         WHERE h.account_id = ANY (v_missing);
        SELECT coalesce(array_agg(m.a ORDER BY m.a), '{}') INTO v_new
          FROM unnest(v_missing) AS m(a)
         WHERE NOT m.a = ANY (v_held);
        IF cardinality(v_new) > 0 THEN
            BEGIN
                WITH created AS (
                    INSERT INTO rail_high_water (account_id, highest_token, updated_at)
                    SELECT u.a, max(u.t), now()
                      FROM unnest(p_account, p_token) AS u(a, t)
                     WHERE u.a = ANY (v_new)
                     GROUP BY u.a
                     ORDER BY u.a
                    ON CONFLICT (account_id) DO NOTHING
                    RETURNING account_id)
                SELECT coalesce(array_agg(c.account_id), '{}') INTO v_created FROM created c;
            EXCEPTION WHEN lock_not_available THEN
                -- One of them is being created by another transaction: create
                -- them one at a time, so that only that one is deferred.
                v_created := '{}';
                FOREACH v_a IN ARRAY v_new LOOP
                    BEGIN
                        INSERT INTO rail_high_water (account_id, highest_token, updated_at)
                        SELECT v_a, max(u.t), now()
                          FROM unnest(p_account, p_token) AS u(a, t)
                         WHERE u.a = v_a
                        ON CONFLICT (account_id) DO NOTHING
                        RETURNING account_id INTO v_one;
                        IF v_one IS NOT NULL THEN
                            v_created := v_created || v_one;
                        END IF;
                    EXCEPTION WHEN lock_not_available THEN
                        NULL;
                    END;
                END LOOP;
            END;
            v_held := v_held || ARRAY(SELECT m.a FROM unnest(v_new) AS m(a) WHERE NOT m.a = ANY (v_created));
        END IF;
    END IF;

    SELECT coalesce(array_agg(s.payout_id), '{}') INTO v_taken
      FROM rail_submission s
     WHERE s.payout_id = ANY (p_payout)
       AND (s.outcome IS NULL OR s.outcome IN ('ACKED','REJECTED','TIMEOUT'));

    FOR i IN 1 .. n LOOP
        CONTINUE WHEN p_account[i] = ANY (v_held);
        j := j + 1;
        v_ord[j] := i;
        k := array_position(v_accts, p_account[i]);
        IF k IS NULL THEN
            -- A created account's first submission: it passes, as the pinned
            -- upsert's insert does.
            v_met[j] := NULL;
            v_passed[j] := true;
            v_accts := v_accts || p_account[i];
            v_marks := v_marks || p_token[i];
        ELSE
            v_met[j] := v_marks[k];
            v_passed[j] := v_marks[k] < p_token[i];
            IF v_passed[j] THEN
                v_marks[k] := p_token[i];
            END IF;
        END IF;
        IF NOT v_passed[j] AND p_fencing THEN
            v_outcome[j] := 'FENCED';
        ELSIF p_payout[i] = ANY (v_taken) THEN
            v_outcome[j] := 'DUPLICATE';
        ELSE
            v_outcome[j] := NULL;
            v_taken := v_taken || p_payout[i];
        END IF;
    END LOOP;

    IF v_nexist > 0 THEN
        UPDATE rail_high_water h
           SET highest_token = u.t, updated_at = now()
          FROM unnest(v_accts[1 : v_nexist], v_marks[1 : v_nexist], v_m0) AS u(a, t, m)
         WHERE h.account_id = u.a AND u.t > u.m;
    END IF;

    IF j > 0 THEN
        SELECT array_agg(x.id ORDER BY x.id) INTO v_ids
          FROM (SELECT nextval('rail_submission_submission_id_seq'::regclass) AS id
                  FROM generate_series(1, j)) x;

        WITH ins AS (
            INSERT INTO rail_submission
                   (submission_id, payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor,
                    currency, beneficiary, outcome, resolved_at, interrupt_at)
            OVERRIDING SYSTEM VALUE
            SELECT u.id, p_payout[u.i], p_account[u.i], p_token[u.i], p_owner[u.i], p_idem[u.i], p_amount[u.i],
                   p_currency[u.i], p_beneficiary[u.i], u.out,
                   CASE WHEN u.out IS NOT NULL THEN clock_timestamp() END,
                   CASE WHEN u.out IS NULL THEN clock_timestamp() + p_interrupt_ms * interval '1 millisecond' END
              FROM unnest(v_ids, v_ord, v_outcome) AS u(id, i, out)
             ORDER BY p_payout[u.i], u.id
            RETURNING submission_id, submitted_at)
        SELECT array_agg(ins.submission_id), array_agg(ins.submitted_at) INTO v_ret_id, v_ret_at FROM ins;
    END IF;

    j := 1;
    FOR i IN 1 .. n LOOP
        o_ord := i;
        IF j <= cardinality(v_ord) AND v_ord[j] = i THEN
            o_deferred := false;
            o_submission_id := v_ids[j];
            o_submitted_at := v_ret_at[array_position(v_ret_id, v_ids[j])];
            o_outcome := v_outcome[j];
            o_passed_fence := v_passed[j];
            o_mark := v_met[j];
            j := j + 1;
        ELSE
            o_deferred := true;
            o_submission_id := NULL;
            o_submitted_at := NULL;
            o_outcome := NULL;
            o_passed_fence := NULL;
            o_mark := NULL;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION rail_admit_group_skip_locked(text[], bigint[], text[], text[], text[], bigint[], text[], text[],
                                           boolean, bigint);
