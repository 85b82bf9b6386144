-- +goose Up
-- rail_admit_group, cheaper (docs/contracts/rail-proxy.md, "Group admission").
-- Same arguments, same rows, same verdicts as 00005's; what changed is what
-- PostgreSQL spends per group. 00005 judged the group in one statement of eight
-- CTEs: PostgreSQL planned it anew on every call (custom plans for array
-- arguments, about 1 ms), a near-empty table at the first calls gave it
-- sequential scans of rail_high_water, and its executor start-up (three
-- ModifyTable nodes, window aggregates, hash joins) cost as much as a whole
-- submission. Here:
--
--   * the plans are generic and made once per connection (plan_cache_mode), and
--     never a sequential scan (enable_seqscan): every statement below is an
--     index lookup, and a plan made while the tables were nearly empty must not
--     turn into a scan of a grown table for the life of the connection;
--   * step 1 first creates the mark rows of the group's accounts that have none,
--     in account order, with the mark they end the group at (the highest token of
--     the account's members: its first member passes, as the pinned upsert's
--     insert does, and the mark rises to every later token above it); ON CONFLICT
--     DO NOTHING waits for a concurrent creator of the same row and leaves its
--     row alone. Then it locks every other account's row with SELECT … ORDER BY
--     account_id FOR UPDATE; in READ COMMITTED a locked row is returned in its
--     latest committed version, so the marks read are the ones no one else can
--     change until COMMIT. Creations in one order, then locks in one order: two
--     groups (two replicas) never deadlock on the marks;
--   * step 2 runs member by member, in arrival order, in memory: the mark a
--     submission meets is its account's mark as the group's earlier members left
--     it, exactly as one-by-one admission would move it; a submission of a payout
--     that already has a forwardable attempt (a committed row the unique index
--     holds, or an earlier member of the group) is a DUPLICATE;
--   * step 3 writes every member's row in one INSERT, in payout order (two groups
--     inserting the same payouts wait for each other in one order), with ids drawn
--     beforehand in arrival order. A forwardable attempt that another transaction
--     has not committed yet is not seen by the DUPLICATE check; the unique index
--     then makes the insert wait for it and, if it commits, fail with
--     unique_violation — one by one again, where the pinned ON CONFLICT decides.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION rail_admit_group(
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
RETURNS TABLE (o_ord integer, o_submission_id bigint, o_submitted_at timestamptz, o_outcome text,
               o_passed_fence boolean, o_mark bigint)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $fn$
DECLARE
    n         integer := cardinality(p_account);
    v_created text[];     -- accounts whose mark row this group created
    v_accts   text[];     -- the group's accounts: those with a row, in account order, then the new ones
    v_marks   bigint[];   -- their marks as the group's members so far have left them
    v_m0      bigint[];   -- the marks of the accounts with a row, as locked
    v_nexist  integer;
    v_taken   text[];     -- payouts that have a forwardable attempt
    v_ids     bigint[];
    v_met     bigint[] := '{}';
    v_passed  boolean[] := '{}';
    v_outcome text[] := '{}';
    v_ret_id  bigint[];
    v_ret_at  timestamptz[];
    k         integer;
BEGIN
    WITH created AS (
        INSERT INTO rail_high_water (account_id, highest_token, updated_at)
        SELECT u.a, max(u.t), now()
          FROM unnest(p_account, p_token) AS u(a, t)
         GROUP BY u.a
         ORDER BY u.a
        ON CONFLICT (account_id) DO NOTHING
        RETURNING account_id)
    SELECT coalesce(array_agg(c.account_id), '{}') INTO v_created FROM created c;

    SELECT coalesce(array_agg(l.account_id ORDER BY l.account_id), '{}'),
           coalesce(array_agg(l.highest_token ORDER BY l.account_id), '{}')
      INTO v_accts, v_marks
      FROM (SELECT h.account_id, h.highest_token
              FROM rail_high_water h
             WHERE h.account_id = ANY (p_account) AND NOT h.account_id = ANY (v_created)
             ORDER BY h.account_id
               FOR UPDATE) l;
    v_m0 := v_marks;
    v_nexist := cardinality(v_accts);

    SELECT coalesce(array_agg(s.payout_id), '{}') INTO v_taken
      FROM rail_submission s
     WHERE s.payout_id = ANY (p_payout)
       AND (s.outcome IS NULL OR s.outcome IN ('ACKED','REJECTED','TIMEOUT'));

    SELECT array_agg(x.id ORDER BY x.id) INTO v_ids
      FROM (SELECT nextval('rail_submission_submission_id_seq'::regclass) AS id
              FROM generate_series(1, n)) x;

    FOR i IN 1 .. n LOOP
        k := array_position(v_accts, p_account[i]);
        IF k IS NULL THEN
            -- A created account's first submission: it passes, as the pinned
            -- upsert's insert does.
            v_met[i] := NULL;
            v_passed[i] := true;
            v_accts := v_accts || p_account[i];
            v_marks := v_marks || p_token[i];
        ELSE
            v_met[i] := v_marks[k];
            v_passed[i] := v_marks[k] < p_token[i];
            IF v_passed[i] THEN
                v_marks[k] := p_token[i];
            END IF;
        END IF;
        IF NOT v_passed[i] AND p_fencing THEN
            v_outcome[i] := 'FENCED';
        ELSIF p_payout[i] = ANY (v_taken) THEN
            v_outcome[i] := 'DUPLICATE';
        ELSE
            v_outcome[i] := NULL;
            v_taken := v_taken || p_payout[i];
        END IF;
    END LOOP;

    IF v_nexist > 0 THEN
        UPDATE rail_high_water h
           SET highest_token = u.t, updated_at = now()
          FROM unnest(v_accts[1 : v_nexist], v_marks[1 : v_nexist], v_m0) AS u(a, t, m)
         WHERE h.account_id = u.a AND u.t > u.m;
    END IF;

    WITH ins AS (
        INSERT INTO rail_submission
               (submission_id, payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor,
                currency, beneficiary, outcome, resolved_at, interrupt_at)
        OVERRIDING SYSTEM VALUE
        SELECT u.id, u.p, u.a, u.t, u.o, u.k, u.amt, u.cur, u.ben, u.out,
               CASE WHEN u.out IS NOT NULL THEN clock_timestamp() END,
               CASE WHEN u.out IS NULL THEN clock_timestamp() + p_interrupt_ms * interval '1 millisecond' END
          FROM unnest(v_ids, p_payout, p_account, p_token, p_owner, p_idem, p_amount, p_currency, p_beneficiary,
                      v_outcome) AS u(id, p, a, t, o, k, amt, cur, ben, out)
         ORDER BY u.p, u.id
        RETURNING submission_id, submitted_at)
    SELECT array_agg(ins.submission_id), array_agg(ins.submitted_at) INTO v_ret_id, v_ret_at FROM ins;

    FOR i IN 1 .. n LOOP
        o_ord := i;
        o_submission_id := v_ids[i];
        o_submitted_at := v_ret_at[array_position(v_ret_id, v_ids[i])];
        o_outcome := v_outcome[i];
        o_passed_fence := v_passed[i];
        o_mark := v_met[i];
        RETURN NEXT;
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
-- 00005's function, as it was.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION rail_admit_group(
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
RETURNS TABLE (o_ord integer, o_submission_id bigint, o_submitted_at timestamptz, o_outcome text,
               o_passed_fence boolean, o_mark bigint)
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    v_created text[];
BEGIN
    WITH locked AS (
        INSERT INTO rail_high_water AS h (account_id, highest_token, updated_at)
        SELECT u.a, max(u.t), now()
          FROM unnest(p_account, p_token) AS u(a, t)
         GROUP BY u.a
         ORDER BY u.a
        ON CONFLICT (account_id) DO UPDATE SET updated_at = h.updated_at WHERE false
        RETURNING h.account_id)
    SELECT coalesce(array_agg(l.account_id), '{}') INTO v_created FROM locked l;

    RETURN QUERY
    WITH s AS MATERIALIZED (
        SELECT u.ord::integer AS ord, u.a, u.t, u.p, u.o, u.k, u.amt, u.cur, u.ben
          FROM unnest(p_account, p_token, p_payout, p_owner, p_idem, p_amount, p_currency, p_beneficiary)
               WITH ORDINALITY AS u(a, t, p, o, k, amt, cur, ben, ord)
    ), ids AS MATERIALIZED (
        SELECT (row_number() OVER (ORDER BY n.id))::integer AS ord, n.id
          FROM (SELECT nextval('rail_submission_submission_id_seq'::regclass) AS id
                  FROM generate_series(1, cardinality(p_account))) n
    ), m0 AS (
        SELECT h.account_id, h.highest_token
          FROM rail_high_water h
         WHERE h.account_id = ANY (p_account) AND NOT h.account_id = ANY (v_created)
    ), judged AS MATERIALIZED (
        SELECT s.*, ids.id,
               greatest(m0.highest_token,
                        max(s.t) OVER (PARTITION BY s.a ORDER BY s.ord
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)) AS met
          FROM s JOIN ids ON ids.ord = s.ord LEFT JOIN m0 ON m0.account_id = s.a
    ), tried AS MATERIALIZED (
        SELECT j.*, (j.met IS NULL OR j.met < j.t) AS passed,
               (j.met IS NULL OR j.met < j.t OR NOT p_fencing) AS tries
          FROM judged j
    ), firsts AS MATERIALIZED (
        SELECT t.*, t.tries AND t.ord = min(t.ord) FILTER (WHERE t.tries) OVER (PARTITION BY t.p) AS first_try
          FROM tried t
    ), marks AS (
        UPDATE rail_high_water h
           SET highest_token = g.top, updated_at = now()
          FROM (SELECT s.a, max(s.t) AS top FROM s GROUP BY s.a) g
         WHERE h.account_id = g.a AND h.highest_token < g.top AND NOT g.a = ANY (v_created)
    ), intent AS (
        INSERT INTO rail_submission
               (submission_id, payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor,
                currency, beneficiary, interrupt_at)
        OVERRIDING SYSTEM VALUE
        SELECT f.id, f.p, f.a, f.t, f.o, f.k, f.amt, f.cur, f.ben,
               clock_timestamp() + p_interrupt_ms * interval '1 millisecond'
          FROM firsts f
         WHERE f.first_try
         ORDER BY f.p
        ON CONFLICT (payout_id) WHERE outcome IS NULL OR outcome IN ('ACKED','REJECTED','TIMEOUT') DO NOTHING
        RETURNING submission_id, submitted_at
    ), refused AS (
        INSERT INTO rail_submission
               (submission_id, payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor,
                currency, beneficiary, outcome, resolved_at)
        OVERRIDING SYSTEM VALUE
        SELECT f.id, f.p, f.a, f.t, f.o, f.k, f.amt, f.cur, f.ben,
               CASE WHEN f.tries THEN 'DUPLICATE' ELSE 'FENCED' END, clock_timestamp()
          FROM firsts f
         WHERE NOT EXISTS (SELECT FROM intent i WHERE i.submission_id = f.id)
         ORDER BY f.ord
        RETURNING submission_id, submitted_at, outcome
    )
    SELECT f.ord, f.id, coalesce(i.submitted_at, r.submitted_at), r.outcome, f.passed, f.met
      FROM firsts f
      LEFT JOIN intent i ON i.submission_id = f.id
      LEFT JOIN refused r ON r.submission_id = f.id
     ORDER BY f.ord;
END
$fn$;
-- +goose StatementEnd
