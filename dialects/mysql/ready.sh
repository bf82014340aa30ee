#!/usr/bin/env bash
# Make the MySQL/MariaDB test database ready and print its SQLAlchemy URL.
#
# stdout: only the URL, e.g. mysql://root@127.0.0.1:3306/agboss_test
# stderr: everything else. Exits non-zero (printing no URL) on failure.
#
# The server is checked by its port: `mysqladmin ping` over TCP to host:port
# (or the socket, for host `localhost`). When nothing listens there on a
# loopback address, a local mariadbd is started for that port, recorded in a pid
# file of its own (never found by process name: another mariadbd on the machine,
# on another port, is not this server), and given up to AGBOSS_READY_TIMEOUT
# seconds (60); if it exits first, the script fails at once. Something that
# listens on the port without answering as MySQL is reported, not started over.
# The database is created if absent with utf8mb4 / utf8mb4_bin (and altered to
# that if it exists).
# Overrides: AGBOSS_MYSQL_HOST (127.0.0.1), AGBOSS_MYSQL_PORT (3306),
# AGBOSS_MYSQL_USER (root), AGBOSS_MYSQL_DB (agboss_test),
# AGBOSS_MYSQL_SERVER (/usr/sbin/mariadbd). No password is used.
set -euo pipefail

host="${AGBOSS_MYSQL_HOST:-127.0.0.1}"
port="${AGBOSS_MYSQL_PORT:-3306}"
user="${AGBOSS_MYSQL_USER:-root}"
db="${AGBOSS_MYSQL_DB:-agboss_test}"
timeout="${AGBOSS_READY_TIMEOUT:-60}"
server="${AGBOSS_MYSQL_SERVER:-/usr/sbin/mariadbd}"

log() { echo "mysql/ready.sh: $*" >&2; }
fail() { log "ERROR: $*"; exit 1; }

[[ "$db" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || fail "unsupported database name: $db"
admin="$(command -v mysqladmin || command -v mariadb-admin)" \
    || fail "mysqladmin not found (install mariadb-client)"
client="$(command -v mariadb || command -v mysql)" \
    || fail "mariadb/mysql client not found (install mariadb-client)"

server_answers() {
    "$admin" --connect-timeout=5 -h"$host" -P"$port" -u"$user" ping >/dev/null 2>&1
}

port_listens() {
    [[ "$host" == localhost ]] && return 1
    timeout 5 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" 2>/dev/null
}

if ! server_answers; then
    port_listens && fail "something listens on $host:$port but does not answer as MySQL/MariaDB (mysqladmin ping failed): check what owns that port"
    case "$host" in
        127.0.0.1 | localhost | ::1) ;;
        *) fail "MySQL at $host:$port does not answer (remote; not starting it)" ;;
    esac
    [[ -x "$server" ]] || fail "MySQL at $host:$port is down and $server is not installed"
    # The socket directory lives on tmpfs and may be gone after a reboot.
    if [[ ! -d /run/mysqld ]] && id mysql >/dev/null 2>&1; then
        install -d -o mysql -g mysql /run/mysqld || true
    fi
    pidfile="/run/mysqld/agboss-ready-$port.pid"
    [[ -d /run/mysqld ]] || pidfile="${TMPDIR:-/tmp}/agboss-ready-mysql-$port.pid"
    log "nothing answers on $host:$port; starting $server for port $port (pid file $pidfile)"
    # --pidfile: start-stop-daemon looks for this server's own process only.
    start-stop-daemon --start --background --make-pidfile --pidfile "$pidfile" \
        --exec "$server" -- --user=mysql --port="$port" >&2 \
        || log "start-stop-daemon exited with status $? (waiting anyway)"
    waited=0
    until server_answers; do
        if [[ -s "$pidfile" ]] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
            fail "$server exited before answering on $host:$port (another server may hold its data directory; see its error log)"
        fi
        ((waited >= timeout)) && fail "MySQL at $host:$port still not answering after ${timeout}s"
        sleep 1
        waited=$((waited + 1))
    done
    log "MySQL is up on $host:$port after ${waited}s"
fi

"$client" --connect-timeout=5 -h"$host" -P"$port" -u"$user" -e "
    CREATE DATABASE IF NOT EXISTS \`$db\` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    ALTER DATABASE \`$db\` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;" >&2 \
    || fail "cannot create database $db on $host:$port as $user"

log "database $db ready on $host:$port"
printf 'mysql://%s@%s:%s/%s\n' "$user" "$host" "$port" "$db"
