#!/usr/bin/env bash
# LangGraph's own checkpointer-parametrized tests, run against SqlCheckpointSaver.
#
#   tests/langgraph_suite/run.sh <langgraph-checkout> [pytest args...]
#
# <langgraph-checkout>: a LangGraph source tree (its libs/langgraph/tests must match the
# installed langgraph version: the release's tag, or its source package from the index,
# unpacked as <checkout>/libs/langgraph, which carries tests/). This script fetches
# nothing: run it in a virtualenv holding that langgraph, its test dependencies (pytest,
# pytest-asyncio, pytest-mock, syrupy, httpx, pycryptodome, redis, psycopg[binary],
# langgraph-checkpoint-sqlite, langgraph-checkpoint-postgres) and this project
# (`pip install -e '.[test]'`). It copies agboss_checkpointer.py into the checkout's tests
# and adds our savers to its checkpointer fixtures (patch_conftest.py), then runs the given
# tests restricted to our savers:
#
#   AGBOSS_LG_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/lg \
#   AGBOSS_LG_MYSQL_URL=mysql://root@127.0.0.1:3306/lg \
#   tests/langgraph_suite/run.sh ~/src/langgraph tests/test_pregel.py tests/test_pregel_async.py
#
# AGBOSS_LG_DATABASES (default "sqlite postgres mysql") picks the databases; a server
# database's checkpoint tables are emptied before every test, so give it one of its own.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
checkout="${1:?usage: run.sh <langgraph-checkout> [pytest args...]}"
shift
tests_dir="$checkout/libs/langgraph/tests"
python="${PYTHON:-python}"
"$python" "$here/patch_conftest.py" "$tests_dir"
cd "$checkout/libs/langgraph"
# NO_DOCKER: LangGraph's own Postgres and Redis fixtures are left out.
export NO_DOCKER=true
status=0
for database in ${AGBOSS_LG_DATABASES:-sqlite postgres mysql}; do
    echo "== agboss_$database"
    "$python" -m pytest -q -p no:cacheprovider -o addopts="" -rfE -k "agboss_$database" "$@" || status=$?
done
exit "$status"
