#!/usr/bin/env bash
# Stop the PgBouncer dialects/postgresql/pgbouncer.sh started (by its pid file; the same
# overrides). Stopping nothing is not an error.
set -euo pipefail
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/pgbouncer.sh" stop
