#!/bin/sh
# Makes the secrets compose.yaml reads, in deploy/compose/secrets/ (git-ignored):
# the two database owners' passwords and pgpass files, each service's own
# login's (lock_server, rail_proxy, payment, reconciler: docs/contracts/database.md),
# the settle bearer token (an env file), Grafana's admin password,
# lock-server's grant signing key with its public JWK Set
# (docs/contracts/signed-grants.md, made by `lock-server keygen` in the image),
# and the workloads' certificates: a CA and one SVID per workload
# (docs/contracts/workload-identity.md, made by `lock-server certs` in the image).
#
# Run it once, from anywhere:  deploy/compose/gen-secrets.sh
# It never overwrites: delete a file to make a new one (and, for a database
# password, the database's volume: PostgreSQL keeps the password it started with).
#
# The directory is 0700; the files in it are 0644 because compose (without
# swarm) bind-mounts them with their host mode and the services run as the
# image's nonroot user (65532). This is a one-machine setup; Kubernetes gets its
# secrets from a Secret (deploy/k8s).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir="$here/secrets"
image="${LOCKDEV_IMAGE:-lockdev:${LOCKDEV_VERSION:-dev}}"
mkdir -p "$dir"
chmod 0700 "$dir"

random() { head -c 48 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | cut -c1-32; }

# put NAME CONTENT: write secrets/NAME unless it exists.
put() {
  if [ -e "$dir/$1" ]; then
    echo "kept $dir/$1"
    return
  fi
  (umask 022 && printf '%s\n' "$2" > "$dir/$1")
  echo "made $dir/$1"
}

for db in lockdb paydb; do
  put "${db}_password" "$(random)"
  user=lock; [ "$db" = paydb ] && user=pay
  put "$db.pgpass" "$db:5432:$db:$user:$(head -n 1 "$dir/${db}_password")"
done
# the services' own logins, created by deploy/compose/initdb/roles.sh
for login in lock_server rail_proxy payment reconciler; do
  db=paydb; [ "$login" = lock_server ] && db=lockdb
  put "${login}_password" "$(random)"
  put "$login.pgpass" "$db:5432:$db:$login:$(head -n 1 "$dir/${login}_password")"
done
put settle.env "PAYMENT_SETTLE_TOKEN=$(random)"
put grafana_admin_password "$(random)"

image_ready() {
  if ! docker image inspect "$image" >/dev/null 2>&1; then
    echo "building $image for lock-server keygen and certs"
    docker build -t "$image" "$here/../.."
  fi
}

if [ -e "$dir/grants/signing-key.pem" ]; then
  echo "kept $dir/grants"
else
  image_ready
  docker run --rm --user "$(id -u):$(id -g)" -v "$dir:/out" "$image" lock-server keygen --out /out/grants
  chmod 0755 "$dir/grants"
  chmod 0644 "$dir/grants/signing-key.pem" "$dir/grants/jwks.json"
  echo "made $dir/grants (signing-key.pem, jwks.json)"
fi

# The CA and the SVIDs (spiffe://lock.dev/{workload}, 30 days). `lock-server
# certs` refuses to overwrite: to renew, delete the directory and run this
# again (then restart the stack; the services also re-read changed files).
# ca.key is mounted nowhere.
if [ -e "$dir/certs/ca.pem" ]; then
  echo "kept $dir/certs"
else
  image_ready
  docker run --rm --user "$(id -u):$(id -g)" -v "$dir:/out" "$image" lock-server certs --out /out/certs --valid 720h
  chmod 0755 "$dir/certs"
  chmod 0644 "$dir"/certs/*.pem
  for k in "$dir"/certs/*.key; do
    [ "$k" = "$dir/certs/ca.key" ] || chmod 0644 "$k"
  done
  echo "made $dir/certs (ca.pem, ca.key and each workload's .pem and .key)"
fi
