-- +goose Up
-- rail-proxy's group admission (docs/contracts/rail-proxy.md, "Group admission"):
-- steps 1–2 of the admission for a group of submissions in one call, with the
-- verdicts, rows and marks that admitting them one by one, in the arrays' order,
-- with the pinned upsert and intent insert would give.
--
-- Step 1 locks the mark row of every account of the group, in account order, so
-- that two groups (two replicas) always lock in the same order and cannot
-- deadlock: existing rows through ON CONFLICT … DO UPDATE … WHERE false (which
-- locks the row and changes nothing), missing rows by inserting them with the
-- group's highest token for the account (what they end at). Step 2 runs as a
-- second statement, so READ COMMITTED gives it a snapshot taken after the locks:
-- the marks it reads (m0) are the ones no one else can change until COMMIT.
--
-- Submission i of account a meets the mark greatest(m0(a), the highest token of
-- the group's earlier submissions of a): one by one, the mark moves only to a
-- token that passed, and a token that did not pass is not above the mark it met,
-- so the highest earlier token is the mark, passed or not. A created account has
-- no m0: its first submission passes, as the pinned upsert's insert would.
--
-- Submission ids are drawn after the locks, in the arrays' order, so they follow
-- arrival order as one by one does, and an account's ids follow its admissions
-- across groups and replicas. The intents are inserted in payout order (two
-- groups racing on the same payouts then wait for each other in one order); the
-- unique index decides DUPLICATE against other transactions, exactly as the
-- one-by-one insert does. Within the group, a payout's later submissions that
-- the fence let through are DUPLICATE of its first: that one either became the
-- intent or was itself refused by the index.
--
-- Returns one row per input ordinal: the row's id and submitted_at, its outcome
-- (NULL: an intent, admitted; FENCED; DUPLICATE), whether the fence passed it,
-- and the mark it met (NULL only when it created the account's mark).
-- +goose StatementBegin
CREATE FUNCTION rail_admit_group(
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

-- +goose Down
DROP FUNCTION rail_admit_group(text[], bigint[], text[], text[], text[], bigint[], text[], text[], boolean, bigint);
