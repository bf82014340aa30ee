"""The table of limits (`agboss_sql.contracts.limits.LIMITS`, docs/limits.md), walked on the
database under test: a value at each limit is stored and read back equal, the same value one
over is refused with the limit's typed error naming it, before any statement is sent.

Every error out of a store is an `AgbossError`: a text no database can store (a NUL
character, a lone surrogate) refused the same way everywhere before any statement,
arguments out of their choices typed, and a statement the database refuses in a trigger
wrapped (`StoreRefusedError`) with the driver's error as its cause.

The values at the limits are the widest each limit allows: four-byte characters in every
text (a MySQL `TEXT` column holds 65,535 bytes), control characters where a text is escaped
inside a JSON identity, and a JSON payload of quotes, which the MySQL driver's escaping
doubles on the wire (`max_allowed_packet`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from support.sql import refusing_trigger_sql, statements

from agboss_sql.contracts import (
    ApplicationContext,
    ExecutionContext,
    ExecutionLease,
    FencedEffectKey,
    StepRef,
    StoreClock,
    VirtualClock,
    fenced_effect_key_of,
)
from agboss_sql.contracts.errors import (
    AgbossError,
    InvalidFingerprintError,
    InvalidIdentifierError,
    InvalidNumberError,
    InvalidPayloadError,
    InvalidValueError,
    StoreRefusedError,
)
from agboss_sql.contracts.limits import (
    LIMITS,
    MAX_BUSINESS_KEY_LENGTH,
    MAX_CHANNEL_VERSION_LENGTH,
    MAX_CHECKPOINT_ID_LENGTH,
    MAX_CHECKPOINT_WRITE_BYTES,
    MAX_DURATION_MS,
    MAX_EFFECT_NAME_LENGTH,
    MAX_FINGERPRINT_LENGTH,
    MAX_IDEMPOTENCY_KEY_LENGTH,
    MAX_IDENTIFIER_LENGTH,
    MAX_INT32,
    MAX_INT64,
    MAX_OWNER_LENGTH,
    MAX_PAYLOAD_BYTES,
    MAX_REASON_LENGTH,
    MAX_SAVER_KEY_LENGTH,
    MAX_STATUS_LENGTH,
    MAX_STEP_NAME_LENGTH,
    MIN_MAX_ALLOWED_PACKET,
    Limit,
)
from agboss_sql.contracts.types import (
    AttemptRef,
    BudgetScope,
    ExecutionLeaseEvent,
    ExecutionSnapshot,
    LeaseEventKind,
    OutboundCallStatus,
    QueuedChild,
)
from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.checkpoint._layout import MAX_CHECKPOINT_ID, MAX_VERSION
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.costs import SqlCostLedgerRepository
from agboss_sql.sql.effects import SqlFencedEffectRepository
from agboss_sql.sql.events import SqlExecutionLeaseEventRepository
from agboss_sql.sql.history import SqlExecutionHistoryRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.mesh import SqlMeshRequestRepository
from agboss_sql.sql.outbound import SqlOutboundCallRepository
from agboss_sql.sql.queue import SqlChildExecutionQueueRepository
from agboss_sql.sql.records import SqlExecutionRecordRepository
from agboss_sql.sql.schema import execution_tree_keys, fenced_effect_results
from agboss_sql.sql.trees import SqlExecutionTreeRepository

START = 1_700_000_000_000
TENANT = "tenant-1"
WIDE = "\U0001f600"
"""A four-byte character (UTF-8): the most bytes a character takes in a column."""
APP = ApplicationContext("instance-1")


def wide(length: int) -> str:
    return WIDE * length


class Stores:
    """The stores of one instance on the database under test."""

    def __init__(self, sql: SqlConnection) -> None:
        self.sql = sql
        clock = VirtualClock(START)
        self.leases = SqlExecutionLeaseRepository(sql, StoreClock(clock), APP)
        self.effects = SqlFencedEffectRepository(sql, StoreClock(clock), APP)
        self.outbound = SqlOutboundCallRepository(sql, StoreClock(clock), APP)
        self.trees = SqlExecutionTreeRepository(sql, clock, APP)
        self.mesh = SqlMeshRequestRepository(sql, clock, APP)
        self.history = SqlExecutionHistoryRepository(sql, clock, APP)
        self.events = SqlExecutionLeaseEventRepository(sql, StoreClock(clock), APP)
        self.queue = SqlChildExecutionQueueRepository(sql, clock, APP)
        self.saver = SqlCheckpointSaver(sql)
        self.lease: ExecutionLease | None = None

    async def key(self, **changes: Any) -> FencedEffectKey:
        """A key of the lease of `tree-1` (taken at the first key, so a case's refusal sends
        nothing), with `changes` made by hand (a key `fenced_effect_key_of` would refuse to
        build)."""
        if self.lease is None:
            self.lease = await self.leases.acquire(TENANT, "tree-1", 60_000)
        lease = self.lease
        assert lease is not None
        step = StepRef("tree-1", "step-key", "step")
        ctx = ExecutionContext(TENANT, "tree-1", "tree-1", lease, step)
        key = fenced_effect_key_of(ctx, "charge", fingerprint="fp")
        return dataclasses.replace(key, **changes)

    async def effect(self, key: FencedEffectKey, value: Any = "done") -> Any:
        async def work(_tx: Any) -> Any:
            return value

        saved = await self.effects.save_result_if_absent(key, work)
        replayed = await self.effects.get_result(key)
        assert replayed is not None and replayed.value == saved.value
        return saved.value


@dataclass(frozen=True)
class Case:
    """A value at the limit, stored and read back (`at`), and one over it (`over`)."""

    at: Callable[[Stores], Awaitable[None]]
    over: Callable[[Stores], Awaitable[object]]


# --- one case per limit ---------------------------------------------------------------------


async def _identifier_at(s: Stores) -> None:
    ident = wide(MAX_IDENTIFIER_LENGTH)
    assert await s.trees.save_if_absent(ident, ident, ident, {"v": 1})
    assert await s.trees.get(ident, ident, ident) == {"v": 1}


async def _identifier_over(s: Stores) -> object:
    return await s.trees.save_if_absent(TENANT, "root", wide(MAX_IDENTIFIER_LENGTH + 1), 1)


async def _effect_name_at(s: Stores) -> None:
    name = "n" * MAX_EFFECT_NAME_LENGTH
    assert await s.effect(await s.key(name=name)) == "done"


async def _effect_name_over(s: Stores) -> object:
    return await s.effect(await s.key(name="n" * (MAX_EFFECT_NAME_LENGTH + 1)))


async def _business_key_at(s: Stores) -> None:
    key = await s.key(business_key=wide(MAX_BUSINESS_KEY_LENGTH))
    assert await s.effect(key) == "done"


async def _business_key_over(s: Stores) -> object:
    return await s.effect(await s.key(business_key=wide(MAX_BUSINESS_KEY_LENGTH + 1)))


def _step(idempotency_key: str = "step-key", name: str = "step") -> StepRef:
    return StepRef("tree-1", idempotency_key, name)


async def _idempotency_key_at(s: Stores) -> None:
    # Control characters: six characters each inside the effect's JSON identity.
    for text in ("\x01" * MAX_IDEMPOTENCY_KEY_LENGTH, wide(MAX_IDEMPOTENCY_KEY_LENGTH)):
        key = await s.key(step=_step(idempotency_key=text))
        assert await s.effect(key, text) == text
        stored = await s.effects.get_result(key)
        assert stored is not None and stored.replayed_from is None
        assert (await s.outbound.save_if_absent(key, {"intent": 1}, START)).created
        call = await s.outbound.get(key)
        assert call is not None and call.step.idempotency_key == text


async def _idempotency_key_over(s: Stores) -> object:
    return await s.effect(
        await s.key(step=_step(idempotency_key="k" * (MAX_IDEMPOTENCY_KEY_LENGTH + 1)))
    )


async def _step_name_at(s: Stores) -> None:
    key = await s.key(step=_step(name=wide(MAX_STEP_NAME_LENGTH)))
    assert await s.effect(key) == "done"
    other = dataclasses.replace(key, step=_step(name="another"))
    replay = await s.effects.get_result(other)
    assert replay is not None and replay.replayed_from == key.step


async def _step_name_over(s: Stores) -> object:
    return await s.effect(await s.key(step=_step(name=wide(MAX_STEP_NAME_LENGTH + 1))))


async def _fingerprint_at(s: Stores) -> None:
    fingerprint = wide(MAX_FINGERPRINT_LENGTH)
    key = await s.key(business_key="b-1", fingerprint=fingerprint)
    assert await s.effect(key) == "done"
    saved = await s.mesh.save_if_absent("req-1", TENANT, fingerprint, START)
    assert saved.created
    again = await s.mesh.get(TENANT, "req-1")
    assert again is not None and again.fingerprint == fingerprint


async def _fingerprint_over(s: Stores) -> object:
    return await s.mesh.save_if_absent("req-1", TENANT, wide(MAX_FINGERPRINT_LENGTH + 1), START)


async def _owner_at(s: Stores) -> None:
    key = await s.key()
    call = (await s.outbound.save_if_absent(key, {"charge": 1}, START)).call
    expected = AttemptRef(OutboundCallStatus.PENDING, call.attempt, call.attempt_owner)
    owner = wide(MAX_OWNER_LENGTH)
    assert await s.outbound.mark_pending(key, expected, owner)
    stored = await s.outbound.get(key)
    assert stored is not None and stored.attempt_owner == owner


async def _owner_over(s: Stores) -> object:
    key = await s.key()
    expected = AttemptRef(OutboundCallStatus.PENDING, 0, "owner")
    return await s.outbound.mark_pending(key, expected, wide(MAX_OWNER_LENGTH + 1))


def _event(reason: str) -> ExecutionLeaseEvent:
    return ExecutionLeaseEvent(
        TENANT, "tree-1", "instance-1", 1, LeaseEventKind.LOST, START, None, reason
    )


async def _reason_at(s: Stores) -> None:
    await s.events.save(_event(wide(MAX_REASON_LENGTH)))
    assert [e.reason for e in await s.events.list(TENANT, "tree-1")] == [wide(MAX_REASON_LENGTH)]


async def _reason_over(s: Stores) -> object:
    return await s.events.save(_event(wide(MAX_REASON_LENGTH + 1)))


def _snapshot(status: str = "done", finished_at: int = START) -> ExecutionSnapshot:
    return ExecutionSnapshot(TENANT, "run-1", "flow", status, START, finished_at, {"r": 1})


async def _status_at(s: Stores) -> None:
    status = wide(MAX_STATUS_LENGTH)
    await s.history.save(_snapshot(status))
    stored = await s.history.get(TENANT, "run-1")
    assert stored is not None and stored.status == status


async def _status_over(s: Stores) -> object:
    return await s.history.save(_snapshot(wide(MAX_STATUS_LENGTH + 1)))


def _config(thread: str, ns: str = "", checkpoint_id: str | None = None) -> Any:
    configurable = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


async def _put(
    s: Stores,
    thread: str,
    *,
    ns: str = "",
    checkpoint_id: str | None = None,
    version: str = "1",
    value: Any = None,
) -> Any:
    checkpoint: Checkpoint = empty_checkpoint()
    if checkpoint_id is not None:
        checkpoint["id"] = checkpoint_id
    checkpoint["channel_values"] = {"ch": value if value is not None else ["v"]}
    checkpoint["channel_versions"] = {"ch": version}
    stored = await s.saver.aput(
        _config(thread, ns), checkpoint, {"source": "loop", "step": 0}, {"ch": version}
    )
    found = await s.saver.aget_tuple(stored)
    assert found is not None
    assert found.checkpoint["channel_values"] == checkpoint["channel_values"]
    assert found.config["configurable"]["thread_id"] == thread
    assert found.config["configurable"]["checkpoint_ns"] == ns
    return found


async def _saver_key_at(s: Stores) -> None:
    text = wide(MAX_SAVER_KEY_LENGTH)
    await _put(s, text, ns=text)


async def _saver_key_over(s: Stores) -> object:
    return await _put(s, wide(MAX_SAVER_KEY_LENGTH + 1))


async def _checkpoint_id_at(s: Stores) -> None:
    checkpoint_id = "c" * MAX_CHECKPOINT_ID_LENGTH
    found = await _put(s, "thread-1", checkpoint_id=checkpoint_id)
    assert found.config["configurable"]["checkpoint_id"] == checkpoint_id


async def _checkpoint_id_over(s: Stores) -> object:
    return await _put(s, "thread-1", checkpoint_id="c" * (MAX_CHECKPOINT_ID_LENGTH + 1))


async def _version_at(s: Stores) -> None:
    version = "9" * MAX_CHANNEL_VERSION_LENGTH
    found = await _put(s, "thread-1", version=version)
    assert found.checkpoint["channel_versions"] == {"ch": version}


async def _version_over(s: Stores) -> object:
    return await _put(s, "thread-1", version="9" * (MAX_CHANNEL_VERSION_LENGTH + 1))


# JSON text '"' + '\\"' * n + '"': 2 + 2n bytes, every one of which the MySQL driver escapes.
_QUOTES_AT_LIMIT = '"' * ((MAX_PAYLOAD_BYTES - 2) // 2)


async def _payload_at(s: Stores) -> None:
    assert await s.effect(await s.key(), _QUOTES_AT_LIMIT) == _QUOTES_AT_LIMIT
    assert await s.trees.save_if_absent(TENANT, "root", "k", _QUOTES_AT_LIMIT)
    assert await s.trees.get(TENANT, "root", "k") == _QUOTES_AT_LIMIT


async def _payload_over(s: Stores) -> object:
    # A fenced effect's result is the work's, known only inside its transaction:
    # test_a_result_over_the_payload_limit_is_refused_and_rolled_back.
    return await s.trees.save_if_absent(TENANT, "root", "k2", _QUOTES_AT_LIMIT + '"')


# Bytes the MySQL driver escapes (NUL, quotes, backslash): twice as many on the wire.
_ESCAPED = b"\x00'\"\\"


async def _write_bytes_at(s: Stores) -> None:
    # The value and the checkpoint's body and metadata (a few hundred bytes) together.
    value = _ESCAPED * ((MAX_CHECKPOINT_WRITE_BYTES - 4096) // len(_ESCAPED))
    await _put(s, "thread-1", value=value)


async def _write_bytes_over(s: Stores) -> object:
    value = _ESCAPED * (MAX_CHECKPOINT_WRITE_BYTES // len(_ESCAPED))
    return await _put(s, "thread-1", value=value)


async def _int64_at(s: Stores) -> None:
    await s.history.save(_snapshot(finished_at=MAX_INT64))
    stored = await s.history.get(TENANT, "run-1")
    assert stored is not None and stored.finished_at == MAX_INT64


async def _int64_over(s: Stores) -> object:
    return await s.history.save(_snapshot(finished_at=MAX_INT64 + 1))


def _child(depth: int) -> QueuedChild:
    return QueuedChild(TENANT, "root", "parent", "child-1", depth, {"p": 1})


async def _int32_at(s: Stores) -> None:
    await s.queue.enqueue(_child(MAX_INT32))
    assert [c.depth for c in await s.queue.children(TENANT, "parent")] == [MAX_INT32]


async def _int32_over(s: Stores) -> object:
    return await s.queue.enqueue(_child(MAX_INT32 + 1))


async def _duration_at(s: Stores) -> None:
    lease = await s.leases.acquire(TENANT, "long", MAX_DURATION_MS)
    assert lease is not None
    assert await s.leases.renew(lease, MAX_DURATION_MS) is not None
    assert await s.leases.acquire(TENANT, "long", 1_000) is None  # still held


async def _duration_over(s: Stores) -> object:
    return await s.leases.acquire(TENANT, "long", MAX_DURATION_MS + 1)


CASES: dict[str, Case] = {
    "MAX_IDENTIFIER_LENGTH": Case(_identifier_at, _identifier_over),
    "MAX_EFFECT_NAME_LENGTH": Case(_effect_name_at, _effect_name_over),
    "MAX_BUSINESS_KEY_LENGTH": Case(_business_key_at, _business_key_over),
    "MAX_IDEMPOTENCY_KEY_LENGTH": Case(_idempotency_key_at, _idempotency_key_over),
    "MAX_STEP_NAME_LENGTH": Case(_step_name_at, _step_name_over),
    "MAX_FINGERPRINT_LENGTH": Case(_fingerprint_at, _fingerprint_over),
    "MAX_OWNER_LENGTH": Case(_owner_at, _owner_over),
    "MAX_REASON_LENGTH": Case(_reason_at, _reason_over),
    "MAX_STATUS_LENGTH": Case(_status_at, _status_over),
    "MAX_SAVER_KEY_LENGTH": Case(_saver_key_at, _saver_key_over),
    "MAX_CHECKPOINT_ID_LENGTH": Case(_checkpoint_id_at, _checkpoint_id_over),
    "MAX_CHANNEL_VERSION_LENGTH": Case(_version_at, _version_over),
    "MAX_PAYLOAD_BYTES": Case(_payload_at, _payload_over),
    "MAX_CHECKPOINT_WRITE_BYTES": Case(_write_bytes_at, _write_bytes_over),
    "MAX_INT64": Case(_int64_at, _int64_over),
    "MAX_INT32": Case(_int32_at, _int32_over),
    "MAX_DURATION_MS": Case(_duration_at, _duration_over),
}
"""Every limit a value can be over; MIN_MAX_ALLOWED_PACKET, a server's setting, is
tests/stores/test_limits_server.py's."""

WALKED = [limit for limit in LIMITS if limit.name != "MIN_MAX_ALLOWED_PACKET"]


def test_every_limit_has_its_case() -> None:
    assert set(CASES) == {limit.name for limit in WALKED}
    assert MIN_MAX_ALLOWED_PACKET >= 2 * MAX_PAYLOAD_BYTES
    # The saver's key columns are the widths the table gives.
    assert (MAX_CHECKPOINT_ID, MAX_VERSION) == (
        MAX_CHECKPOINT_ID_LENGTH,
        MAX_CHANNEL_VERSION_LENGTH,
    )


DOCS = Path(__file__).resolve().parents[2] / "docs" / "limits.md"


def _row(limit: Limit) -> str:
    return (
        f"| `{limit.name}` | {limit.maximum:,} | {limit.unit} | {limit.bounds} "
        f"| `{limit.error.__name__}` |"
    )


def test_the_docs_give_the_table_of_limits_as_the_code_keeps_it() -> None:
    """docs/limits.md has one table of limits: a row per limit, in the table's order, with
    its maximum, what it bounds and its typed error, exactly as `LIMITS` has them."""
    text = DOCS.read_text()
    section = text.split("## Limits of what a store keeps", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows == [_row(limit) for limit in LIMITS]


@pytest.mark.parametrize("limit", WALKED, ids=lambda limit: limit.name)
async def test_a_value_at_the_limit_is_kept_and_one_over_is_refused_before_any_statement(
    sql: SqlConnection, limit: Limit
) -> None:
    case = CASES[limit.name]
    stores = Stores(sql)
    await case.at(stores)
    with statements(sql) as sent, pytest.raises(limit.error) as refused:
        await case.over(stores)
    assert sent == []
    assert refused.value.facts.get("limit") == limit.name
    assert limit.name in str(refused.value)


async def test_a_result_over_the_payload_limit_is_refused_and_rolled_back(
    sql: SqlConnection,
) -> None:
    """The issue's case: a result of exactly 8 MiB of JSON (twice the limit now) was refused
    by MariaDB with a raw `max_allowed_packet` error; it is `InvalidPayloadError` on every
    database, nothing of the effect stored, and the key still runs its work once."""
    stores = Stores(sql)
    key = await stores.key(step=_step(idempotency_key="big"))
    with pytest.raises(InvalidPayloadError, match="MAX_PAYLOAD_BYTES"):
        await stores.effect(key, '"' * (8 * 1024 * 1024 // 2 - 1))
    assert await stores.effects.get_result(key) is None
    assert await stores.effect(key, "small") == "small"


# --- every error typed -----------------------------------------------------------------

Call = Callable[[Stores], Awaitable[object]]


async def _outbound_owner(s: Stores, owner: str) -> object:
    key = await s.key()
    return await s.outbound.mark_pending(
        key, AttemptRef(OutboundCallStatus.PENDING, 0, "owner"), owner
    )


async def _put_metadata(s: Stores, config: Any, metadata: Any) -> object:
    checkpoint = empty_checkpoint()
    return await s.saver.aput(config, checkpoint, metadata, {})


async def _listed(s: Stores, filter: Any, limit: Any = None) -> object:
    return [found async for found in s.saver.alist(_config("thread-1"), filter=filter, limit=limit)]


async def _put_writes(s: Stores, task_path: str) -> object:
    config = _config("thread-1", checkpoint_id="c-1")
    return await s.saver.aput_writes(config, [("ch", 1)], "task-1", task_path)


def _records(s: Stores) -> SqlExecutionRecordRepository:
    return SqlExecutionRecordRepository(s.sql, VirtualClock(START), APP)


def _costs(s: Stores) -> SqlCostLedgerRepository:
    return SqlCostLedgerRepository(s.sql, VirtualClock(START), APP)


UNSTORABLE: dict[str, tuple[type[AgbossError], Call]] = {
    "a NUL in a tree key prefix": (InvalidValueError, lambda s: s.trees.list(TENANT, "r", "a\x00")),
    "a lone surrogate in a tree key prefix": (
        InvalidValueError,
        lambda s: s.trees.list(TENANT, "r", "a\ud800"),
    ),
    "a NUL in a history status": (InvalidValueError, lambda s: s.history.save(_snapshot("d\x00"))),
    "a lone surrogate in a history status": (
        InvalidValueError,
        lambda s: s.history.save(_snapshot("d\udc00")),
    ),
    "a NUL in an attempt owner": (InvalidValueError, lambda s: _outbound_owner(s, "o\x00")),
    "a lone surrogate in an attempt owner": (
        InvalidValueError,
        lambda s: _outbound_owner(s, "o\ud800"),
    ),
    "a NUL in a lease event's reason": (InvalidValueError, lambda s: s.events.save(_event("\x00"))),
    "a NUL in a thread id": (
        InvalidIdentifierError,
        lambda s: _put_metadata(s, _config("t\x00"), {"source": "loop"}),
    ),
    "a NUL in a task path": (InvalidIdentifierError, lambda s: _put_writes(s, "p\x00")),
    "a lone surrogate in a checkpoint's metadata": (
        InvalidPayloadError,
        lambda s: _put_metadata(s, _config("thread-1"), {"source": "\ud800"}),
    ),
    "a NUL in a mesh fingerprint": (
        InvalidFingerprintError,
        lambda s: s.mesh.save_if_absent("req-1", TENANT, "f\x00", START),
    ),
    "a NUL in a checkpoint metadata filter": (
        InvalidValueError,
        lambda s: _listed(s, {"source": "a\x00"}),
    ),
    "a lone surrogate in a checkpoint's run id": (
        InvalidPayloadError,
        lambda s: _put_metadata(s, _config("thread-1"), {"run_id": "r\ud800"}),
    ),
    "a list limit that is not a whole number": (
        InvalidNumberError,
        lambda s: _listed(s, None, 1.5),
    ),
    "an unknown record status": (
        InvalidValueError,
        lambda s: _records(s).find_by_status("bogus", 1),  # type: ignore[arg-type]
    ),
    "an unknown budget scope": (
        InvalidValueError,
        lambda s: _costs(s).total("bogus", "k", tenant_id=TENANT),  # type: ignore[arg-type]
    ),
    "a limit that is not a whole number": (
        InvalidNumberError,
        lambda s: s.history.list(TENANT, limit="10"),  # type: ignore[arg-type]
    ),
    "a lease of zero ms": (InvalidNumberError, lambda s: s.leases.acquire(TENANT, "e", 0)),
    "a budget scope of the execution without its tenant": (
        InvalidIdentifierError,
        lambda s: _costs(s).total(BudgetScope.EXECUTION, "k"),
    ),
}


@pytest.mark.parametrize("what", list(UNSTORABLE))
async def test_an_input_no_database_stores_is_refused_typed_before_any_statement(
    sql: SqlConnection, what: str
) -> None:
    error, call = UNSTORABLE[what]
    stores = Stores(sql)
    await stores.key()  # the lease the outbound cases fence on, taken first
    with statements(sql) as sent, pytest.raises(error) as refused:
        await call(stores)
    assert isinstance(refused.value, AgbossError)
    assert sent == []


async def _with_refusing_trigger(
    sql: SqlConnection, table: str, call: Callable[[], Awaitable[object]]
) -> StoreRefusedError:
    create, drop = refusing_trigger_sql(sql, table, "refused by a trigger")
    for statement in create:
        await sql.execute(statement)
    try:
        with pytest.raises(StoreRefusedError) as refused:
            await call()
    finally:
        for statement in drop:
            await sql.execute(statement)
    return refused.value


async def test_a_trigger_refusing_a_fenced_effect_is_a_typed_error_with_the_drivers_cause(
    sql: SqlConnection,
) -> None:
    stores = Stores(sql)
    key = await stores.key(step=_step(idempotency_key="refused"))
    ran: list[int] = []

    async def work(_tx: Any) -> str:
        ran.append(1)
        return "done"

    error = await _with_refusing_trigger(
        sql,
        fenced_effect_results.name,
        lambda: stores.effects.save_result_if_absent(key, work),
    )
    assert error.code == "store.refused"
    assert "refused by a trigger" in str(error)
    driver = sql.dialect.driver_error(error.orig) if error.orig is not None else None
    assert driver is error.orig and driver is not None
    assert error.__cause__ is error.orig
    assert ran == []  # the claim is refused before the work runs
    assert await stores.effects.get_result(key) is None
    # Without the trigger the same key runs its work once.
    assert (await stores.effects.save_result_if_absent(key, work)).value == "done"
    assert ran == [1]


async def test_a_trigger_refusing_an_autocommit_write_is_a_typed_error_with_the_drivers_cause(
    sql: SqlConnection,
) -> None:
    stores = Stores(sql)
    error = await _with_refusing_trigger(
        sql,
        execution_tree_keys.name,
        lambda: stores.trees.save_if_absent(TENANT, "root", "k", {"v": 1}),
    )
    assert error.orig is not None and sql.dialect.driver_error(error.orig) is error.orig
    assert error.__cause__ is not None
    assert await stores.trees.get(TENANT, "root", "k") is None
