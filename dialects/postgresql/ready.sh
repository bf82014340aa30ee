#!/usr/bin/env bash
# Make the PostgreSQL test database ready and print its SQLAlchemy URL.
#
# stdout: only the URL, e.g. postgresql://postgres@127.0.0.1:5432/agboss_test
# stderr: everything else. Exits non-zero (printing no URL) on failure.
#
# If the server does not answer on a loopback address, the local Debian cluster
# is started (pg_ctlcluster) and given up to AGBOSS_READY_TIMEOUT seconds (60).
# The database is created if absent. Overrides: AGBOSS_PG_HOST (127.0.0.1),
# AGBOSS_PG_PORT (5432), AGBOSS_PG_USER (postgres), AGBOSS_PG_DB (agboss_test).
# Authentication is left to libpq (trust, ~/.pgpass or PGPASSWORD); no password
# is put in the URL.
set -euo pipefail

host="${AGBOSS_PG_HOST:-127.0.0.1}"
port="${AGBOSS_PG_PORT:-5432}"
user="${AGBOSS_PG_USER:-postgres}"
db="${AGBOSS_PG_DB:-agboss_test}"
timeout="${AGBOSS_READY_TIMEOUT:-60}"

log() { echo "postgresql/ready.sh: $*" >&2; }
fail() { log "ERROR: $*"; exit 1; }

[[ "$db" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || fail "unsupported database name: $db"
for tool in pg_isready psql; do
    command -v "$tool" >/dev/null || fail "$tool not found (install postgresql-client)"
done

if ! pg_isready -q -h "$host" -p "$port"; then
    case "$host" in
        127.0.0.1 | localhost | ::1) ;;
        *) fail "PostgreSQL at $host:$port is not accepting connections (remote; not starting it)" ;;
    esac
    command -v pg_ctlcluster >/dev/null || fail "PostgreSQL at $host:$port is down and pg_ctlcluster is not available"
    version="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)"
    [[ -n "$version" ]] || fail "PostgreSQL at $host:$port is down and no cluster exists under /etc/postgresql"
    log "PostgreSQL at $host:$port is down; starting cluster $version/main"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2 \
        || log "pg_ctlcluster exited with status $? (waiting anyway)"
    waited=0
    until pg_isready -q -h "$host" -p "$port"; do
        ((waited >= timeout)) && fail "PostgreSQL at $host:$port still not ready after ${timeout}s"
        sleep 1
        waited=$((waited + 1))
    done
    log "PostgreSQL is up after ${waited}s"
fi

run_psql() {
    psql -X -v ON_ERROR_STOP=1 -q -At -h "$host" -p "$port" -U "$user" -d postgres "$@"
}

exists="$(run_psql -c "SELECT 1 FROM pg_database WHERE datname = '$db'")" \
    || fail "cannot query PostgreSQL at $host:$port as $user"
if [[ "$exists" != 1 ]]; then
    log "creating database $db"
    if ! run_psql -c "CREATE DATABASE \"$db\"" >&2; then
        # Another process may have created it meanwhile.
        exists="$(run_psql -c "SELECT 1 FROM pg_database WHERE datname = '$db'")" || exists=""
        [[ "$exists" == 1 ]] || fail "cannot create database $db"
    fi
fi

log "database $db ready on $host:$port"
printf 'postgresql://%s@%s:%s/%s\n' "$user" "$host" "$port" "$db"
