"""What the SQL fenced effect shows beyond its contract cases, on the database under test:
the rows and marks it stores, the refusal reasons, the transaction handed to the work,
retries, cancellation, races over real connections and the statements it sends.

The promises of `FencedEffectRepository` (docs/contracts.md) are the `fenced_effect` contract
cases, run once on the SQL set (tests/stores/test_conformance_sql.py).

Races use separate `SqlConnection`s (separate pools, as separate instances).
Statement counts are read from what is really sent: the store's own statements
through the connection's listener, the transaction's BEGIN/COMMIT/ROLLBACK and
the work's statements through SQLAlchemy's engine and pool events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection
from support.capabilities import (
    conditional_upsert_returns_row,
    driver_sends_begin,
    pool_reset_sends_rollback,
    transaction_sends_begin,
)
from support.drivers import deadlock_error, lock_timeout_error

from agboss_sql.contracts import (
    ApplicationContext,
    CommitOutcomeUnknownError,
    CorruptStoredRowError,
    ExecutionContext,
    ExecutionFencedError,
    ExecutionLease,
    FencedEffectKey,
    FencedEffectResult,
    IdempotencyKeyConflictError,
    InvalidBusinessKeyError,
    InvalidFencedEffectNameError,
    InvalidIdentifierError,
    LeaseState,
    StepRef,
    StoreClock,
    StoreTimeoutError,
    StoreUnavailableError,
    VirtualClock,
    fenced_effect_key_of,
    fenced_key_identity_of,
)
from agboss_sql.lab.business import committed_business_rows, insert_business_row
from agboss_sql.sql._base import identity_hash
from agboss_sql.sql._effect_connection import EffectTransactionEndedError
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.effects import SqlFencedEffectRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.outbound import SqlOutboundCallRepository
from agboss_sql.sql.schema import execution_leases, fenced_effect_results
from agboss_sql.sql.timeouts import Timeouts

START = 1_700_000_000_000
LEASE_MS = 30_000
TENANT = "tenant-1"


class Cluster:
    """Lease and effect stores of several instances on the database under test."""

    def __init__(self, sql: SqlConnection, clock: VirtualClock) -> None:
        self.sql = sql
        self.clock = clock
        self.store_clock = StoreClock(clock)

    def leases(
        self,
        instance: int = 1,
        connection: SqlConnection | None = None,
        store_clock: StoreClock | None = None,
    ) -> SqlExecutionLeaseRepository:
        return SqlExecutionLeaseRepository(
            connection or self.sql,
            store_clock or self.store_clock,
            ApplicationContext(f"instance-{instance}"),
        )

    def effects(
        self,
        instance: int = 1,
        connection: SqlConnection | None = None,
        store_clock: StoreClock | None = None,
    ) -> SqlFencedEffectRepository:
        return SqlFencedEffectRepository(
            connection or self.sql,
            store_clock or self.store_clock,
            ApplicationContext(f"instance-{instance}"),
        )

    async def acquire(self, instance: int = 1, execution: str = "tree-1") -> ExecutionLease:
        lease = await self.leases(instance).acquire(TENANT, execution, LEASE_MS)
        assert lease is not None
        return lease

    async def mark(self, execution: str = "tree-1", tenant: str = TENANT) -> int | None:
        """The scope's high-water mark (the lease row's fence_token)."""
        result = await self.sql.execute(
            sa.select(execution_leases.c.fence_token).where(
                execution_leases.c.tenant_id == tenant,
                execution_leases.c.execution_id == execution,
            )
        )
        value = result.scalar()
        return None if value is None else int(value)

    async def results(self) -> list[Any]:
        R = fenced_effect_results
        result = await self.sql.execute(
            sa.select(
                R.c.identity_hash,
                R.c.identity,
                R.c.result,
                R.c.fingerprint,
                R.c.step_execution_id,
                R.c.step_idempotency_key,
                R.c.step_name,
                R.c.lease_execution_id,
                R.c.token,
                R.c.scope_key,
                R.c.business_key,
                R.c.stored_at,
            )
        )
        return result.rows

    async def rows(self) -> list[str]:
        return await committed_business_rows(self.sql)

    async def nothing_written(self, *executions: str) -> bool:
        marks = [await self.mark(execution) for execution in executions or ("tree-1",)]
        return (
            await self.rows() == []
            and await self.results() == []
            and all(mark in (None, 0) for mark in marks)
        )


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(START)


@pytest.fixture
def cluster(sql: SqlConnection, clock: VirtualClock) -> Cluster:
    return Cluster(sql, clock)


def key_of(
    lease: ExecutionLease,
    name: str = "charge",
    *,
    step_key: str = "step-1",
    business_key: str | None = None,
    fingerprint: str | None = None,
) -> FencedEffectKey:
    ctx = ExecutionContext(
        tenant_id=lease.tenant_id,
        root_execution_id=lease.execution_id,
        execution_id=lease.execution_id,
        lease=lease,
        step=StepRef(lease.execution_id, step_key, "charge-step"),
    )
    return fenced_effect_key_of(ctx, name, business_key=business_key, fingerprint=fingerprint)


class Charge:
    """A work that writes one business row in the effect's transaction; counts its runs."""

    def __init__(self, receipt: Any = None, row: str = "charged") -> None:
        self.runs = 0
        self.receipt = {"receipt": "r-1"} if receipt is None else receipt
        self.row = row

    async def __call__(self, tx: AsyncConnection) -> Any:
        self.runs += 1
        await insert_business_row(tx, self.row)
        return self.receipt


class RoundTrips:
    """What the connection really sends, in order: the store's statements (labelled by
    what they do), the work's statements ("work") and the transaction's ends."""

    def __init__(self, sql: SqlConnection) -> None:
        self.sql = sql
        self.sent: list[str] = []

    def _ours(self, statement: str, _params: Any) -> None:
        text = " ".join(statement.split()).upper()
        if text.startswith(("BEGIN", "COMMIT", "ROLLBACK")):
            self.sent.append(text.split()[0])
        elif "UPDATE AGBOSS_EXECUTION_LEASES" in text:
            self.sent.append("fence")
        elif "FROM AGBOSS_EXECUTION_LEASES" in text:
            self.sent.append("diagnose")
        elif text.startswith("INSERT INTO AGBOSS_FENCED_EFFECT_RESULTS") or (
            "INSERT INTO AGBOSS_FENCED_EFFECT_RESULTS" in text
        ):
            self.sent.append("claim")
        elif "UPDATE AGBOSS_FENCED_EFFECT_RESULTS" in text:
            self.sent.append("store")
        elif "FROM AGBOSS_FENCED_EFFECT_RESULTS" in text:
            self.sent.append("read")
        else:
            self.sent.append(text[:40])

    @contextmanager
    def counting(self) -> Iterator[list[str]]:
        sql = self.sql
        # The engine under `transaction()`'s connections: on SQLite the inline work
        # connection's, whose BEGIN IMMEDIATE/COMMIT/ROLLBACK the statement listener sees.
        engine = sql.transaction_engine
        sends_begin = driver_sends_begin(sql)
        resets_with_rollback = pool_reset_sends_rollback(sql)

        def on_begin(_conn: Any) -> None:
            # psycopg opens the transaction with its own BEGIN before the first statement;
            # aiomysql runs with autocommit off and sends none.
            if sends_begin:
                self.sent.append("BEGIN")

        def on_cursor(*args: Any) -> None:
            statement = " ".join(str(args[2]).split()).upper()
            self.sent.append("BEGIN" if statement.startswith("BEGIN") else "work")

        def on_commit(_conn: Any) -> None:
            self.sent.append("COMMIT")

        def on_rollback(_conn: Any) -> None:
            self.sent.append("ROLLBACK")

        def on_reset(_dbapi: Any, _record: Any, _state: Any) -> None:
            # The pool's reset-on-return rollback: aiomysql sends it always; psycopg skips it
            # on an idle connection and SQLite's is no round trip.
            if resets_with_rollback:
                self.sent.append("ROLLBACK(pool)")

        hooks: list[tuple[Any, str, Any]] = [(engine, "before_cursor_execute", on_cursor)]
        if not sql.capabilities.inline:
            hooks += [
                (engine, "begin", on_begin),
                (engine, "commit", on_commit),
                (engine, "rollback", on_rollback),
                (engine.pool, "reset", on_reset),
            ]
        for target, name, fn in hooks:
            event.listen(target, name, fn)
        remove = sql.add_statement_listener(self._ours)
        try:
            yield self.sent
        finally:
            remove()
            for target, name, fn in hooks:
                event.remove(target, name, fn)


# writes and replays


async def test_the_first_call_runs_the_work_and_commits_its_rows(cluster: Cluster) -> None:
    lease = await cluster.acquire()
    key = key_of(lease)
    charge = Charge()
    result = await cluster.effects(1).save_result_if_absent(key, charge)
    assert result == FencedEffectResult({"receipt": "r-1"}, False, None)
    assert charge.runs == 1
    assert await cluster.rows() == ["charged"]
    assert await cluster.mark() == 1
    [row] = await cluster.results()
    identity = fenced_key_identity_of(key)
    assert tuple(row) == (
        identity_hash(identity),
        identity,
        '{"receipt":"r-1"}',
        None,
        "tree-1",
        "step-1",
        "charge-step",
        "tree-1",
        1,
        key.scope_key,
        None,
        START,
    )


async def test_a_second_call_of_the_same_step_replays_the_stored_result(
    cluster: Cluster,
) -> None:
    lease = await cluster.acquire()
    key = key_of(lease)
    charge = Charge(receipt=("a", 1))
    first = await cluster.effects(1).save_result_if_absent(key, charge)
    # The answer is the stored JSON's value, on the first write as on every replay.
    assert first == FencedEffectResult(["a", 1], False, None)
    again = await cluster.effects(1).save_result_if_absent(key, charge)
    assert again == FencedEffectResult(["a", 1], True, None)
    assert charge.runs == 1
    assert await cluster.rows() == ["charged"]


@pytest.mark.parametrize("value", [None, 0, "", [], {}, False, "null"])
async def test_falsy_and_null_results_replay_as_stored(cluster: Cluster, value: Any) -> None:
    lease = await cluster.acquire()
    charge = Charge(receipt=value)
    charge.receipt = value
    first = await cluster.effects(1).save_result_if_absent(key_of(lease), charge)
    again = await cluster.effects(2).save_result_if_absent(key_of(lease), charge)
    assert (first, again) == (
        FencedEffectResult(value, False, None),
        FencedEffectResult(value, True, None),
    )
    assert charge.runs == 1


async def test_the_next_holder_replays_the_step_the_previous_holder_wrote(
    cluster: Cluster, clock: VirtualClock
) -> None:
    old = await cluster.acquire(1)
    await cluster.effects(1).save_result_if_absent(key_of(old), Charge())
    await clock.advance(LEASE_MS)
    new = await cluster.acquire(2)
    charge = Charge()
    result = await cluster.effects(2).save_result_if_absent(key_of(new), charge)
    assert result == FencedEffectResult({"receipt": "r-1"}, True, None)
    assert charge.runs == 0
    # A replay raises the mark too.
    assert await cluster.mark() == 2


async def test_a_business_key_is_shared_by_every_scope_of_the_tenant(cluster: Cluster) -> None:
    first = await cluster.acquire(1, "tree-1")
    second = await cluster.acquire(2, "tree-2")
    key_1 = key_of(first, business_key="order-7", fingerprint="f")
    key_2 = key_of(second, business_key="order-7", fingerprint="f", step_key="other-step")
    await cluster.effects(1).save_result_if_absent(key_1, Charge())
    charge = Charge()
    replay = await cluster.effects(2).save_result_if_absent(key_2, charge)
    assert replay == FencedEffectResult({"receipt": "r-1"}, True, key_1.step)
    assert replay.replayed_from == StepRef("tree-1", "step-1", "charge-step")
    assert charge.runs == 0
    assert await cluster.rows() == ["charged"]
    # The replaying scope's mark was raised too; the row is the first writer's.
    assert await cluster.mark("tree-2") == 1
    [row] = await cluster.results()
    assert (row[4], row[7], row[10]) == ("tree-1", "tree-1", "order-7")


async def test_another_fingerprint_under_a_business_key_is_a_conflict_not_a_replay(
    cluster: Cluster,
) -> None:
    first = await cluster.acquire(1, "tree-1")
    second = await cluster.acquire(2, "tree-2")
    await cluster.effects(1).save_result_if_absent(
        key_of(first, business_key="order-7", fingerprint="f1"), Charge()
    )
    charge = Charge()
    key_2 = key_of(second, business_key="order-7", fingerprint="f2")
    with pytest.raises(IdempotencyKeyConflictError):
        await cluster.effects(2).save_result_if_absent(key_2, charge)
    assert charge.runs == 0
    # The refusal rolled back the second scope's mark raise.
    assert await cluster.mark("tree-2") == 0
    assert await cluster.rows() == ["charged"]
    # No fingerprint is another fingerprint too.
    with pytest.raises(IdempotencyKeyConflictError):
        await cluster.effects(2).save_result_if_absent(
            key_of(second, business_key="order-7"), charge
        )


async def test_the_work_runs_in_the_effects_own_transaction(cluster: Cluster) -> None:
    lease = await cluster.acquire()
    seen: list[Any] = []

    async def work(tx: AsyncConnection) -> str:
        assert isinstance(tx, AsyncConnection)
        assert tx.in_transaction()
        # The uncommitted mark raise and claim are visible here: one transaction.
        mark = await tx.execute(
            sa.select(execution_leases.c.fence_token).where(
                execution_leases.c.execution_id == "tree-1"
            )
        )
        claimed = await tx.execute(sa.select(sa.func.count()).select_from(fenced_effect_results))
        seen.extend([mark.scalar(), claimed.scalar()])
        return "done"

    await cluster.effects(1).save_result_if_absent(key_of(lease), work)
    assert seen == [1, 1]


async def test_the_inline_work_connection_answers_as_an_async_connection_and_keeps_the_store_transaction(
    cluster: Cluster,
) -> None:
    """SQLite runs the work inline (`InlineWorkConnection`): `scalar`, `scalars` and
    `run_sync` answer as on any `AsyncConnection`, inside the effect's transaction; ending
    that transaction from the work (`commit`, `rollback`, `close`) is refused, so the work's
    rows can never commit apart from the fence and the result."""
    if not cluster.sql.capabilities.inline:
        pytest.skip("the work runs on a SQLAlchemy AsyncConnection of the engine here")
    lease = await cluster.acquire()
    seen: list[Any] = []
    count = sa.select(sa.func.count()).select_from(fenced_effect_results)

    async def work(tx: AsyncConnection) -> str:
        await insert_business_row(tx, "kept")
        seen.append(await tx.scalar(count))
        seen.append(list(await tx.scalars(sa.select(execution_leases.c.fence_token))))
        seen.append(await tx.run_sync(lambda sync: sync.in_transaction()))
        for end in (tx.commit, tx.rollback, tx.close):
            with pytest.raises(sa.exc.InvalidRequestError):
                await end()
        raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        await cluster.effects(1).save_result_if_absent(key_of(lease), work)
    assert seen == [1, [1], True]
    # Nothing the work did, and nothing of the fence, committed.
    assert await cluster.rows() == []
    assert await cluster.results() == []
    assert await cluster.mark() == 0


def _uses_of(tx: AsyncConnection) -> dict[str, Callable[[], Any]]:
    """Every way to reach the database through an `AsyncConnection` (a call each)."""
    one = sa.select(sa.literal(1))
    return {
        "execute": lambda: tx.execute(one),
        "scalar": lambda: tx.scalar(one),
        "scalars": lambda: tx.scalars(one),
        "stream": lambda: tx.stream(one),
        "stream_scalars": lambda: tx.stream_scalars(one),
        "exec_driver_sql": lambda: tx.exec_driver_sql("SELECT 1"),
        "run_sync": lambda: tx.run_sync(lambda sync: sync.execute(one)),
        "begin": lambda: tx.begin().start(),
        "begin_nested": lambda: tx.begin_nested().start(),
        "commit": tx.commit,
        "rollback": tx.rollback,
        "close": tx.close,
        "get_raw_connection": tx.get_raw_connection,
        "invalidate": tx.invalidate,
        "execution_options": lambda: tx.execution_options(isolation_level="SERIALIZABLE"),
        "in_transaction": tx.in_transaction,
        "sync_connection": lambda: tx.sync_connection,
        "start": tx.start,
    }


async def _refused_after_the_effect(cluster: Cluster, tx: AsyncConnection) -> None:
    """Every use of `tx` (a handle a fenced effect's work kept) raises
    `EffectTransactionEndedError` (a SQLAlchemy `ResourceClosedError`) and sends nothing."""
    trips = RoundTrips(cluster.sql)
    uses = _uses_of(tx)
    with trips.counting() as sent:
        for what, use in uses.items():
            try:
                outcome = use()
                if inspect.isawaitable(outcome):
                    await outcome
            except EffectTransactionEndedError as exc:
                refused = exc
            else:
                pytest.fail(f"{what} through the kept transaction was not refused")
            assert isinstance(refused, sa.exc.ResourceClosedError), what
            assert str(refused).startswith("[fenced-effect.transaction-ended] "), what
        # The store's own runners refuse it too (a step sent on a kept handle).
        with pytest.raises(EffectTransactionEndedError):
            await cluster.sql.execute_on(tx, sa.select(sa.literal(1)), {})
        if cluster.sql.capabilities.inline:
            with pytest.raises(EffectTransactionEndedError):
                tx.raw  # type: ignore[attr-defined]  # noqa: B018
    assert sent == []
    assert tx.closed


async def test_a_kept_transaction_refuses_every_use_after_the_effect_and_sends_nothing(
    cluster: Cluster,
) -> None:
    """The handle the work got ends when the work returns, after a commit, a raise, a
    result that is not JSON and a cancellation alike: every call through it is refused
    before it reaches the connection, and the next effects (on the connection the handle
    was over) commit as usual."""
    lease = await cluster.acquire()
    kept: list[AsyncConnection] = []
    waiting = asyncio.Event()

    async def keeping(tx: AsyncConnection) -> Any:
        kept.append(tx)
        await insert_business_row(tx, f"row-{len(kept)}")
        assert tx.in_transaction() and not tx.closed
        if len(kept) == 2:
            raise RuntimeError("the payment API said no")
        if len(kept) == 3:
            return {1, 2}
        if len(kept) == 4:
            waiting.set()
            await asyncio.Event().wait()
        return "paid"

    effects = cluster.effects(1)
    assert await effects.save_result_if_absent(key_of(lease), keeping) == FencedEffectResult(
        "paid", False, None
    )
    await _refused_after_the_effect(cluster, kept[-1])
    with pytest.raises(RuntimeError):
        await effects.save_result_if_absent(key_of(lease, step_key="step-2"), keeping)
    await _refused_after_the_effect(cluster, kept[-1])
    with pytest.raises(TypeError):
        await effects.save_result_if_absent(key_of(lease, step_key="step-3"), keeping)
    await _refused_after_the_effect(cluster, kept[-1])
    task = asyncio.create_task(
        effects.save_result_if_absent(key_of(lease, step_key="step-4"), keeping)
    )
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _refused_after_the_effect(cluster, kept[-1])
    for step in ("step-2", "step-3", "step-4", "step-5"):
        result = await effects.save_result_if_absent(
            key_of(lease, step_key=step), Charge(row=f"next-{step}")
        )
        assert result == FencedEffectResult({"receipt": "r-1"}, False, None)
    assert await cluster.rows() == [
        "row-1",
        "next-step-2",
        "next-step-3",
        "next-step-4",
        "next-step-5",
    ]
    assert len(kept) == 4 and len(set(map(id, kept))) == 4


async def test_the_work_cannot_end_the_effects_transaction_on_any_database(
    cluster: Cluster,
) -> None:
    """`commit`, `rollback` and `close` from the work are refused (SQLAlchemy's
    `InvalidRequestError`) on every database, so the work's rows never commit apart from
    the fence and the result; the transaction goes on after the refusal."""
    lease = await cluster.acquire()

    async def ending(tx: AsyncConnection) -> str:
        await insert_business_row(tx, "kept")
        for end in (tx.commit, tx.rollback, tx.close):
            with pytest.raises(sa.exc.InvalidRequestError) as refused:
                await end()
            assert not isinstance(refused.value, EffectTransactionEndedError)
        assert tx.in_transaction()
        await insert_business_row(tx, "after")
        return "paid"

    result = await cluster.effects(1).save_result_if_absent(key_of(lease), ending)
    assert result == FencedEffectResult("paid", False, None)
    assert await cluster.rows() == ["kept", "after"]

    async def ending_then_raising(tx: AsyncConnection) -> str:
        await insert_business_row(tx, "rolled-back")
        with pytest.raises(sa.exc.InvalidRequestError):
            await tx.commit()
        raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        await cluster.effects(1).save_result_if_absent(
            key_of(lease, step_key="step-2"), ending_then_raising
        )
    assert await cluster.rows() == ["kept", "after"]


# the key's rules, before any statement


@contextmanager
def no_statement_sent(sql: SqlConnection) -> Iterator[None]:
    trips = RoundTrips(sql)
    with trips.counting() as sent:
        yield
    assert sent == []


@pytest.mark.parametrize("name", ["", "has space", "x" * 101, "naïve", "a/b", None])
async def test_an_invalid_effect_name_is_refused_before_any_statement(
    cluster: Cluster, name: Any
) -> None:
    # No lease at all: a fence would refuse too, but the name's rule comes first.
    lease = ExecutionLease(TENANT, "tree-1", "instance-1", 1, LEASE_MS)
    key = dataclasses.replace(key_of(lease), name=name)
    charge = Charge()
    with no_statement_sent(cluster.sql):
        with pytest.raises(InvalidFencedEffectNameError, match=r"1-100 characters"):
            await cluster.effects(1).save_result_if_absent(key, charge)
    assert charge.runs == 0


@pytest.mark.parametrize("business_key", ["", "   ", "a\nb", "a\x00b", "a\x7fb", "k" * 256])
async def test_an_invalid_business_key_is_refused_before_any_statement(
    cluster: Cluster, business_key: str
) -> None:
    lease = await cluster.acquire()
    key = dataclasses.replace(key_of(lease), business_key=business_key)
    charge = Charge()
    with no_statement_sent(cluster.sql):
        with pytest.raises(InvalidBusinessKeyError, match="business key"):
            await cluster.effects(1).save_result_if_absent(key, charge)
    assert charge.runs == 0
    assert await cluster.nothing_written()


@pytest.mark.parametrize(
    "change",
    [{"tenant_id": ""}, {"lease_execution_id": "x" * 256}, {"token": "1"}, {"token": True}],
)
async def test_an_invalid_hand_built_key_is_refused_before_any_statement(
    cluster: Cluster, change: dict[str, Any]
) -> None:
    lease = await cluster.acquire()
    key = dataclasses.replace(key_of(lease), **change)
    with no_statement_sent(cluster.sql):
        with pytest.raises((InvalidIdentifierError, ValueError)):
            await cluster.effects(1).save_result_if_absent(key, Charge())
    assert await cluster.nothing_written()


async def test_a_business_key_of_255_characters_is_accepted(cluster: Cluster) -> None:
    lease = await cluster.acquire()
    key = key_of(lease, business_key="k" * 255, fingerprint="f")
    assert (await cluster.effects(1).save_result_if_absent(key, Charge())).replayed is False


# the lease check


async def _refusal(cluster: Cluster, instance: int, lease: ExecutionLease, **kw: Any) -> str:
    charge = Charge()
    key = key_of(lease)
    with pytest.raises(ExecutionFencedError) as refused:
        await cluster.effects(instance, **kw).save_result_if_absent(key, charge)
    assert charge.runs == 0
    assert refused.value.scope_key == key.scope_key
    assert refused.value.token == key.token
    assert refused.value.code == "execution.fenced"
    return refused.value.reason


async def test_no_lease_is_refused(cluster: Cluster) -> None:
    ghost = ExecutionLease(TENANT, "tree-1", "instance-1", 1, LEASE_MS)
    assert await _refusal(cluster, 1, ghost) == "lease-absent"
    assert await cluster.nothing_written()


async def test_a_zombies_token_is_refused_after_a_takeover(
    cluster: Cluster, clock: VirtualClock
) -> None:
    old = await cluster.acquire(1)
    await clock.advance(LEASE_MS)
    new = await cluster.acquire(2)
    assert await _refusal(cluster, 1, old) == "superseded"
    assert await cluster.nothing_written()
    result = await cluster.effects(2).save_result_if_absent(key_of(new), Charge())
    assert result.replayed is False
    assert await cluster.rows() == ["charged"]


async def test_a_token_never_granted_is_refused(cluster: Cluster) -> None:
    lease = await cluster.acquire()
    ahead = dataclasses.replace(lease, lease_epoch=5)
    assert await _refusal(cluster, 1, ahead) == "token-not-granted"
    assert await cluster.mark() == 0


@pytest.mark.parametrize(
    ("end", "reason"),
    [("release", "released"), ("yield_lease", "yielded"), ("finish", "finished")],
)
async def test_a_released_yielded_or_finished_lease_is_refused(
    cluster: Cluster, end: str, reason: str
) -> None:
    lease = await cluster.acquire()
    assert await getattr(cluster.leases(1), end)(lease)
    assert await _refusal(cluster, 1, lease) == reason
    assert await cluster.nothing_written()


@pytest.mark.parametrize(("offset", "written"), [(-1, True), (0, False), (1, False)])
async def test_a_fenced_write_at_the_expiry_boundary(
    cluster: Cluster, clock: VirtualClock, offset: int, written: bool
) -> None:
    lease = await cluster.acquire()
    await clock.advance(LEASE_MS + offset)
    if written:
        result = await cluster.effects(1).save_result_if_absent(key_of(lease), Charge())
        assert result.replayed is False
        assert await cluster.rows() == ["charged"]
    else:
        # Expired, whether another instance took the lease or not.
        assert await _refusal(cluster, 1, lease) == "expired"
        assert await cluster.nothing_written()


async def test_a_lease_closed_by_lease_state_of_refuses_as_superseded(
    cluster: Cluster, clock: VirtualClock
) -> None:
    lease = await cluster.acquire()
    await clock.advance(LEASE_MS)
    calls = SqlOutboundCallRepository(cluster.sql, cluster.store_clock, ApplicationContext("i-2"))
    assert await calls.lease_state_of(TENANT, "tree-1", 1) is LeaseState.SUPERSEDED
    assert await _refusal(cluster, 1, lease) == "superseded"


async def test_a_mark_above_the_token_refuses(cluster: Cluster) -> None:
    lease = await cluster.acquire()
    # Only a damaged or hand-edited row has a mark above its own epoch.
    await cluster.sql.execute(sa.update(execution_leases).values(fence_token=2))
    assert await _refusal(cluster, 1, lease) == "mark-above-token"
    assert await cluster.mark() == 2
    assert await cluster.rows() == []


async def test_the_mark_is_raised_to_the_token(cluster: Cluster) -> None:
    lease = await cluster.acquire()
    assert await cluster.leases(1).release(lease)
    lease = await cluster.acquire(2)
    assert await cluster.mark() == 0
    await cluster.effects(2).save_result_if_absent(key_of(lease, step_key="s"), Charge())
    assert await cluster.mark() == 2


async def test_the_store_decides_by_its_store_clock(cluster: Cluster, clock: VirtualClock) -> None:
    lease = await cluster.acquire()
    # Another store time, past the lease: the same lease is refused there, kept here.
    late = StoreClock(VirtualClock(START + LEASE_MS))
    assert await _refusal(cluster, 1, lease, store_clock=late) == "expired"
    result = await cluster.effects(1).save_result_if_absent(key_of(lease), Charge())
    assert result.replayed is False


async def test_database_time_fences_on_the_databases_clock(sql: SqlConnection) -> None:
    leases = SqlExecutionLeaseRepository(sql, StoreClock(), ApplicationContext("i-1"))
    effects = SqlFencedEffectRepository(sql, StoreClock(), ApplicationContext("i-1"))
    lease = await leases.acquire(TENANT, "tree-1", 60_000)
    assert lease is not None
    result = await effects.save_result_if_absent(key_of(lease), Charge())
    assert result.replayed is False
    short = await leases.acquire(TENANT, "tree-2", 150)
    assert short is not None
    await asyncio.sleep(0.25)
    with pytest.raises(ExecutionFencedError) as refused:
        await effects.save_result_if_absent(key_of(short), Charge())
    assert refused.value.reason == "expired"
    assert await committed_business_rows(sql) == ["charged"]


# rollback


async def test_a_failing_work_leaves_no_rows_no_result_and_no_mark(cluster: Cluster) -> None:
    lease = await cluster.acquire()
    key = key_of(lease)

    async def failing(tx: AsyncConnection) -> None:
        await insert_business_row(tx, "half-done")
        raise RuntimeError("payment API down")

    with pytest.raises(RuntimeError, match="payment API down"):
        await cluster.effects(1).save_result_if_absent(key, failing)
    assert await cluster.nothing_written()
    # Nothing was stored: the next call runs the work again.
    charge = Charge()
    assert (await cluster.effects(1).save_result_if_absent(key, charge)).replayed is False
    assert charge.runs == 1
    assert await cluster.rows() == ["charged"]


async def test_a_failing_work_keeps_the_mark_where_it_was(cluster: Cluster) -> None:
    first = await cluster.acquire()
    await cluster.effects(1).save_result_if_absent(key_of(first), Charge())
    assert await cluster.leases(1).release(first)
    second = await cluster.acquire(2)

    async def failing(tx: AsyncConnection) -> None:
        raise ValueError("no")

    with pytest.raises(ValueError):
        await cluster.effects(2).save_result_if_absent(key_of(second, step_key="s2"), failing)
    assert await cluster.mark() == 1
    assert len(await cluster.results()) == 1


@pytest.mark.parametrize("value", [{1, 2}, object(), math.nan, {"at": math.inf}])
async def test_a_result_json_cannot_store_rolls_everything_back(
    cluster: Cluster, value: Any
) -> None:
    lease = await cluster.acquire()
    with pytest.raises((TypeError, ValueError)):
        await cluster.effects(1).save_result_if_absent(key_of(lease), Charge(receipt=value))
    assert await cluster.nothing_written()


async def test_a_cancelled_work_rolls_everything_back_and_lets_the_lock_go(
    cluster: Cluster,
) -> None:
    lease = await cluster.acquire()
    started = asyncio.Event()

    async def slow(tx: AsyncConnection) -> str:
        await insert_business_row(tx, "row")
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.create_task(cluster.effects(1).save_result_if_absent(key_of(lease), slow))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await cluster.nothing_written()
    renewed = await asyncio.wait_for(cluster.leases(1).renew(lease, LEASE_MS), 5)
    assert renewed == LEASE_MS


async def test_a_transient_conflict_runs_the_whole_transaction_again(cluster: Cluster) -> None:
    """A deadlock undid the whole transaction: it runs again, work included, once."""
    if not cluster.sql.capabilities.row_locks:
        pytest.skip(
            "SQLite has no transient conflicts: BEGIN IMMEDIATE takes the write lock first, "
            "and a lock not granted within its bound is a timeout, not a conflict"
        )
    lease = await cluster.acquire()
    runs: list[int] = []

    async def work(tx: AsyncConnection) -> str:
        runs.append(len(runs))
        await insert_business_row(tx, f"attempt-{len(runs)}")
        if len(runs) == 1:
            raise deadlock_error(cluster.sql)
        return "paid"

    result = await cluster.effects(1).save_result_if_absent(key_of(lease), work)
    assert result == FencedEffectResult("paid", False, None)
    assert len(runs) == 2
    # The first attempt's row went with its transaction.
    assert await cluster.rows() == ["attempt-2"]
    assert len(await cluster.results()) == 1


# atomicity under real concurrency


async def test_ten_concurrent_calls_of_one_key_make_one_effect(
    cluster: Cluster, new_connection: Callable[[], SqlConnection]
) -> None:
    lease = await cluster.acquire()
    key = key_of(lease)
    charge = Charge()
    stores = [cluster.effects(i, new_connection()) for i in range(10)]
    results = await asyncio.gather(*(s.save_result_if_absent(key, charge) for s in stores))
    assert charge.runs == 1
    assert sorted(r.replayed for r in results) == [False] + [True] * 9
    assert {r.value["receipt"] for r in results} == {"r-1"}
    assert await cluster.rows() == ["charged"]
    assert len(await cluster.results()) == 1


async def test_ten_executions_racing_one_business_key_charge_once(
    cluster: Cluster, new_connection: Callable[[], SqlConnection]
) -> None:
    leases = [await cluster.acquire(i, f"tree-{i}") for i in range(10)]
    keys = [key_of(lease, business_key="order-1", fingerprint="f") for lease in leases]
    charges = [Charge(row=f"charged-by-{i}") for i in range(10)]
    stores = [cluster.effects(i, new_connection()) for i in range(10)]
    results = await asyncio.gather(
        *(s.save_result_if_absent(k, c) for s, k, c in zip(stores, keys, charges, strict=True))
    )
    assert sum(c.runs for c in charges) == 1
    [winner] = [i for i, r in enumerate(results) if not r.replayed]
    assert await cluster.rows() == [f"charged-by-{winner}"]
    for i, result in enumerate(results):
        if i != winner:
            assert result == FencedEffectResult({"receipt": "r-1"}, True, keys[winner].step)


async def test_a_takeover_waits_for_the_effect_in_flight(
    cluster: Cluster, clock: VirtualClock, new_connection: Callable[[], SqlConnection]
) -> None:
    lease = await cluster.acquire(1)
    in_work = asyncio.Event()
    go_on = asyncio.Event()

    async def work(tx: AsyncConnection) -> str:
        await insert_business_row(tx, "zombie-write")
        in_work.set()
        await go_on.wait()
        return "paid"

    write = asyncio.create_task(cluster.effects(1).save_result_if_absent(key_of(lease), work))
    await in_work.wait()
    # Past the lease by the store's time; the write already passed its fence.
    await clock.advance(LEASE_MS)
    take = asyncio.create_task(
        cluster.leases(2, new_connection()).acquire(TENANT, "tree-1", LEASE_MS)
    )
    await asyncio.sleep(0.3)
    assert not take.done(), "the take did not wait for the lease row the write holds"
    go_on.set()
    assert (await write).replayed is False
    taken = await asyncio.wait_for(take, 15)
    assert taken is not None and taken.lease_epoch == 2
    replay = await cluster.effects(2).save_result_if_absent(key_of(taken), Charge())
    assert replay == FencedEffectResult("paid", True, None)
    assert await cluster.rows() == ["zombie-write"]


@pytest.mark.parametrize("order", ["zombie-first", "takeover-first", "concurrent"])
async def test_a_zombies_write_racing_a_takeover_never_commits_both_writes(
    cluster: Cluster, new_connection: Callable[[], SqlConnection], order: str
) -> None:
    # The zombie's statements read a store time 1 ms before the expiry, the taker's the
    # expiry itself: only the lease row's lock and epoch can keep the two apart.
    for round_ in range(8 if order == "concurrent" else 2):
        execution = f"tree-{round_}"
        zombie_time = VirtualClock(START)
        taker_time = VirtualClock(START)
        zombie_leases = cluster.leases(1, new_connection(), StoreClock(zombie_time))
        lease = await zombie_leases.acquire(TENANT, execution, LEASE_MS)
        assert lease is not None
        zombie_time.set(START + LEASE_MS - 1)
        taker_time.set(START + LEASE_MS)
        zombie = cluster.effects(1, new_connection(), StoreClock(zombie_time))
        taker_connection = new_connection()
        taker_leases = cluster.leases(2, taker_connection, StoreClock(taker_time))
        taker = cluster.effects(2, taker_connection, StoreClock(taker_time))

        async def zombie_write(zombie: Any = zombie, lease: ExecutionLease = lease) -> Any:
            try:
                return await zombie.save_result_if_absent(
                    key_of(lease), Charge(row="zombie", receipt="z")
                )
            except ExecutionFencedError as refused:
                return refused

        async def take_and_write(
            taker_leases: Any = taker_leases, taker: Any = taker, execution: str = execution
        ) -> Any:
            taken = await taker_leases.acquire(TENANT, execution, LEASE_MS)
            assert taken is not None and taken.lease_epoch == 2
            return await taker.save_result_if_absent(
                key_of(taken), Charge(row="taker", receipt="t")
            )

        if order == "zombie-first":
            zombie_result = await zombie_write()
            taker_result = await take_and_write()
        elif order == "takeover-first":
            taker_result = await take_and_write()
            zombie_result = await zombie_write()
        else:
            zombie_result, taker_result = await asyncio.gather(zombie_write(), take_and_write())
        rows = await cluster.rows()
        if isinstance(zombie_result, ExecutionFencedError):
            assert zombie_result.reason == "superseded"
            assert taker_result == FencedEffectResult("t", False, None)
            assert rows == ["taker"]
        else:
            assert zombie_result == FencedEffectResult("z", False, None)
            assert taker_result == FencedEffectResult("z", True, None)
            assert rows == ["zombie"]
        if order == "zombie-first":
            assert rows == ["zombie"]
        if order == "takeover-first":
            assert rows == ["taker"]
        await cluster.sql.execute(sa.text("DELETE FROM conformance_business_rows"))


async def test_a_zombies_write_never_commits_under_a_superseded_lease(
    cluster: Cluster, new_connection: Callable[[], SqlConnection]
) -> None:
    # Another step than the new holder's, so no stored result can hide a stale write: a
    # zombie's write that commits must have held the lease (epoch 1) through its commit,
    # which its own transaction sees after the fence.
    outcomes = set()
    for round_ in range(20):
        execution = f"tree-{round_}"
        zombie_time = VirtualClock(START)
        zombie_connection = new_connection()
        lease = await cluster.leases(1, zombie_connection, StoreClock(zombie_time)).acquire(
            TENANT, execution, LEASE_MS
        )
        assert lease is not None
        zombie_time.set(START + LEASE_MS - 1)
        zombie = cluster.effects(1, zombie_connection, StoreClock(zombie_time))
        taker = cluster.leases(2, new_connection(), StoreClock(VirtualClock(START + LEASE_MS)))
        seen: list[int] = []

        async def work(
            tx: AsyncConnection, execution: str = execution, seen: list[int] = seen
        ) -> str:
            # A locking read: the row as it is now, not as a snapshot (MySQL) saw it.
            epoch = await tx.execute(
                sa.select(execution_leases.c.lease_epoch)
                .where(execution_leases.c.execution_id == execution)
                .with_for_update(read=True)
            )
            seen.append(int(epoch.scalar_one()))
            await insert_business_row(tx, f"zombie-{execution}")
            return "z"

        async def zombie_write(zombie: Any = zombie, lease: ExecutionLease = lease) -> bool:
            try:
                await zombie.save_result_if_absent(key_of(lease, step_key="zombie-step"), work)
            except ExecutionFencedError as refused:
                assert refused.reason == "superseded"
                return False
            return True

        wrote, taken = await asyncio.gather(
            zombie_write(), taker.acquire(TENANT, execution, LEASE_MS)
        )
        assert taken is not None and taken.lease_epoch == 2
        if wrote:
            assert seen == [1], f"a write committed under epoch {seen} at token 1"
            outcomes.add("wrote before the takeover")
        else:
            assert f"zombie-{execution}" not in await cluster.rows()
            outcomes.add("refused after the takeover")
    assert outcomes


async def test_a_zombies_write_racing_a_takeover_on_database_time(
    sql: SqlConnection, new_connection: Callable[[], SqlConnection]
) -> None:
    outcomes = set()
    for round_ in range(6):
        execution = f"tree-{round_}"
        zombie_connection, taker_connection = new_connection(), new_connection()
        zombie_leases = SqlExecutionLeaseRepository(
            zombie_connection, StoreClock(), ApplicationContext("zombie")
        )
        lease = await zombie_leases.acquire(TENANT, execution, 120)
        assert lease is not None
        zombie = SqlFencedEffectRepository(
            zombie_connection, StoreClock(), ApplicationContext("zombie")
        )
        taker_leases = SqlExecutionLeaseRepository(
            taker_connection, StoreClock(), ApplicationContext("taker")
        )
        taker = SqlFencedEffectRepository(
            taker_connection, StoreClock(), ApplicationContext("taker")
        )
        await asyncio.sleep(0.1 + 0.005 * round_)

        async def zombie_write(zombie: Any = zombie, lease: ExecutionLease = lease) -> Any:
            try:
                return await zombie.save_result_if_absent(
                    key_of(lease), Charge(row=f"z{lease.execution_id}")
                )
            except ExecutionFencedError as refused:
                return refused

        async def take_and_write(
            taker_leases: Any = taker_leases, taker: Any = taker, execution: str = execution
        ) -> Any:
            while (taken := await taker_leases.acquire(TENANT, execution, 60_000)) is None:
                await asyncio.sleep(0.005)
            return await taker.save_result_if_absent(key_of(taken), Charge(row=f"t{execution}"))

        zombie_result, taker_result = await asyncio.gather(zombie_write(), take_and_write())
        rows = [row for row in await committed_business_rows(sql) if row[1:] == execution]
        assert len(rows) == 1
        if isinstance(zombie_result, ExecutionFencedError):
            assert zombie_result.reason in ("expired", "superseded")
            assert not taker_result.replayed and rows == [f"t{execution}"]
            outcomes.add("zombie refused")
        else:
            assert taker_result.replayed and rows == [f"z{execution}"]
            outcomes.add("zombie wrote first")
    assert outcomes


# statements


async def test_statements_per_call(cluster: Cluster, clock: VirtualClock) -> None:
    sql = cluster.sql
    lease = await cluster.acquire()
    effects = cluster.effects(1)
    await effects.ping()  # the engine and the pool exist before counting
    async with sql.transaction() as warm:
        await warm.execute(sa.text("SELECT 1"))
    trips = RoundTrips(sql)
    with trips.counting() as sent:
        await effects.save_result_if_absent(key_of(lease), Charge())
        first = list(sent)
        sent.clear()
        await effects.save_result_if_absent(key_of(lease), Charge())
        replay = list(sent)
        sent.clear()
        await clock.advance(LEASE_MS)
        with pytest.raises(ExecutionFencedError):
            await effects.save_result_if_absent(key_of(lease, step_key="s2"), Charge())
        refused = list(sent)
    # aiomysql sends no BEGIN (autocommit off: the first statement starts the transaction).
    begin = ["BEGIN"] if transaction_sends_begin(sql) else []
    assert first == [*begin, "fence", "claim", "work", "store", "COMMIT"]
    if conditional_upsert_returns_row(sql):
        # The claim returns the row already there, so a replay reads nothing.
        assert replay == [*begin, "fence", "claim", "COMMIT"]
    else:
        assert replay == [*begin, "fence", "claim", "read", "COMMIT"]
    # A committed transaction's connection is kept for the next one; a failed one's goes back
    # to the pool, whose reset may send a ROLLBACK of its own.
    reset = ["ROLLBACK(pool)"] if pool_reset_sends_rollback(sql) else []
    assert refused == [*begin, "fence", "diagnose", "ROLLBACK", *reset]


async def test_get_result_is_one_select_outside_any_transaction(
    cluster: Cluster, clock: VirtualClock
) -> None:
    """A read sends one unlocking `SELECT` in autocommit whatever it finds (a result, nothing,
    a conflict), with no fence and no transaction, and changes no row: not the lease's
    mark or fence count (even at a token above the epoch), not the results."""
    sql = cluster.sql
    lease = await cluster.acquire()
    effects = cluster.effects(2)
    await effects.save_result_if_absent(
        key_of(lease, business_key="b-1", fingerprint="fp"), Charge()
    )
    await effects.ping()

    async def lease_row() -> Any:
        L = execution_leases
        return (await sql.execute(sa.select(L).where(L.c.execution_id == "tree-1"))).rows

    before = (await lease_row(), await cluster.results())
    texts: list[str] = []
    remove = sql.add_statement_listener(lambda text, _params: texts.append(text))
    trips = RoundTrips(sql)
    try:
        with trips.counting() as sent:
            stored = await effects.get_result(key_of(lease, business_key="b-1", fingerprint="fp"))
            assert stored == FencedEffectResult({"receipt": "r-1"}, True, None)
            assert sent == ["read"]
            sent.clear()
            ahead = dataclasses.replace(key_of(lease, step_key="s2"), token=lease.lease_epoch + 5)
            assert await effects.get_result(ahead) is None
            assert sent == ["read"]
            sent.clear()
            with pytest.raises(IdempotencyKeyConflictError):
                await effects.get_result(key_of(lease, business_key="b-1", fingerprint="fp-2"))
            assert sent == ["read"]
    finally:
        remove()
    assert len(texts) == 3 and not any(" FOR " in f" {text.upper()} " for text in texts), texts
    assert (await lease_row(), await cluster.results()) == before


async def test_get_result_of_a_row_without_its_result_is_corrupt(cluster: Cluster) -> None:
    """A committed row always has its result: one without is reported, never read as
    nothing stored nor as a stored `null`."""
    lease = await cluster.acquire()
    key = key_of(lease)
    identity = fenced_key_identity_of(key)
    await cluster.sql.execute(
        sa.insert(fenced_effect_results).values(
            identity_hash=identity_hash(identity),
            identity=identity,
            tenant_id=key.tenant_id,
            scope_key=key.scope_key,
            name=key.name,
            step_execution_id=key.step.execution_id,
            step_idempotency_key=key.step.idempotency_key,
            step_name=key.step.name,
            lease_execution_id=key.lease_execution_id,
            token=key.token,
            stored_at=START,
        )
    )
    with pytest.raises(CorruptStoredRowError, match="missing"):
        await cluster.effects(1).get_result(key)


# the store


def test_the_store_needs_the_stores_clock_and_an_application(sql: SqlConnection) -> None:
    with pytest.raises(TypeError, match="StoreClock"):
        SqlFencedEffectRepository(sql, VirtualClock(), ApplicationContext("a"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ApplicationContext"):
        SqlFencedEffectRepository(sql, StoreClock(), "a")  # type: ignore[arg-type]
    with pytest.raises(InvalidIdentifierError):
        SqlFencedEffectRepository(sql, StoreClock(), ApplicationContext(""))


async def test_the_store_declares_its_backend_and_its_lease_store(sql: SqlConnection) -> None:
    store = SqlFencedEffectRepository(sql, StoreClock(), ApplicationContext("a"))
    assert store.backend == sql.backend == sql.dialect_name
    assert SqlFencedEffectRepository.lease_repository is SqlExecutionLeaseRepository
    await store.ping()


async def test_a_locked_database_past_its_bound_is_a_typed_timeout_not_a_retry(
    cluster: Cluster,
) -> None:
    """A lock wait that ended at its bound is not run again (twelve waits would turn the
    bound into minutes): the effect fails with `StoreTimeoutError(what="lock")`, its work's
    rows roll back with it, and a later call runs the work once."""
    lease = await cluster.acquire()
    runs: list[int] = []
    timeout = lock_timeout_error(cluster.sql)

    async def work(tx: AsyncConnection) -> str:
        runs.append(len(runs))
        await insert_business_row(tx, f"attempt-{len(runs)}")
        if len(runs) == 1:
            raise timeout
        return "paid"

    with pytest.raises(StoreTimeoutError) as raised:
        await cluster.effects(1).save_result_if_absent(key_of(lease), work)
    assert raised.value.what == "lock"
    assert runs == [0]
    assert await cluster.rows() == []
    result = await cluster.effects(1).save_result_if_absent(key_of(lease), work)
    assert result == FencedEffectResult("paid", False, None)
    assert await cluster.rows() == ["attempt-2"]


async def test_a_full_sqlite_database_is_a_typed_error_and_nothing_is_half_written(
    cluster: Cluster,
) -> None:
    """SQLite's "database or disk is full" (SQLITE_FULL, made here by capping the file's
    pages for the work's connection) fails the effect with `StoreUnavailableError`, never a
    raw driver error, and rolls the whole transaction back: no business row, no result; with
    room again the same call runs the work once."""
    if not cluster.sql.capabilities.inline:
        pytest.skip("a server's full disk cannot be made here")
    lease = await cluster.acquire()
    runs = 0

    async def work(tx: AsyncConnection) -> str:
        nonlocal runs
        runs += 1
        if runs == 1:
            pages = (await tx.exec_driver_sql("PRAGMA page_count")).scalar()
            free = (await tx.exec_driver_sql("PRAGMA freelist_count")).scalar()
            page_size = (await tx.exec_driver_sql("PRAGMA page_size")).scalar()
            await tx.exec_driver_sql(f"PRAGMA max_page_count = {int(pages)}")
            try:
                # More than the file's free pages can hold: it must grow, and cannot.
                await insert_business_row(tx, "x" * ((int(free) + 16) * int(page_size)))
            finally:
                await tx.exec_driver_sql("PRAGMA max_page_count = 1073741823")
        await insert_business_row(tx, "charged")
        return "paid"

    with pytest.raises(StoreUnavailableError) as raised:
        await cluster.effects(1).save_result_if_absent(key_of(lease), work)
    assert not isinstance(raised.value, CommitOutcomeUnknownError)
    assert "full" in str(raised.value)
    assert await cluster.rows() == []
    assert await cluster.results() == []
    result = await cluster.effects(1).save_result_if_absent(key_of(lease), work)
    assert result == FencedEffectResult("paid", False, None)
    assert await cluster.rows() == ["charged"]
    assert runs == 2


async def test_a_nested_effect_on_its_own_lease_ends_in_a_lock_timeout(
    cluster: Cluster, sql_url: str
) -> None:
    """Work that runs another fenced effect on the same lease waits for the lease row its
    own transaction holds (PostgreSQL/MySQL: the row lock; SQLite: the write lock). That
    wait ends at `lock_ms` in `StoreTimeoutError(what="lock")` instead of never; both
    transactions roll back, nothing is written."""
    connection = SqlConnection(sql_url, timeouts=Timeouts(lock_ms=300))
    try:
        effects = cluster.effects(1, connection)
        lease = await cluster.acquire()

        async def inner(tx: AsyncConnection) -> str:
            await insert_business_row(tx, "inner")
            return "inner"

        async def outer(tx: AsyncConnection) -> str:
            await insert_business_row(tx, "outer")
            await effects.save_result_if_absent(key_of(lease, step_key="inner-step"), inner)
            return "outer"

        with pytest.raises(StoreTimeoutError) as raised:
            # The outer bound only keeps a regression from hanging the suite.
            await asyncio.wait_for(effects.save_result_if_absent(key_of(lease), outer), 60)
        assert raised.value.what == "lock"
        assert await cluster.rows() == []
        assert await cluster.results() == []
    finally:
        await connection.close()
