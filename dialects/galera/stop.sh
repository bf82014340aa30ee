#!/usr/bin/env bash
# Stop the Galera test cluster started by dialects/galera/ready.sh, by pid only.
#
# Only the processes named by the pid files under AGBOSS_GALERA_DIR (default:
# .galera/ in the checkout) are signalled, and only when that pid is a mariadbd
# whose command line names that node's own config file. Nodes 3 and 2 stop before
# node 1, so node 1 stops last and can bootstrap the next start.
# Pass --wipe to also delete the data directories.
#
# --node N [--kill]: stop node N alone (the others keep running); with --kill it is sent
# SIGKILL (a crash: no clean shutdown, the others see it vanish) instead of SIGTERM.
set -euo pipefail

only=""
sig=TERM
wipe=0
while (($#)); do
    case "$1" in
        --node) only="${2:-}"; shift 2 ;;
        --kill) sig=KILL; shift ;;
        --wipe) wipe=1; shift ;;
        *) echo "galera/stop.sh: unknown argument $1 (usage: stop.sh [--wipe | --node N [--kill]])" >&2; exit 2 ;;
    esac
done
[[ -z "$only" || "$only" =~ ^[123]$ ]] || { echo "galera/stop.sh: --node takes 1, 2 or 3" >&2; exit 2; }
[[ -z "$only" || $wipe == 0 ]] || { echo "galera/stop.sh: --wipe stops every node; not with --node" >&2; exit 2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dir="${AGBOSS_GALERA_DIR:-$root/.galera}"
timeout="${AGBOSS_READY_TIMEOUT:-120}"

log() { echo "galera/stop.sh: $*" >&2; }

[[ -d "$dir" ]] || { log "nothing to stop ($dir does not exist)"; exit 0; }
dir="$(cd "$dir" && pwd)"

for n in ${only:-3 2 1}; do
    nd="$dir/node$n"
    pidfile="$nd/mysqld.pid"
    [[ -f "$pidfile" ]] || continue
    pid="$(cat "$pidfile")"
    [[ "$pid" =~ ^[0-9]+$ ]] || continue
    if ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--defaults-file=$nd/my.cnf"; then
        log "node $n: pid $pid is not this node's server; leaving it"
        continue
    fi
    log "stopping node $n (pid $pid, SIG$sig)"
    kill -"$sig" "$pid"
    waited=0
    while kill -0 "$pid" 2>/dev/null; do
        if ((waited >= timeout)); then
            log "node $n (pid $pid) still running after ${timeout}s; sending KILL"
            kill -KILL "$pid" || true
            break
        fi
        sleep 1
        waited=$((waited + 1))
    done
done

if ((wipe)); then
    log "deleting $dir"
    rm -rf -- "$dir"
fi
