"""A node frozen (SIGSTOP) just after a new engine connection reached it: the connection's
set-up by SQLAlchemy (its first-connect and on-connect questions, sent after the bounded
creator returned) must end within its bound in a typed error, not wait for the node to
wake. Found by the node-freeze scenario (docs/operations.md, "Losing a Galera node"): one
call waited 11 s for the thaw before its own statement bound began.

Node 2 of the test cluster is frozen, then thawed and waited for until the cluster is of
3 Synced nodes again (up to `REJOIN_BOUND_S`) and stays so for `SETTLE_S`: the freeze lasts
about the group's suspect timeout, and the node may be evicted, and leave service to
rejoin, seconds after its thaw."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import pytest
import sqlalchemy as sa

from agboss_sql._dialects import mysql
from agboss_sql.contracts.errors import StoreTimeoutError
from agboss_sql.lab.faults.fixture import POD_TIMEOUTS
from agboss_sql.lab.faults.galera import GaleraNodes
from agboss_sql.sql.connection import SqlConnection

HANG_BOUND_S = 40.0
"""Far past the checkout's bound (pool 3 s + connect 3 s + a statement 4.5 s): reaching it
means the call waited for the frozen node, which stays frozen until the test ends."""


async def test_a_node_frozen_during_a_new_connections_set_up_ends_typed(
    galera_urls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if len(galera_urls) != 3:
        pytest.skip("the node-loss tests need the 3-node test cluster (ready.sh)")
    nodes = GaleraNodes(galera_urls)
    if nodes.pid(2) is None:
        pytest.skip("node 2 is not a server of this checkout's cluster (AGBOSS_GALERA_DIR)")
    original = mysql.connect
    frozen: list[bool] = []

    async def connect_then_freeze(url: Any, timeouts: Any, *, autocommit: bool = True) -> Any:
        raw = await original(url, timeouts, autocommit=autocommit)
        if not autocommit and not frozen:  # the engine's connection, before its set-up
            nodes.signal(2, signal.SIGSTOP)
            frozen.append(True)
        return raw

    monkeypatch.setattr(mysql, "connect", connect_then_freeze)
    connection = SqlConnection(galera_urls[1], timeouts=POD_TIMEOUTS)
    try:

        async def one_transaction() -> None:
            async with connection.transaction() as tx:
                await connection.execute_on(tx, sa.text("SELECT 1"), {})

        with pytest.raises(StoreTimeoutError) as ended:
            await asyncio.wait_for(one_transaction(), HANG_BOUND_S)
        assert frozen, "the engine's connection was never opened"
        assert ended.value.what == "connect"
    finally:
        if frozen:
            nodes.signal(2, signal.SIGCONT)
        await connection.close()
        monkeypatch.undo()
        await asyncio.to_thread(nodes.restore, thawed=bool(frozen))
