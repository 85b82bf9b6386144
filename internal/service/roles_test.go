package service

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/lockdb"
	"lock.dev/internal/logcapture"
	"lock.dev/internal/paydb"
	"lock.dev/internal/pgtest"
)

// The grant step of migrate on a throwaway cluster: four logins made as an
// operator would, migrate with the role settings, then each login runs the
// statements of its service and is refused (42501) outside its grants
// (docs/contracts/database.md, least privilege). An external database given by
// TEST_DATABASE_URL must let the test's user create roles.

const insufficientPrivilege = "42501"

// logins are the test's runtime logins by role setting.
type logins map[string]string

// makeLogins creates one login per role setting, named uniquely on the cluster
// (roles are cluster-wide), and dropped when the test ends.
func makeLogins(t *testing.T, adminURL string, urls ...string) logins {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	suffix := fmt.Sprintf("%x", time.Now().UnixNano())
	ls := logins{}
	for _, env := range append(slices.Clone(RoleSettings["paydb"]), RoleSettings["lockdb"]...) {
		role := strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(env, "PAYDB_ROLE_"), "LOCKDB_ROLE_")) + "_" + suffix
		// the password serves an external server's password authentication; the
		// throwaway cluster trusts local connections
		if _, err := conn.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN PASSWORD 'pw-"+suffix+"'"); err != nil {
			t.Fatalf("create role: %v", err)
		}
		ls[env] = role
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, u := range urls { // DROP OWNED is per database: it drops the grants there
			if c, err := pgx.Connect(ctx, u); err == nil {
				for _, role := range ls {
					_, _ = c.Exec(ctx, "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
				}
				_ = c.Close(ctx)
			}
		}
		if c, err := pgx.Connect(ctx, adminURL); err == nil {
			for _, role := range ls {
				_, _ = c.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize())
			}
			_ = c.Close(ctx)
		}
	})
	return ls
}

// roles is the Database.Roles of the settings given (as BindRoles fills it).
func (ls logins) roles(envs ...string) Roles {
	r := Roles{}
	for _, env := range envs {
		login := ls[env]
		r[env] = &login
	}
	return r
}

// url is dbURL with the login of env.
func (ls logins) url(t *testing.T, dbURL, env string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	role := ls[env]
	u.User = url.UserPassword(role, "pw-"+role[strings.LastIndexByte(role, '_')+1:])
	return u.String()
}

// as connects to dbURL with the login of env: the service's own connection.
func (ls logins) as(t *testing.T, dbURL, env string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), ls.url(t, dbURL, env))
	if err != nil {
		t.Fatalf("connect as %s: %v", env, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// migrateSpec is a migrate of tree at dbURL granting roles.
func migrateSpec(tree dbconn.Tree, dbURL string, roles Roles) Spec {
	return Spec{Name: tree.Database + "-migrate", Identity: noAuth, LogLevel: "info", LogOutput: &logcapture.Buffer{},
		Validate: func() error { return nil },
		DB: &Database{Tree: tree, URL: dbURL, MaxConns: 4, ConnsBound: 10, MigrateCommand: "migrate",
			CheckTimeout: 10 * time.Second, Roles: roles}}
}

// step is one statement a login runs; ok says whether it must succeed or be
// refused with insufficient_privilege.
type step struct {
	sql  string
	args []any
	ok   bool
}

// runSteps runs the steps in one transaction each, so a refusal leaves the next step
// a usable connection and the rows of one step are visible to the next.
func runSteps(t *testing.T, who string, conn *pgx.Conn, steps []step) {
	t.Helper()
	ctx := context.Background()
	for _, s := range steps {
		_, err := conn.Exec(ctx, s.sql, s.args...)
		var pgErr *pgconn.PgError
		switch {
		case s.ok && err != nil:
			t.Errorf("%s: %s\n  = %v, want it to succeed", who, s.sql, err)
		case !s.ok && (!errors.As(err, &pgErr) || pgErr.Code != insufficientPrivilege):
			t.Errorf("%s: %s\n  = %v, want SQLSTATE %s", who, s.sql, err, insufficientPrivilege)
		}
	}
}

func ok(sql string, args ...any) step      { return step{sql, args, true} }
func refused(sql string, args ...any) step { return step{sql, args, false} }

// auditDeletes are the deletes no login may run.
func auditDeletes() []step {
	return []step{
		refused("DELETE FROM rail_submission"), refused("DELETE FROM ledger_entry"),
		refused("DELETE FROM payout_history"), refused("DELETE FROM rail_statement_line"),
		refused("TRUNCATE rail_submission"),
	}
}

// admitOne calls rail-proxy's group admission with one member.
const admitOne = `SELECT * FROM rail_admit_group_books(ARRAY['acct-9'], ARRAY[7::bigint], ARRAY['po-2'], ARRAY['w-1'],
  ARRAY['idem-2'], ARRAY[500::bigint], ARRAY['EUR'], ARRAY['DE89370400440532013000'], true, 60000)`

func TestMigrateGrantsEachLoginOnlyItsServicesStatements(t *testing.T) {
	ctx := context.Background()
	payURL, lockURL := pgtest.EmptyURL(t), pgtest.EmptyURL(t)
	ls := makeLogins(t, payURL, payURL, lockURL)
	paySpec := migrateSpec(paydb.Tree(), payURL, ls.roles(RoleSettings["paydb"]...))
	lockSpec := migrateSpec(lockdb.Tree(), lockURL, ls.roles(RoleSettings["lockdb"]...))
	for range 2 { // re-applied on every run: the second is the same grant step over a current schema
		for _, spec := range []Spec{paySpec, lockSpec} {
			if err := Migrate(ctx, spec); err != nil {
				t.Fatalf("migrate %s: %v", spec.DB.name(), err)
			}
		}
	}

	// every login checks the schema's version at start, as its service does
	for _, env := range RoleSettings["paydb"] {
		c := ls.as(t, payURL, env)
		if err := paydb.Tree().RequireCurrent(ctx, poolOf(t, c), "migrate"); err != nil {
			t.Errorf("%s: the start-up schema check: %v", env, err)
		}
	}

	payment := ls.as(t, payURL, "PAYDB_ROLE_PAYMENT")
	runSteps(t, "payment-resource", payment, append([]step{
		ok(`INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary) VALUES ('po-1','acct-9',500,'EUR','DE89370400440532013000'), ('po-2','acct-9',500,'EUR','DE89370400440532013000') ON CONFLICT (payout_id) DO NOTHING`),
		ok(`WITH moved AS (UPDATE payout SET status='CLAIMED', fence_token=7, claimed_by='w-1', updated_at=now() WHERE payout_id='po-1' RETURNING *)
INSERT INTO payout_history (payout_id, status, fence_token, owner_id, actor) SELECT payout_id, status, fence_token, claimed_by, 'spiffe://lock.dev/executor' FROM moved`),
		ok(`UPDATE payout SET status='CLAIMED', fence_token=7, claimed_by='w-1' WHERE payout_id='po-2'`),
		ok(`SELECT p.*, s.submission_id FROM payout p LEFT JOIN LATERAL (SELECT submission_id FROM rail_submission s WHERE s.payout_id = p.payout_id) s ON true WHERE p.payout_id='po-1' FOR UPDATE OF p`),
		ok(`INSERT INTO ledger_entry (payout_id, account_id, amount_minor, currency, posted_token) VALUES ('po-1','acct-9',-500,'EUR',7)`),
		ok(`SELECT p.payout_id, c.read_at, EXISTS (SELECT 1 FROM reconciliation_exception e WHERE e.payout_id = p.payout_id) FROM payout p LEFT JOIN reconciler_cursor c ON true FOR UPDATE OF p`),
		ok(`SELECT seq FROM rail_statement_line WHERE reference = 'po-1'`),
		ok(`SELECT outcome FROM payout_settlement WHERE payout_id = 'po-1'`),
		ok(`SELECT set_config('statement_timeout', '5s', true)`),
		refused(`INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency, beneficiary) VALUES ('po-1','acct-9',7,'w-1','k',500,'EUR','DE89370400440532013000')`),
		refused(`UPDATE rail_high_water SET highest_token = 1`),
		refused(`UPDATE reconciler_cursor SET last_seq = 0`),
		refused(`UPDATE payout_history SET actor = NULL`),
		refused(`UPDATE ledger_entry SET amount_minor = -1`),
		refused(admitOne),
	}, auditDeletes()...))

	railProxy := ls.as(t, payURL, "PAYDB_ROLE_RAIL_PROXY")
	runSteps(t, "rail-proxy", railProxy, append([]step{
		ok(`SELECT pg_is_in_recovery()`),
		ok(`WITH mark AS MATERIALIZED (SELECT highest_token FROM rail_high_water WHERE account_id = 'acct-9' FOR UPDATE),
book AS MATERIALIZED (SELECT status, fence_token, claimed_by FROM payout WHERE payout_id = 'po-1'),
fence AS (INSERT INTO rail_high_water (account_id, highest_token, updated_at) SELECT 'acct-9', 7, now() FROM book
   ON CONFLICT (account_id) DO UPDATE SET highest_token = EXCLUDED.highest_token, updated_at = now()
   WHERE rail_high_water.highest_token < EXCLUDED.highest_token RETURNING highest_token)
INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency, beneficiary, interrupt_at)
SELECT 'po-1', 'acct-9', 7, 'w-1', 'idem-1', 500, 'EUR', 'DE89370400440532013000', clock_timestamp() FROM fence
ON CONFLICT (payout_id) WHERE outcome IS NULL OR outcome IN ('ACKED','REJECTED','TIMEOUT') DO NOTHING`),
		ok(`UPDATE rail_submission SET outcome='ACKED', rail_reference='r-1', decline_reason=NULL, resolved_at=clock_timestamp() WHERE payout_id='po-1' AND outcome IS NULL`),
		refused(`UPDATE rail_submission SET amount_minor = 1`),
		refused(`UPDATE rail_submission SET beneficiary = 'EVIL'`),
		refused(`UPDATE rail_submission SET submitter_identity = NULL`),
		ok(`SELECT highest_token FROM rail_high_water WHERE account_id = 'acct-9'`),
		ok(admitOne),
		ok(`SELECT pg_logical_emit_message(true, 'lock.dev/rail-proxy', 'durability check')`),
		ok(`SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = pg_backend_pid() AND state IS DISTINCT FROM 'idle')`),
		refused(`UPDATE payout SET status = 'PAID'`),
		refused(`SELECT 1 FROM payout WHERE payout_id = 'po-1' FOR UPDATE`),
		refused(`INSERT INTO ledger_entry (payout_id, account_id, amount_minor, currency, posted_token) VALUES ('po-2','acct-9',-500,'EUR',7)`),
		refused(`INSERT INTO rail_statement_line (seq, received_at, reference, account_id, amount_minor, currency, result, beneficiary) VALUES (9, now(), 'po-1', 'acct-9', 500, 'EUR', 'ACCEPTED', 'x')`),
		refused(`SELECT * FROM reconciler_cursor`),
	}, auditDeletes()...))

	reconciler := ls.as(t, payURL, "PAYDB_ROLE_RECONCILER")
	runSteps(t, "reconciler", reconciler, append([]step{
		ok(`SELECT pg_try_advisory_lock(42), pg_advisory_unlock(42)`),
		ok(`INSERT INTO reconciler_cursor (id) VALUES (true) ON CONFLICT (id) DO NOTHING`),
		ok(`SELECT now(), last_seq, read_at FROM reconciler_cursor`),
		ok(`INSERT INTO rail_statement_line (seq, received_at, reference, account_id, amount_minor, currency, result, rail_reference, decline_reason, beneficiary)
SELECT * FROM unnest(ARRAY[1::bigint], ARRAY[now()], ARRAY['po-1'], ARRAY['acct-9'], ARRAY[500::bigint], ARRAY['EUR'], ARRAY['ACCEPTED'], ARRAY['r-1'], ARRAY[NULL::text], ARRAY['DE89370400440532013000'])
ON CONFLICT (seq) DO NOTHING`),
		ok(`UPDATE reconciler_cursor SET last_seq = GREATEST(last_seq, 1), read_at = now()`),
		ok(`INSERT INTO reconciliation_exception (kind, payout_id, seq, detail)
SELECT 'AMOUNT_MISMATCH', p.payout_id, l.seq, 'test' FROM rail_statement_line l JOIN payout p ON p.payout_id = l.reference
  LEFT JOIN LATERAL (SELECT max(s.submitted_at) AS submitted_at FROM rail_submission s WHERE s.payout_id = p.payout_id) s ON true
ON CONFLICT DO NOTHING`),
		ok(`SELECT count(*) FROM payout WHERE status = 'AMBIGUOUS'`),
		ok(`SELECT count(*) FROM rail_submission WHERE outcome IS NULL`),
		refused(`UPDATE rail_high_water SET highest_token = highest_token + 1`),
		refused(`UPDATE payout SET status = 'NOT_PRESENTED'`),
		refused(`UPDATE rail_submission SET outcome = 'UNSENT'`),
		refused(`UPDATE rail_statement_line SET result = 'DECLINED'`),
		refused(`INSERT INTO payout_settlement (payout_id, outcome) VALUES ('po-2', 'NOT_PRESENTED')`),
		refused(admitOne),
	}, auditDeletes()...))

	lockServer := ls.as(t, lockURL, "LOCKDB_ROLE_LOCK_SERVER")
	if err := lockdb.Tree().RequireCurrent(ctx, poolOf(t, lockServer), "migrate"); err != nil {
		t.Errorf("lock-server: the start-up schema check: %v", err)
	}
	runSteps(t, "lock-server", lockServer, []step{
		ok(`INSERT INTO lock_lease AS l (lock_name, owner_id, token, acquired_at, expires_at) VALUES ('account:acct-9', 'w-1', 1, now(), now() + interval '5s')
ON CONFLICT (lock_name) DO UPDATE SET owner_id = EXCLUDED.owner_id, token = l.token + 1, holder_identity = 'spiffe://lock.dev/executor'`),
		ok(`INSERT INTO lock_grant (lock_name, token, owner_id, acquired_at, ttl_ms, expires_at) VALUES ('account:acct-9', 1, 'w-1', now(), 5000, now() + interval '5s')`),
		ok(`UPDATE lock_grant SET released_at = clock_timestamp() WHERE lock_name = 'account:acct-9' AND token = 1`),
		ok(`UPDATE lock_grant SET expires_at = now() WHERE lock_name = 'account:acct-9' AND token = 1`),
		refused(`UPDATE lock_grant SET owner_id = 'someone-else'`),
		refused(`UPDATE lock_grant SET holder_identity = NULL`),
		ok(`SELECT token, owner_id FROM lock_grant WHERE lock_name = 'account:acct-9'`),
		refused(`DELETE FROM lock_grant`),
		refused(`DELETE FROM lock_lease`),
		refused(`CREATE TABLE lock_extra (x int)`),
	})
	// lock-server's login may connect to paydb (CONNECT is PUBLIC's) but reads
	// and writes nothing there
	runSteps(t, "lock-server on paydb", ls.as(t, payURL, "LOCKDB_ROLE_LOCK_SERVER"), []step{
		refused(`SELECT * FROM payout`), refused(`SELECT * FROM rail_submission`),
		refused(`UPDATE rail_high_water SET highest_token = 1`), refused(admitOne),
	})
}

// poolOf is a pool on the connection's own URL and login (what the service
// opens at start).
func poolOf(t *testing.T, c *pgx.Conn) *pgxpool.Pool {
	t.Helper()
	cfg := c.Config()
	u := url.URL{Scheme: "postgres", User: url.UserPassword(cfg.User, cfg.Password),
		Host: fmt.Sprintf("%s:%d", cfg.Host, cfg.Port), Path: "/" + cfg.Database}
	return pgtest.Pool(t, u.String())
}

func TestMigrateGrantStepTakesBackWhatTheFileDoesNotList(t *testing.T) {
	ctx := context.Background()
	payURL := pgtest.EmptyURL(t)
	ls := makeLogins(t, payURL, payURL)
	spec := migrateSpec(paydb.Tree(), payURL, ls.roles("PAYDB_ROLE_RECONCILER"))
	if err := Migrate(ctx, spec); err != nil {
		t.Fatal(err)
	}
	// a wider grant left behind (an earlier file, a hand-made grant) …
	admin, err := pgx.Connect(ctx, payURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	r := pgx.Identifier{ls["PAYDB_ROLE_RECONCILER"]}.Sanitize()
	for _, g := range []string{"GRANT UPDATE, DELETE ON rail_high_water, rail_statement_line TO " + r,
		"GRANT EXECUTE ON FUNCTION rail_admit_group_books(text[], bigint[], text[], text[], text[], bigint[], text[], text[], boolean, bigint) TO " + r} {
		if _, err := admin.Exec(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	// … is gone after the next migrate
	if err := Migrate(ctx, spec); err != nil {
		t.Fatal(err)
	}
	runSteps(t, "reconciler", ls.as(t, payURL, "PAYDB_ROLE_RECONCILER"), []step{
		refused(`UPDATE rail_high_water SET highest_token = 1`),
		refused(`DELETE FROM rail_statement_line`),
		refused(admitOne),
		ok(`SELECT count(*) FROM rail_statement_line`),
	})
}

func TestMigrateRefusesALoginThatIsMissingOrBypassesGrants(t *testing.T) {
	ctx := context.Background()
	payURL := pgtest.EmptyURL(t)
	owner, err := url.Parse(payURL)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ login, want string }{
		{"no_such_login_" + fmt.Sprint(time.Now().UnixNano()), "does not exist"},
		{owner.User.Username(), "bypass every grant"}, // the migrating owner (a superuser on the test cluster)
	} {
		login := c.login
		spec := migrateSpec(paydb.Tree(), payURL, Roles{"PAYDB_ROLE_PAYMENT": &login})
		err := Migrate(ctx, spec)
		if err == nil || !strings.Contains(err.Error(), "PAYDB_ROLE_PAYMENT") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("migrate with PAYDB_ROLE_PAYMENT=%s: %v, want a refusal naming the setting, %q", login, err, c.want)
		}
	}
}

func TestGrantsFilesHaveASectionForEachRoleSetting(t *testing.T) {
	for _, tree := range []dbconn.Tree{paydb.Tree(), lockdb.Tree()} {
		g, err := parseGrants(tree.Grants)
		if err != nil {
			t.Fatalf("%s: %v", tree.Database, err)
		}
		var got []string
		for env := range g.roles {
			got = append(got, env)
		}
		slices.Sort(got)
		want := slices.Sorted(slices.Values(RoleSettings[tree.Database]))
		if !slices.Equal(got, want) {
			t.Errorf("%s's grants file has sections %v, want %v", tree.Database, got, want)
		}
		for env, stmts := range g.roles {
			for _, st := range stmts {
				if strings.Contains(strings.ToUpper(st), "DELETE") || strings.Contains(strings.ToUpper(st), "TRUNCATE") {
					t.Errorf("%s %s grants a removal: %s", tree.Database, env, st)
				}
			}
		}
	}
}
