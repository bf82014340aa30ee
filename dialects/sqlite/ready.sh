#!/usr/bin/env bash
# Make a SQLite test database location ready and print its SQLAlchemy URL.
#
# stdout: only the URL, e.g. sqlite:////tmp/agboss-sqlite.XXXXXX/agboss_test.sqlite
# stderr: everything else. Exits non-zero (printing no URL) on failure.
#
# AGBOSS_SQLITE_DIR  directory for the database file (created if missing);
#                    default: a new directory from mktemp -d.
set -euo pipefail

log() { echo "sqlite/ready.sh: $*" >&2; }
fail() { log "ERROR: $*"; exit 1; }

dir="${AGBOSS_SQLITE_DIR:-}"
if [[ -z "$dir" ]]; then
    dir="$(mktemp -d "${TMPDIR:-/tmp}/agboss-sqlite.XXXXXX")" \
        || fail "mktemp -d failed"
else
    mkdir -p -- "$dir" || fail "cannot create directory $dir"
fi
dir="$(cd -- "$dir" && pwd -P)" || fail "cannot enter directory $dir"
[[ -w "$dir" ]] || fail "directory $dir is not writable"

file="$dir/agboss_test.sqlite"
# The file itself is created on first connect (an empty file is a valid database).
log "using $file"
printf 'sqlite:///%s\n' "$file"
