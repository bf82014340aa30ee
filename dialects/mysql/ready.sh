#!/usr/bin/env bash
# Make the MySQL/MariaDB test database ready and print its SQLAlchemy URL.
#
# stdout: only the URL, e.g. mysql://root@127.0.0.1:3306/agboss_test
# stderr: everything else. Exits non-zero (printing no URL) on failure.
#
# If the server does not answer on a loopback address, the local mariadbd is
# started and given up to AGBOSS_READY_TIMEOUT seconds (60). The database is
# created if absent with utf8mb4 / utf8mb4_bin (and altered to that if it exists).
# Overrides: AGBOSS_MYSQL_HOST (127.0.0.1), AGBOSS_MYSQL_PORT (3306),
# AGBOSS_MYSQL_USER (root), AGBOSS_MYSQL_DB (agboss_test). No password is used.
set -euo pipefail

host="${AGBOSS_MYSQL_HOST:-127.0.0.1}"
port="${AGBOSS_MYSQL_PORT:-3306}"
user="${AGBOSS_MYSQL_USER:-root}"
db="${AGBOSS_MYSQL_DB:-agboss_test}"
timeout="${AGBOSS_READY_TIMEOUT:-60}"

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

if ! server_answers; then
    case "$host" in
        127.0.0.1 | localhost | ::1) ;;
        *) fail "MySQL at $host:$port does not answer (remote; not starting it)" ;;
    esac
    [[ -x /usr/sbin/mariadbd ]] || fail "MySQL at $host:$port is down and /usr/sbin/mariadbd is not installed"
    log "MySQL at $host:$port is down; starting /usr/sbin/mariadbd"
    # The socket directory lives on tmpfs and may be gone after a reboot.
    if [[ ! -d /run/mysqld ]] && id mysql >/dev/null 2>&1; then
        install -d -o mysql -g mysql /run/mysqld || true
    fi
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql >&2 \
        || log "start-stop-daemon exited with status $? (waiting anyway)"
    waited=0
    until server_answers; do
        ((waited >= timeout)) && fail "MySQL at $host:$port still not answering after ${timeout}s"
        sleep 1
        waited=$((waited + 1))
    done
    log "MySQL is up after ${waited}s"
fi

"$client" --connect-timeout=5 -h"$host" -P"$port" -u"$user" -e "
    CREATE DATABASE IF NOT EXISTS \`$db\` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    ALTER DATABASE \`$db\` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;" >&2 \
    || fail "cannot create database $db on $host:$port as $user"

log "database $db ready on $host:$port"
printf 'mysql://%s@%s:%s/%s\n' "$user" "$host" "$port" "$db"
