#!/usr/bin/env bash
# A local PostgreSQL primary and one streaming standby, for failover runs; prints the
# SQLAlchemy URL that names both (libpq's multi-host form):
#
#   postgresql://postgres@/agboss_replica?host=127.0.0.1:5442&host=127.0.0.1:5443&target_session_attrs=read-write
#
# Usage:
#   replica.sh [start] [--async]   make a fresh pair (any pair of this directory is stopped
#                                  and deleted first) and print the URL
#   replica.sh stop                stop both servers (by the pid in their postmaster.pid)
#   replica.sh status              print each server's role (primary, standby, down)
#
# By default the standby is synchronous (synchronous_standby_names = 'standby1',
# synchronous_commit = on): a COMMIT returns once the standby has flushed its WAL.
# --async leaves synchronous_standby_names empty: a COMMIT returns once the primary alone
# has it, and a standby promoted after the primary died may lack the last of them.
#
# stdout: only the URL (start) or the roles (status); stderr: everything else. Exits
# non-zero (printing no URL) on failure.
#
# The servers are the PostgreSQL 15 binaries (/usr/lib/postgresql/15/bin), run as the
# postgres user when this runs as root, each with its own port, data directory, socket
# directory and log under AGBOSS_REPLICA_DIR (default: .replica/ in the checkout,
# ignored by git). The server on 5432 is never touched. fsync is off: the faults these
# pairs are for kill processes, not the machine (the page cache survives a SIGKILL).
#
# Overrides: AGBOSS_REPLICA_DIR, AGBOSS_REPLICA_DB (agboss_replica),
# AGBOSS_REPLICA_PORT (5442: the primary; the standby is the next port),
# AGBOSS_PG_BIN (/usr/lib/postgresql/15/bin), AGBOSS_READY_TIMEOUT (60 s per wait).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dir="${AGBOSS_REPLICA_DIR:-$root/.replica}"
db="${AGBOSS_REPLICA_DB:-agboss_replica}"
primary_port="${AGBOSS_REPLICA_PORT:-5442}"
standby_port=$((primary_port + 1))
bin="${AGBOSS_PG_BIN:-/usr/lib/postgresql/15/bin}"
timeout="${AGBOSS_READY_TIMEOUT:-60}"

log() { echo "postgresql/replica.sh: $*" >&2; }
fail() { log "ERROR: $*"; exit 1; }

action=start
mode=sync
for arg in "$@"; do
    case "$arg" in
        start | stop | status) action="$arg" ;;
        --async) mode=async ;;
        --sync) mode=sync ;;
        *) fail "unknown argument $arg (start [--async], stop, status)" ;;
    esac
done

[[ "$db" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || fail "unsupported database name: $db"
for tool in initdb pg_ctl pg_basebackup psql pg_isready; do
    [[ -x "$bin/$tool" ]] || fail "$bin/$tool not found (install postgresql-15, or set AGBOSS_PG_BIN)"
done

run_as=""
if [[ "$(id -u)" == 0 ]]; then
    id postgres >/dev/null 2>&1 || fail "running as root needs a postgres user to run the servers as"
    run_as=postgres
fi
as_owner() {
    if [[ -n "$run_as" ]]; then runuser -u "$run_as" -- "$@"; else "$@"; fi
}

primary="$dir/primary"
standby="$dir/standby"

# The pid of the postmaster of data directory $1 when it runs, else nothing.
pid_of() {
    local file="$1/postmaster.pid" pid
    [[ -f "$file" ]] || return 0
    pid="$(head -n 1 "$file" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    # Ours only: the process must be a postgres whose data directory is $1.
    if [[ -r "/proc/$pid/cmdline" ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$1"; then
        echo "$pid"
    fi
}

stop_one() {
    local data="$1" pid waited=0
    pid="$(pid_of "$data")"
    [[ -n "$pid" ]] || return 0
    log "stopping the server of $data (pid $pid)"
    kill -INT "$pid" 2>/dev/null || true # fast shutdown
    while kill -0 "$pid" 2>/dev/null; do
        if ((waited >= timeout * 10)); then
            log "pid $pid did not stop within ${timeout}s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

ask() { # port sql: one value, empty when the server does not answer
    "$bin/psql" -X -q -At -h 127.0.0.1 -p "$1" -U postgres -d postgres -c "$2" 2>/dev/null || true
}

role_of() {
    local answer
    answer="$(ask "$1" "SELECT pg_is_in_recovery()")"
    case "$answer" in
        f) echo primary ;;
        t) echo standby ;;
        *) echo down ;;
    esac
}

if [[ "$action" == stop ]]; then
    stop_one "$standby"
    stop_one "$primary"
    exit 0
fi
if [[ "$action" == status ]]; then
    echo "127.0.0.1:$primary_port $(role_of "$primary_port")"
    echo "127.0.0.1:$standby_port $(role_of "$standby_port")"
    exit 0
fi

stop_one "$standby"
stop_one "$primary"
for port in "$primary_port" "$standby_port"; do
    if "$bin/pg_isready" -q -h 127.0.0.1 -p "$port"; then
        fail "port $port is answered by a server that is not this pair's: choose AGBOSS_REPLICA_PORT"
    fi
done
rm -rf "$primary" "$standby"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
primary="$dir/primary"
standby="$dir/standby"
[[ -n "$run_as" ]] && chown "$run_as" "$dir"
chmod 0755 "$dir"

log "initdb $primary"
as_owner "$bin/initdb" -D "$primary" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 --no-sync >&2 \
    || fail "initdb failed"
cat >>"$primary/postgresql.conf" <<EOF
# replica.sh
listen_addresses = '127.0.0.1'
port = $primary_port
unix_socket_directories = '$dir'
wal_level = replica
max_wal_senders = 5
hot_standby = on
synchronous_commit = on
fsync = off
max_connections = 200
wal_receiver_status_interval = 1s
EOF
as_owner "$bin/pg_ctl" -D "$primary" -l "$dir/primary.log" -w -t "$timeout" start >&2 \
    || fail "the primary did not start (see $dir/primary.log)"
"$bin/psql" -X -q -h 127.0.0.1 -p "$primary_port" -U postgres -d postgres \
    -c "CREATE DATABASE \"$db\"" >&2 || fail "cannot create database $db"

log "pg_basebackup into $standby"
as_owner "$bin/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U postgres -D "$standby" -R -X stream -c fast --no-sync >&2 \
    || fail "pg_basebackup failed"
cat >>"$standby/postgresql.auto.conf" <<EOF
primary_conninfo = 'host=127.0.0.1 port=$primary_port user=postgres application_name=standby1'
EOF
cat >>"$standby/postgresql.conf" <<EOF
port = $standby_port
EOF
as_owner "$bin/pg_ctl" -D "$standby" -l "$dir/standby.log" -w -t "$timeout" start >&2 \
    || fail "the standby did not start (see $dir/standby.log)"

# Synchronous only once the standby streams: until then every COMMIT (CREATE DATABASE's
# too) would wait for it.
want=async
if [[ "$mode" == sync ]]; then
    want=sync
    "$bin/psql" -X -q -h 127.0.0.1 -p "$primary_port" -U postgres -d postgres \
        -c "ALTER SYSTEM SET synchronous_standby_names = 'standby1'" -c "SELECT pg_reload_conf()" >&2 \
        || fail "cannot make the standby synchronous"
fi
waited=0
until [[ "$(ask "$primary_port" "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1' AND state = 'streaming'")" == "$want" ]]; do
    ((waited >= timeout * 10)) && fail "the standby is not streaming ($want) after ${timeout}s (see $dir/standby.log)"
    sleep 0.1
    waited=$((waited + 1))
done
log "primary 127.0.0.1:$primary_port, standby 127.0.0.1:$standby_port streaming ($want)"
printf 'postgresql://postgres@/%s?host=127.0.0.1:%s&host=127.0.0.1:%s&target_session_attrs=read-write\n' \
    "$db" "$primary_port" "$standby_port"
