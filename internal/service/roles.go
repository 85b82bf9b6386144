package service

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/serve"
)

// The grant step of migrate (docs/contracts/database.md, least privilege): after
// the migrations, each runtime login a role setting names gets exactly what its
// section of the tree's grants file lists. It runs on every migrate, in one
// transaction under the tree's advisory lock (so the three paydb services'
// migrate jobs may run at once), and begins by revoking everything the login
// holds in the schema: the result depends only on the file, never on what an
// earlier run granted, and a narrowed file takes effect on the next run.

// roleHeader starts a login's section in a grants file; roleToken stands for
// the login in its statements.
// In a DO block, which cannot take parameters, the login is
// current_setting('lockdev.grant_role') (set for the section's transaction).
const (
	roleHeader  = "-- role: "
	roleToken   = "{{role}}"
	roleSetting = "lockdev.grant_role"
)

// grantsFile is a parsed grants file: statements run once, then each role
// setting's statements.
type grantsFile struct {
	once  []string
	roles map[string][]string
}

// parseGrants splits a grants file into statements (each ends with ";" at the
// end of a line, outside a $$-quoted body; "--" lines between statements are
// comments) under its role headers.
func parseGrants(text string) (grantsFile, error) {
	g := grantsFile{roles: map[string][]string{}}
	env := "" // the section being read; "" for the statements run once
	var stmt strings.Builder
	for line := range strings.Lines(text) {
		trimmed := strings.TrimSpace(line)
		if next, ok := strings.CutPrefix(trimmed, roleHeader); ok {
			if stmt.Len() > 0 {
				return g, fmt.Errorf("grants: a statement before %q does not end with ';'", trimmed)
			}
			env = strings.TrimSpace(next)
			if _, dup := g.roles[env]; dup || env == "" {
				return g, fmt.Errorf("grants: %q is not a new role setting", trimmed)
			}
			g.roles[env] = nil
			continue
		}
		if stmt.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "--")) {
			continue
		}
		stmt.WriteString(line)
		// a DO block's body ($$ … $$) holds statements of its own
		if strings.HasSuffix(trimmed, ";") && strings.Count(stmt.String(), "$$")%2 == 0 {
			st := strings.TrimSpace(stmt.String())
			stmt.Reset()
			if env == "" {
				g.once = append(g.once, st)
			} else {
				g.roles[env] = append(g.roles[env], st)
			}
		}
	}
	if stmt.Len() > 0 {
		return g, errors.New("grants: the last statement does not end with ';'")
	}
	return g, nil
}

// login is one role setting and the login it names.
type login struct{ env, role string }

// logins are the role settings of tree's database that name a login, in
// RoleSettings' order.
func (d Database) logins() []login {
	var ls []login
	for _, env := range RoleSettings[d.name()] {
		if role := d.Roles.Login(env); role != "" {
			ls = append(ls, login{env, role})
		}
	}
	return ls
}

// grant is migrate's grant step; it does nothing when no role setting is set.
// It returns the settings it granted, for the log.
func (d Database) grant(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	ls := d.logins()
	if len(ls) == 0 {
		return nil, nil
	}
	g, err := parseGrants(d.Tree.Grants)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.name(), err)
	}
	for _, l := range ls {
		if _, ok := g.roles[l.env]; !ok { // a programming error: RoleSettings and grants.sql disagree
			return nil, fmt.Errorf("%s: the grants file has no section for %s", d.name(), l.env)
		}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s grants: %w", d.name(), err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", d.Tree.LockID); err != nil {
		return nil, fmt.Errorf("%s grants: %w", d.name(), err)
	}
	schema, owner, err := d.schema(ctx, tx)
	if err != nil {
		return nil, err
	}
	if err := checkLogins(ctx, tx, ls, owner); err != nil {
		return nil, err
	}
	var stmts []string
	stmts = append(stmts, g.once...)
	s := pgx.Identifier{schema}.Sanitize()
	version := pgx.Identifier{schema, d.Tree.Table}.Sanitize()
	// every login's slate is wiped before any is granted: two settings naming
	// one login get both sections
	for _, l := range ls {
		r := pgx.Identifier{l.role}.Sanitize()
		stmts = append(stmts,
			"REVOKE ALL ON ALL TABLES IN SCHEMA "+s+" FROM "+r,
			"REVOKE ALL ON ALL SEQUENCES IN SCHEMA "+s+" FROM "+r,
			"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA "+s+" FROM "+r,
			"REVOKE ALL ON SCHEMA "+s+" FROM "+r)
	}
	envs := make([]string, 0, len(ls))
	for _, st := range stmts {
		if _, err := tx.Exec(ctx, st); err != nil {
			return nil, fmt.Errorf("%s grants: %w", d.name(), err)
		}
	}
	for _, l := range ls {
		r := pgx.Identifier{l.role}.Sanitize()
		// a DO block reads the login from roleSetting: a parameter, never text
		// spliced into its body
		stmts = []string{"GRANT USAGE ON SCHEMA " + s + " TO " + r, "GRANT SELECT ON " + version + " TO " + r}
		for _, st := range g.roles[l.env] {
			stmts = append(stmts, strings.ReplaceAll(st, roleToken, r))
		}
		if _, err := tx.Exec(ctx, "SELECT set_config($1, $2, true)", roleSetting, l.role); err != nil {
			return nil, fmt.Errorf("%s grants: %w", d.name(), err)
		}
		for _, st := range stmts {
			if _, err := tx.Exec(ctx, st); err != nil {
				return nil, fmt.Errorf("%s grants for %s: %w", d.name(), l.env, err)
			}
		}
		envs = append(envs, l.env)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("%s grants: %w", d.name(), err)
	}
	return envs, nil
}

// schema is the schema goose migrated into (its version table's) and the role
// that owns the tree.
func (d Database) schema(ctx context.Context, tx pgx.Tx) (schema, owner string, err error) {
	const q = `SELECT n.nspname, pg_get_userbyid(c.relowner)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.oid = to_regclass($1)`
	if err := tx.QueryRow(ctx, q, d.Tree.Table).Scan(&schema, &owner); err != nil {
		return "", "", fmt.Errorf("%s grants: finding %s: %w", d.name(), d.Tree.Table, err)
	}
	return schema, owner, nil
}

// checkLogins refuses, naming the setting, a login that does not exist (the
// operator creates them) and one that would bypass its grants: a superuser, the
// tree's owner or a member of it.
func checkLogins(ctx context.Context, tx pgx.Tx, ls []login, owner string) error {
	const q = `SELECT r.rolsuper, pg_has_role(r.oid, $2, 'USAGE') FROM pg_roles r WHERE r.rolname = $1`
	for _, l := range ls {
		var super, owns bool
		err := tx.QueryRow(ctx, q, l.role, owner).Scan(&super, &owns)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return serve.Invalid(l.env, "names the role %q, which does not exist; create it first (CREATE ROLE … LOGIN)", l.role)
		case err != nil:
			return fmt.Errorf("%s: reading role %q: %w", l.env, l.role, err)
		case super:
			return serve.Invalid(l.env, "names %q, a superuser: it would bypass every grant; name a login of its own", l.role)
		case owns:
			return serve.Invalid(l.env, "names %q, which owns the tables migrate creates (as %q) or is a member of their owner: it would bypass every grant; name a login of its own", l.role, owner)
		}
	}
	return nil
}
