#!/bin/sh
# Run by the postgres image at a database's first start (an empty volume), as
# the database's owner: creates the runtime logins LOCKDEV_LOGINS names, each
# with the password of secret {login}_password (gen-secrets.sh). They own
# nothing; the migrations grant each its service's privileges
# (docs/contracts/database.md). Sourced or run by docker-entrypoint.sh.
set -eu
for login in $LOCKDEV_LOGINS; do
  psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v login="$login" -v pw="$(head -n 1 "/run/secrets/${login}_password")" <<'SQL'
CREATE ROLE :"login" LOGIN PASSWORD :'pw';
SQL
done
