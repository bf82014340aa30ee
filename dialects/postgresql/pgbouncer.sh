#!/usr/bin/env bash
# Start (idempotently) a local PgBouncer in transaction-pooling mode in front of the
# PostgreSQL server and print the SQLAlchemy URL of the test database through it.
#
# stdout: only the URL, e.g.
#   postgresql://postgres@127.0.0.1:6432/agboss_test?agboss_pooling=transaction
# stderr: everything else. Exits non-zero (printing no URL) on failure.
#
# `dialects/postgresql/pgbouncer.sh stop` (or pgbouncer-stop.sh) stops it, by the pid in
# its pid file, after checking that the pid is this PgBouncer (its config file on its
# command line); nothing else is ever stopped.
#
# PgBouncer comes from Debian's package, installed when missing (apt-get install -y
# pgbouncer); the package's own service is never enabled or started here. This one runs
# as the postgres user (PgBouncer refuses to run as root), with its config, auth file,
# pid file and log under AGBOSS_PGBOUNCER_DIR (default: .pgbouncer/ in the checkout,
# ignored by git). The database is made ready first on the server itself
# (dialects/postgresql/ready.sh, which creates it), and every database name is routed
# to that server (`* = host=… port=…`).
#
# The pool: pool_mode = transaction (a server connection is a client's for one
# transaction only); auth_type = trust (as the local server); and
# ignore_startup_parameters = options, the setting operators add so that clients which
# send `options` can connect at all, and under which those options are silently
# dropped: the project must bound its waits without them (the URL's
# agboss_pooling=transaction) and refuse a URL without it (docs/operations.md,
# "Running behind PgBouncer").
#
# Overrides: AGBOSS_PG_HOST (127.0.0.1), AGBOSS_PG_PORT (5432), AGBOSS_PG_USER (postgres),
# AGBOSS_PG_DB (agboss_test), AGBOSS_PGBOUNCER_PORT (6432), AGBOSS_PGBOUNCER_DIR,
# AGBOSS_PGBOUNCER_POOL_SIZE (server connections per database and user, 40),
# AGBOSS_READY_TIMEOUT (60 s).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dir="${AGBOSS_PGBOUNCER_DIR:-$root/.pgbouncer}"
host="${AGBOSS_PG_HOST:-127.0.0.1}"
port="${AGBOSS_PG_PORT:-5432}"
user="${AGBOSS_PG_USER:-postgres}"
db="${AGBOSS_PG_DB:-agboss_test}"
listen="${AGBOSS_PGBOUNCER_PORT:-6432}"
pool_size="${AGBOSS_PGBOUNCER_POOL_SIZE:-40}"
timeout="${AGBOSS_READY_TIMEOUT:-60}"

log() { echo "postgresql/pgbouncer.sh: $*" >&2; }
fail() { log "ERROR: $*"; exit 1; }

config="$dir/pgbouncer.ini"
pidfile="$dir/pgbouncer.pid"

# The pid of the PgBouncer this script started (pid file, and its command line names
# this config), or nothing.
running_pid() {
    [[ -f "$pidfile" ]] || return 0
    local pid
    pid="$(cat "$pidfile" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$config"; then
        echo "$pid"
    fi
}

stop() {
    local pid waited=0
    pid="$(running_pid)"
    if [[ -z "$pid" ]]; then
        log "nothing to stop (no PgBouncer of $config running)"
        return 0
    fi
    log "stopping PgBouncer (pid $pid)"
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do
        if ((waited >= timeout * 10)); then
            log "PgBouncer (pid $pid) still running after ${timeout}s; sending KILL"
            kill -KILL "$pid" || true
            break
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

case "${1:-}" in
    stop) stop; exit 0 ;;
    "") ;;
    *) echo "postgresql/pgbouncer.sh: unknown argument $1 (usage: pgbouncer.sh [stop])" >&2; exit 2 ;;
esac

[[ "$db" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || fail "unsupported database name: $db"
[[ "$listen" =~ ^[0-9]+$ && "$pool_size" =~ ^[0-9]+$ ]] || fail "AGBOSS_PGBOUNCER_PORT and _POOL_SIZE are numbers"
[[ "$listen" != "$port" ]] || fail "AGBOSS_PGBOUNCER_PORT must differ from the server's port ($port)"

# The database, on the server itself (the script prints its direct URL: not ours).
AGBOSS_PG_HOST="$host" AGBOSS_PG_PORT="$port" AGBOSS_PG_USER="$user" AGBOSS_PG_DB="$db" \
    bash "$here/ready.sh" >/dev/null || fail "PostgreSQL at $host:$port is not ready"

if ! command -v pgbouncer >/dev/null && [[ ! -x /usr/sbin/pgbouncer ]]; then
    log "pgbouncer missing; installing Debian's package (its service is not started here)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y pgbouncer >&2 || fail "cannot install pgbouncer"
fi
bin="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"

as_user=()
if [[ "$(id -u)" == 0 ]]; then
    # PgBouncer refuses to run as root.
    id postgres >/dev/null 2>&1 || fail "running as root and no postgres user to run PgBouncer as"
    as_user=(-u postgres)
fi

if [[ -z "$(running_pid)" ]]; then
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    config="$dir/pgbouncer.ini"
    pidfile="$dir/pgbouncer.pid"
    if pg_isready -q -h 127.0.0.1 -p "$listen"; then
        fail "port $listen answers already, and not as this PgBouncer ($config): set AGBOSS_PGBOUNCER_PORT"
    fi
    printf '"%s" ""\n' "$user" >"$dir/userlist.txt"
    cat >"$config" <<INI
; Written by dialects/postgresql/pgbouncer.sh: rewritten at each start.
[databases]
* = host=$host port=$port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $listen
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = $pool_size
max_client_conn = 1000
; What operators set so that clients sending \`options\` connect at all; the options are dropped.
ignore_startup_parameters = options
logfile = $dir/pgbouncer.log
pidfile = $pidfile
admin_users = $user
INI
    if ((${#as_user[@]})); then
        chown -R postgres "$dir"
    fi
    rm -f "$pidfile"
    log "starting PgBouncer on 127.0.0.1:$listen in front of $host:$port ($config)"
    "$bin" -d "${as_user[@]}" "$config" >&2 || fail "pgbouncer did not start (see $dir/pgbouncer.log)"
fi

waited=0
until pg_isready -q -h 127.0.0.1 -p "$listen" -d "$db" -U "$user"; do
    ((waited >= timeout * 10)) && fail "PgBouncer on port $listen still not ready after ${timeout}s (see $dir/pgbouncer.log)"
    sleep 0.1
    waited=$((waited + 1))
done
[[ -n "$(running_pid)" ]] || fail "port $listen answers, but not as this PgBouncer ($config)"

log "PgBouncer ready on 127.0.0.1:$listen (pool_mode = transaction) for $db"
printf 'postgresql://%s@127.0.0.1:%s/%s?agboss_pooling=transaction\n' "$user" "$listen" "$db"
