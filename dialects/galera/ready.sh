#!/usr/bin/env bash
# Start (idempotently) a 3-node MariaDB Galera cluster on loopback ports and print
# the SQLAlchemy URL of each node, one per line (node 1 first).
#
# stdout: only the three URLs, e.g. mysql://root@127.0.0.1:3311/agboss_galera
# stderr: everything else. Exits non-zero (printing no URL) on failure.
#
# Each node has its own data directory, socket, pid file, SQL port, Galera port,
# IST port and SST port, under AGBOSS_GALERA_DIR (default: .galera/ in the
# checkout). A server already running on the machine (e.g. on 3306) is never
# touched: nodes are recognised by port *and* by their data directory, and a
# port answered by anything else is an error. Nodes already up are left alone;
# when no node is up, node 1 bootstraps a new cluster (--wsrep-new-cluster) and
# nodes 2 and 3 join it by state transfer (rsync). The script returns once
# wsrep_cluster_size is 3 and every node reports Synced.
#
# Overrides: AGBOSS_GALERA_DIR, AGBOSS_GALERA_DB (agboss_galera),
# AGBOSS_GALERA_BASE_PORT (3310: SQL ports 3311-3313; Galera +1260 -> 4571-4573,
# IST +1270 -> 4581-4583, SST +1280 -> 4591-4593), AGBOSS_READY_TIMEOUT (120 s per
# wait). Stop with dialects/galera/stop.sh.
#
# --node N [--sst]: (re)start node N alone, joining the nodes that run (one must), and
# print its URL once it is Synced; a node already up is left alone. It joins by IST when
# the donor's gcache still holds what it missed, else by SST; --sst deletes its
# grastate.dat first, so it joins by a full state transfer (rsync).
set -euo pipefail

only=""
force_sst=0
while (($#)); do
    case "$1" in
        --node) only="${2:-}"; shift 2 ;;
        --sst) force_sst=1; shift ;;
        *) echo "galera/ready.sh: unknown argument $1 (usage: ready.sh [--node N [--sst]])" >&2; exit 2 ;;
    esac
done
[[ -z "$only" || "$only" =~ ^[123]$ ]] || { echo "galera/ready.sh: --node takes 1, 2 or 3" >&2; exit 2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dir="${AGBOSS_GALERA_DIR:-$root/.galera}"
db="${AGBOSS_GALERA_DB:-agboss_galera}"
base="${AGBOSS_GALERA_BASE_PORT:-3310}"
timeout="${AGBOSS_READY_TIMEOUT:-120}"
provider=/usr/lib/galera/libgalera_smm.so

log() { echo "galera/ready.sh: $*" >&2; }
fail() { log "ERROR: $*"; exit 1; }

[[ "$db" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || fail "unsupported database name: $db"
[[ -x /usr/sbin/mariadbd ]] || fail "/usr/sbin/mariadbd is not installed (apt-get install mariadb-server)"
if [[ ! -e "$provider" ]]; then
    log "$provider missing; installing galera-4"
    DEBIAN_FRONTEND=noninteractive apt-get install -y galera-4 >&2 \
        || fail "cannot install galera-4"
fi
command -v rsync >/dev/null || fail "rsync not found (state transfer uses it)"
admin="$(command -v mariadb-admin || command -v mysqladmin)" || fail "mariadb-admin not found"
client="$(command -v mariadb || command -v mysql)" || fail "mariadb client not found"
install_db="$(command -v mariadb-install-db || command -v mysql_install_db)" \
    || fail "mariadb-install-db not found"

mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
# The state transfer's rsync daemon drops root for "nobody"; running the nodes as
# the mysql user (when started as root) keeps every file writable by the transfer.
run_as="$(id -un)"
if [[ "$(id -u)" == 0 ]] && id mysql >/dev/null 2>&1; then run_as=mysql; fi

sql_port() { echo $((base + $1)); }
node_dir() { echo "$dir/node$1"; }

# Ask node $1 something over TCP; empty output when it does not answer.
ask() {
    "$client" --connect-timeout=3 -h127.0.0.1 -P"$(sql_port "$1")" -uroot -N -B -e "$2" 2>/dev/null || true
}

# 0 when our node $1 answers on its port; 1 when the port is free (or, with a second
# argument "starting", when it does not answer yet: a node we started listens before it
# has joined); fails when the port is answered by a server that is not ours.
node_up() {
    local port datadir
    port="$(sql_port "$1")"
    if ! "$admin" --connect-timeout=3 -h127.0.0.1 -P"$port" -uroot ping >/dev/null 2>&1; then
        if [[ "${2:-}" != starting ]] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            fail "port $port is taken by something that is not node $1 of this cluster"
        fi
        return 1
    fi
    datadir="$(ask "$1" 'SELECT @@datadir')"
    [[ "${datadir%/}" == "$(node_dir "$1")/data" ]] \
        || fail "port $port answers, but its data directory is '${datadir}', not node $1's"
    return 0
}

write_config() {
    local n=$1 nd
    nd="$(node_dir "$n")"
    mkdir -p "$nd/data" "$nd/tmp"
    [[ "$run_as" == "$(id -un)" ]] || chown -R "$run_as": "$nd"
    cat >"$nd/my.cnf" <<EOF
[mysqld]
datadir=$nd/data
tmpdir=$nd/tmp
socket=$nd/mysqld.sock
pid-file=$nd/mysqld.pid
log-error=$nd/error.log
port=$(sql_port "$n")
bind-address=127.0.0.1
skip-name-resolve
user=$run_as
character-set-server=utf8mb4
collation-server=utf8mb4_bin
performance_schema=OFF
innodb_buffer_pool_size=64M
innodb_log_file_size=48M
innodb_flush_log_at_trx_commit=2
innodb_autoinc_lock_mode=2
binlog_format=ROW
default_storage_engine=InnoDB
max_connections=300
wsrep_on=ON
wsrep_provider=$provider
wsrep_cluster_name=agboss_galera
wsrep_cluster_address=gcomm://127.0.0.1:$((base + 1261)),127.0.0.1:$((base + 1262)),127.0.0.1:$((base + 1263))
wsrep_node_name=node$n
wsrep_node_address=127.0.0.1:$((base + 1260 + n))
wsrep_node_incoming_address=127.0.0.1:$(sql_port "$n")
wsrep_sst_receive_address=127.0.0.1:$((base + 1280 + n))
wsrep_sst_method=rsync
wsrep_slave_threads=1
wsrep_provider_options="gmcast.listen_addr=tcp://127.0.0.1:$((base + 1260 + n));ist.recv_addr=127.0.0.1:$((base + 1270 + n));gcache.size=64M;evs.suspect_timeout=PT10S;evs.inactive_timeout=PT30S"

[sst]
EOF
}

start_node() {
    local n=$1 nd
    shift
    nd="$(node_dir "$n")"
    write_config "$n"
    if [[ ! -d "$nd/data/mysql" ]]; then
        log "initialising node $n's data directory"
        "$install_db" --defaults-file="$nd/my.cnf" --auth-root-authentication-method=normal \
            --user="$run_as" --skip-test-db >"$nd/install.log" 2>&1 || fail "mariadb-install-db failed (see $nd/install.log)"
    fi
    log "starting node $n on port $(sql_port "$n") $*"
    rm -f "$nd/mysqld.pid"
    # setsid: the node outlives this script and the caller's process group.
    setsid /usr/sbin/mariadbd --defaults-file="$nd/my.cnf" "$@" </dev/null >>"$nd/stdout.log" 2>&1 &
}

wait_synced() {
    local n=$1 waited=0 state=""
    until node_up "$n" starting && state="$(ask "$n" "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME='WSREP_LOCAL_STATE_COMMENT'")" && [[ "$state" == Synced ]]; do
        ((waited >= timeout)) && fail "node $n not Synced after ${timeout}s (state '${state}'; see $(node_dir "$n")/error.log)"
        sleep 1
        waited=$((waited + 1))
    done
}

up=()
for n in 1 2 3; do
    if node_up "$n"; then up+=("$n"); fi
done

if [[ -n "$only" ]]; then
    if ! node_up "$only"; then
        others=0
        for n in 1 2 3; do
            [[ "$n" != "$only" ]] && node_up "$n" && others=$((others + 1))
        done
        ((others > 0)) || fail "no other node runs: node $only has no cluster to join (start all with ready.sh)"
        gs="$(node_dir "$only")/data/grastate.dat"
        position=()
        if ((force_sst)); then
            log "node $only: deleting grastate.dat (a full state transfer follows)"
            rm -f "$gs"
        elif [[ -f "$gs" ]] && grep -q '^seqno: *-1' "$gs"; then
            # It crashed (or was killed): grastate.dat holds no position, and the node would
            # ask for a full state transfer. Recover its last committed position from
            # InnoDB (as galera_recovery does) so that it asks for the missing write sets
            # only (IST) when a donor's gcache still holds them.
            write_config "$only"
            recovered="$(/usr/sbin/mariadbd --defaults-file="$(node_dir "$only")/my.cnf" \
                --wsrep-recover --log-error="$(node_dir "$only")/recover.log" 2>&1 >/dev/null || true)"
            recovered="$(grep -ho 'Recovered position: .*' "$(node_dir "$only")/recover.log" 2>/dev/null | tail -n 1 | awk '{print $3}')"
            if [[ "$recovered" =~ ^[0-9a-f-]+:[0-9]+$ ]]; then
                log "node $only: recovered position $recovered"
                position=(--wsrep_start_position="$recovered")
            else
                log "node $only: no position recovered (a full state transfer follows)"
            fi
        fi
        start_node "$only" "${position[@]}"
    fi
    wait_synced "$only"
    log "node $only Synced"
    printf 'mysql://root@127.0.0.1:%s/%s\n' "$(sql_port "$only")" "$db"
    exit 0
fi

if ((${#up[@]} == 0)); then
    # Nothing of ours runs: node 1 bootstraps. It may have stopped last or not, and
    # this is a throwaway test cluster, so it is marked safe to bootstrap.
    gs="$(node_dir 1)/data/grastate.dat"
    [[ -f "$gs" ]] && sed -i 's/^safe_to_bootstrap: 0/safe_to_bootstrap: 1/' "$gs"
    start_node 1 --wsrep-new-cluster
    wait_synced 1
    up=(1)
fi
for n in 1 2 3; do
    if ! node_up "$n"; then
        start_node "$n"
        # One joiner at a time: each state transfer has a single donor.
        wait_synced "$n"
    fi
done
for n in 1 2 3; do wait_synced "$n"; done

waited=0
until [[ "$(ask 1 "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME='WSREP_CLUSTER_SIZE'")" == 3 ]]; do
    ((waited >= timeout)) && fail "wsrep_cluster_size is not 3 after ${timeout}s"
    sleep 1
    waited=$((waited + 1))
done

"$client" --connect-timeout=5 -h127.0.0.1 -P"$(sql_port 1)" -uroot -e "
    CREATE DATABASE IF NOT EXISTS \`$db\` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    ALTER DATABASE \`$db\` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;" >&2 \
    || fail "cannot create database $db on node 1"
# The DDL replicates in total order; wait until every node sees it.
for n in 2 3; do
    waited=0
    until [[ -n "$(ask "$n" "SET SESSION wsrep_sync_wait=1; SHOW DATABASES LIKE '$db'")" ]]; do
        ((waited >= timeout)) && fail "database $db not visible on node $n after ${timeout}s"
        sleep 1
        waited=$((waited + 1))
    done
done

log "cluster of 3 Synced nodes ready, database $db"
for n in 1 2 3; do
    printf 'mysql://root@127.0.0.1:%s/%s\n' "$(sql_port "$n")" "$db"
done
