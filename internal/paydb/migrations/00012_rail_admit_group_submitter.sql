-- +goose Up
-- The group admission functions, each with one argument more: p_submitter, per
-- member the verified SPIFFE ID of the workload that presented it (NULL without
-- identities), written to rail_submission.submitter_identity (00011) on the row
-- the member leaves, whatever its outcome (docs/contracts/workload-identity.md,
-- docs/contracts/rail-proxy.md#group-admission-rail_proxy_max_group).
--
-- rail_admit_group_skip_locked_by is rail_admit_group_skip_locked (00007) and
-- rail_admit_group_books_by is rail_admit_group_books (00010), word for word but
-- for the submitter: the same decisions, SET clauses and round trips; a NULL
-- array (no identities) costs one NULL per row. Expand, then contract, as
-- 00007 and 00010 did: they ship under new names beside the old ones, which
-- replicas of the previous release keep calling and which stay until none does
-- (their rows then carry no submitter, which is what that release knew).
-- +goose StatementBegin
CREATE FUNCTION rail_admit_group_skip_locked_by(
    p_account     text[],
    p_token       bigint[],
    p_payout      text[],
    p_owner       text[],
    p_idem        text[],
    p_amount      bigint[],
    p_currency    text[],
    p_beneficiary text[],
    p_fencing     boolean,
    p_interrupt_ms bigint,
    p_submitter   text[])
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
                    currency, beneficiary, outcome, resolved_at, interrupt_at, submitter_identity)
            OVERRIDING SYSTEM VALUE
            SELECT u.id, p_payout[u.i], p_account[u.i], p_token[u.i], p_owner[u.i], p_idem[u.i], p_amount[u.i],
                   p_currency[u.i], p_beneficiary[u.i], u.out,
                   CASE WHEN u.out IS NOT NULL THEN clock_timestamp() END,
                   CASE WHEN u.out IS NULL THEN clock_timestamp() + p_interrupt_ms * interval '1 millisecond' END,
                   p_submitter[u.i]
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

-- +goose StatementBegin
CREATE FUNCTION rail_admit_group_books_by(
    p_account     text[],
    p_token       bigint[],
    p_payout      text[],
    p_owner       text[],
    p_idem        text[],
    p_amount      bigint[],
    p_currency    text[],
    p_beneficiary text[],
    p_fencing     boolean,
    p_interrupt_ms bigint,
    p_submitter   text[])
RETURNS TABLE (o_ord integer, o_deferred boolean, o_submission_id bigint, o_submitted_at timestamptz,
               o_outcome text, o_passed_fence boolean, o_mark bigint, o_mismatch text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET lock_timeout = '1ms'
AS $fn$
DECLARE
    n          integer := cardinality(p_account);
    v_accts    text[];            -- the accounts with a mark here: those locked, in account order, then the created ones
    v_marks    bigint[];          -- their marks as the group's decided members so far have left them
    v_m0       bigint[];          -- the marks of the locked accounts, as locked
    v_nexist   integer;
    v_mismatch text[];            -- per member: the first books check it fails, NULL when it passes
    v_missing  text[];            -- the group's accounts whose row step 1 did not lock
    v_held     text[] := '{}';    -- accounts whose mark row another transaction holds: their members are deferred
    v_new      text[] := '{}';    -- accounts with no committed mark row and a booked member: to be created
    v_created  text[] := '{}';    -- accounts whose mark row this group created
    v_taken    text[];            -- payouts that have a forwardable attempt
    v_ord      integer[] := '{}'; -- the decided members' ordinals, in arrival order
    v_ids      bigint[];
    v_met      bigint[] := '{}';
    v_passed   boolean[] := '{}';
    v_outcome  text[] := '{}';
    v_mm       text[] := '{}';    -- the decided members' mismatches
    v_ret_id   bigint[];
    v_ret_at   timestamptz[];
    v_a        text;
    v_one      text;
    j          integer := 0;
    k          integer;
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

    -- The books, every member's payout read without a lock. The CASE is the
    -- order of lockapi.BooksMismatchOrder (TestGroupBooksFollowLockapisOrder).
    SELECT array_agg(CASE
               WHEN y.payout_id IS NULL                 THEN 'not_found'
               WHEN y.status <> 'CLAIMED'               THEN 'not_claimed'
               WHEN y.fence_token <> u.t                THEN 'token'
               WHEN y.claimed_by IS DISTINCT FROM u.o   THEN 'owner'
               WHEN y.account_id <> u.a                 THEN 'account'
               WHEN y.amount_minor <> u.m               THEN 'amount'
               WHEN y.currency <> u.c                   THEN 'currency'
               WHEN y.beneficiary <> u.b                THEN 'beneficiary'
           END ORDER BY u.i)
      INTO v_mismatch
      FROM unnest(p_payout, p_token, p_owner, p_account, p_amount, p_currency, p_beneficiary)
           WITH ORDINALITY AS u(p, t, o, a, m, c, b, i)
      LEFT JOIN payout y ON y.payout_id = u.p;

    SELECT coalesce(array_agg(DISTINCT u.a), '{}') INTO v_missing
      FROM unnest(p_account) AS u(a)
     WHERE NOT u.a = ANY (v_accts);
    IF cardinality(v_missing) > 0 THEN
        SELECT coalesce(array_agg(h.account_id), '{}') INTO v_held
          FROM rail_high_water h
         WHERE h.account_id = ANY (v_missing);
        SELECT coalesce(array_agg(DISTINCT u.a ORDER BY u.a), '{}') INTO v_new
          FROM unnest(p_account, v_mismatch) AS u(a, mm)
         WHERE u.a = ANY (v_missing) AND NOT u.a = ANY (v_held) AND u.mm IS NULL;
        IF cardinality(v_new) > 0 THEN
            BEGIN
                WITH created AS (
                    INSERT INTO rail_high_water (account_id, highest_token, updated_at)
                    SELECT u.a, max(u.t), now()
                      FROM unnest(p_account, p_token, v_mismatch) AS u(a, t, mm)
                     WHERE u.a = ANY (v_new) AND u.mm IS NULL
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
                          FROM unnest(p_account, p_token, v_mismatch) AS u(a, t, mm)
                         WHERE u.a = v_a AND u.mm IS NULL
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
        v_mm[j] := NULL;
        k := array_position(v_accts, p_account[i]);
        IF k IS NULL THEN
            -- No mark yet: the fence passes it, as the pinned upsert's insert
            -- does. A booked member is its created account's first: the mark
            -- starts here. An unbooked one leaves no mark behind.
            v_met[j] := NULL;
            v_passed[j] := true;
            IF v_mismatch[i] IS NULL THEN
                v_accts := v_accts || p_account[i];
                v_marks := v_marks || p_token[i];
            END IF;
        ELSE
            v_met[j] := v_marks[k];
            v_passed[j] := v_marks[k] < p_token[i];
            IF v_passed[j] AND v_mismatch[i] IS NULL THEN
                v_marks[k] := p_token[i];
            END IF;
        END IF;
        IF NOT v_passed[j] AND p_fencing THEN
            v_outcome[j] := 'FENCED';
        ELSIF v_mismatch[i] IS NOT NULL THEN
            -- The pinned upsert does not run for it: it passed no fence.
            v_outcome[j] := 'UNBOOKED';
            v_mm[j] := v_mismatch[i];
            v_passed[j] := false;
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
                    currency, beneficiary, outcome, resolved_at, interrupt_at, submitter_identity)
            OVERRIDING SYSTEM VALUE
            SELECT u.id, p_payout[u.i], p_account[u.i], p_token[u.i], p_owner[u.i], p_idem[u.i], p_amount[u.i],
                   p_currency[u.i], p_beneficiary[u.i], u.out,
                   CASE WHEN u.out IS NOT NULL THEN clock_timestamp() END,
                   CASE WHEN u.out IS NULL THEN clock_timestamp() + p_interrupt_ms * interval '1 millisecond' END,
                   p_submitter[u.i]
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
            o_mismatch := v_mm[j];
            j := j + 1;
        ELSE
            o_deferred := true;
            o_submission_id := NULL;
            o_submitted_at := NULL;
            o_outcome := NULL;
            o_passed_fence := NULL;
            o_mark := NULL;
            o_mismatch := NULL;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION rail_admit_group_books_by(text[], bigint[], text[], text[], text[], bigint[], text[], text[],
                                        boolean, bigint, text[]);
DROP FUNCTION rail_admit_group_skip_locked_by(text[], bigint[], text[], text[], text[], bigint[], text[], text[],
                                              boolean, bigint, text[]);
