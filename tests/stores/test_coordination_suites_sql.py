"""The coordination contract suites, run case by case on the SQL stores.

Each case starts on an emptied schema; each of its instances has its own `SqlConnection`
to the database under test, so the races are real concurrent connections. A store whose
module does not import is skipped, saying why.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from agboss_sql.contracts.stores import CONTRACTS
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.testing.contracts import (
    child_queue,
    cost_ledger,
    execution_history,
    execution_record,
    execution_tree,
    mesh_request,
    paused_execution,
    rate_limit,
)
from agboss_sql.testing.contracts._case import Case, CaseContext, Seam, StoreFactory

SUITES = [
    child_queue,
    rate_limit,
    execution_record,
    execution_tree,
    mesh_request,
    paused_execution,
    cost_ledger,
    execution_history,
]

MODULES = {
    "child_queue": "agboss_sql.sql.queue",
    "rate_limit": "agboss_sql.sql.rate_limits",
    "execution_record": "agboss_sql.sql.records",
    "execution_tree": "agboss_sql.sql.trees",
    "mesh_request": "agboss_sql.sql.mesh",
    "paused_execution": "agboss_sql.sql.pauses",
    "cost_ledger": "agboss_sql.sql.costs",
    "execution_history": "agboss_sql.sql.history",
}


def _store_class(contract: str) -> tuple[type[Any] | None, str]:
    """The module's concrete store of the contract, or `None` and why not."""
    name = MODULES[contract]
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # a store still being written: skip its cases, say why
        return None, f"{name} does not import: {exc!r}"
    found = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, CONTRACTS[contract])
        and value.__module__ == name
        and not inspect.isabstract(value)
    ]
    if len(found) != 1:
        return None, f"{name} defines {len(found)} concrete {CONTRACTS[contract].__name__}s"
    return found[0], ""


STORE_CLASSES = {contract: _store_class(contract) for contract in MODULES}
CASES = [case for suite in SUITES for case in suite.cases()]


@pytest.mark.database
@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case.contract}: {case.name}")
async def test_case(
    case: Case, sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    store_class, why = STORE_CLASSES[case.contract]
    if store_class is None:
        pytest.skip(why)
    # `sql` emptied the schema; every instance of the case gets a connection of its own.
    connections: dict[str, SqlConnection] = {}

    def instance(seam: Seam) -> Any:
        instance_id = seam.application.instance_id
        connection = connections.get(instance_id)
        if connection is None:
            connection = connections[instance_id] = new_connection()
        # These stores run on the application's clock (the case's virtual clock).
        return store_class(connection, seam.clock, seam.application)

    ctx = CaseContext({case.contract: StoreFactory(instance=instance)})
    try:
        await case.run(ctx)
    finally:
        await ctx.close()
