"""`SqlExecutionLeaseEventRepository` keeps the lease log exactly as saved (docs/contracts.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from agboss_sql.contracts import (
    ApplicationContext,
    ExecutionLeaseEvent,
    InvalidIdentifierError,
    LeaseEventKind,
    LeaseHolder,
    StoreClock,
    VirtualClock,
)
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.events import SqlExecutionLeaseEventRepository

TENANT = "tenant-1"
AT = 1_700_000_000_000


def _log(sql: SqlConnection) -> SqlExecutionLeaseEventRepository:
    return SqlExecutionLeaseEventRepository(sql, StoreClock(), ApplicationContext("instance-1"))


def _event(
    kind: LeaseEventKind = LeaseEventKind.ACQUIRED,
    *,
    execution: str = "tree-1",
    epoch: int = 1,
    at: int = AT,
    taken_over_from: LeaseHolder | None = None,
    reason: str | None = None,
    tenant: str = TENANT,
    instance: str = "instance-1",
) -> ExecutionLeaseEvent:
    return ExecutionLeaseEvent(
        tenant, execution, instance, epoch, kind, at, taken_over_from, reason
    )


async def test_every_field_of_every_kind_is_read_back_exactly(sql: SqlConnection) -> None:
    log = _log(sql)
    saved = [
        _event(
            kind,
            epoch=i + 1,
            at=AT + i,
            taken_over_from=LeaseHolder(f"instance-{i}", i) if i % 2 else None,
            reason=None if i % 3 == 0 else f"reason {i}: ünïcödé, 'quotes', \"more\"",
            instance=f"instance-{i % 3}",
        )
        for i, kind in enumerate(LeaseEventKind)
    ]
    for event in saved:
        await log.save(event)
    listed = await log.list(TENANT, "tree-1")
    assert listed == saved
    for event in listed:
        assert type(event.kind) is LeaseEventKind
        assert type(event.lease_epoch) is int and type(event.at) is int


async def test_edge_values_survive(sql: SqlConnection) -> None:
    log = _log(sql)
    saved = [
        _event(reason="", at=0, epoch=2**62, taken_over_from=LeaseHolder("x" * 255, 2**62 - 1)),
        _event(LeaseEventKind.LOST, reason="r" * 10_000, execution="e" * 255, tenant="t" * 255),
        _event(LeaseEventKind.TAKEN_OVER, taken_over_from=LeaseHolder("instance-1", 0)),
    ]
    for event in saved:
        await log.save(event)
    assert await log.list(TENANT, "tree-1") == [saved[0], saved[2]]
    assert await log.list("t" * 255, "e" * 255) == [saved[1]]


async def test_list_is_in_save_order_per_execution_and_tenant(sql: SqlConnection) -> None:
    log = _log(sql)
    # Times out of order: save order is what counts, not the events' times.
    one = [_event(at=AT + 100 - i, epoch=i + 1) for i in range(5)]
    for i, event in enumerate(one):
        await log.save(event)
        await log.save(_event(execution="tree-2", epoch=i + 1))
        await log.save(_event(tenant="tenant-2", epoch=i + 1))
    assert await log.list(TENANT, "tree-1") == one
    assert len(await log.list(TENANT, "tree-2")) == 5
    assert len(await log.list("tenant-2", "tree-1")) == 5
    assert await log.list(TENANT, "tree-unknown") == []


async def test_recent_is_newest_first_across_executions(sql: SqlConnection) -> None:
    log = _log(sql)
    saved = [_event(execution=f"tree-{i % 3}", epoch=i + 1, at=AT - i) for i in range(7)]
    for event in saved:
        await log.save(event)
    assert await log.recent(3) == saved[::-1][:3]
    assert await log.recent(100) == saved[::-1]
    assert await log.recent(0) == []


async def test_each_operation_is_one_statement(sql: SqlConnection) -> None:
    sent: list[str] = []
    log = _log(sql)
    remove = sql.add_statement_listener(lambda statement, _params: sent.append(statement))
    await log.save(_event())
    assert len(sent) == 1 and sent[0].lstrip().upper().startswith("INSERT")
    sent.clear()
    await log.list(TENANT, "tree-1")
    assert len(sent) == 1
    sent.clear()
    await log.recent(5)
    assert len(sent) == 1
    sent.clear()
    await log.recent(0)
    assert sent == []
    remove()


async def test_concurrent_saves_from_several_instances_all_land(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    async def instance(i: int) -> None:
        log = _log(new_connection())
        for n in range(1, 5):
            await log.save(_event(instance=f"instance-{i}", epoch=n))

    await asyncio.gather(*(instance(i) for i in range(5)))
    listed = await _log(sql).list(TENANT, "tree-1")
    assert sorted((e.instance_id, e.lease_epoch) for e in listed) == sorted(
        (f"instance-{i}", n) for i in range(5) for n in range(1, 5)
    )
    # Each instance's saves, one after the other, keep their order.
    for i in range(5):
        assert [e.lease_epoch for e in listed if e.instance_id == f"instance-{i}"] == [1, 2, 3, 4]


async def test_the_constructor_takes_the_uniform_three_or_the_connection_alone(
    sql: SqlConnection,
) -> None:
    alone = SqlExecutionLeaseEventRepository(sql)
    uniform = SqlExecutionLeaseEventRepository(
        sql, StoreClock(VirtualClock()), ApplicationContext("i")
    )
    await alone.save(_event())
    assert await uniform.list(TENANT, "tree-1") == [_event()]
    assert alone.backend == sql.backend
    await alone.ping()


@pytest.mark.parametrize(
    "bad",
    [
        _event(tenant=""),
        _event(execution="x" * 256),
        _event(instance=""),
        _event(taken_over_from=LeaseHolder("", 1)),
        _event(epoch=True),
        _event(at="now"),  # type: ignore[arg-type]
        _event(kind="stolen"),  # type: ignore[arg-type]
        _event(reason=7),  # type: ignore[arg-type]
    ],
)
async def test_an_event_the_log_cannot_keep_exactly_is_refused_before_any_statement(
    sql: SqlConnection, bad: ExecutionLeaseEvent
) -> None:
    sent: list[str] = []
    remove = sql.add_statement_listener(lambda statement, _params: sent.append(statement))
    with pytest.raises((InvalidIdentifierError, ValueError, TypeError)):
        await _log(sql).save(bad)
    remove()
    assert sent == []


async def test_arguments_are_checked(sql: SqlConnection) -> None:
    log = _log(sql)
    with pytest.raises(TypeError):
        await log.save("acquired")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await log.recent(-1)
    with pytest.raises(ValueError):
        await log.recent(True)
    with pytest.raises(InvalidIdentifierError):
        await log.list("", "tree-1")
