"""Helpers of the workflow engine's tests: instances of a `Workflows` app on the database
under test, each an `Engine` over its own `Application` (its own connection), on one
virtual clock that also decides leases (`StoreClock(clock)`), so a lease runs out only
when a test moves the clock; a business table the effects write to; and gates a test
opens to let a step go on."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import sqlalchemy as sa

from agboss_sql.application import Application, DatabaseUrl
from agboss_sql.contracts import Clock, ExecutionLease, StoreClock, VirtualClock
from agboss_sql.runtime import Engine, Workflows, WorkflowState
from agboss_sql.sql import sql_stores
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.migrate import sync_url
from agboss_sql.sql.schema import fenced_effect_results

START = 1_700_000_000_000
LEASE_MS = 30_000
"""A lease runs out only when a test moves the clock past it. While a wait moves the clock
(`until(..., clock=)`, at most `POLL_MS` a round), the keepers renew every third of it;
the two thirds of slack before a renewal must be answered leave a slow round trip on a
loaded machine several seconds of real time."""
POLL_MS = 50
WAIT_S = 30.0
"""Bound of every wait for the engines: well under a second on an idle machine; the
bound is for a loaded CI runner, never a synchronisation."""

Event = dict[str, Any]

rows_metadata = sa.MetaData()
workflow_rows = sa.Table(
    "workflow_test_rows",
    rows_metadata,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
    sa.Column("row", sa.String(255), nullable=False),
)
"""The business rows the tests' effects write on the fence's transaction."""


_created: set[str] = set()


def create_rows_table(url: str) -> None:
    """Create the business table on `url` once per session (kept: it is emptied per test)."""
    if url in _created:
        return
    engine = sa.create_engine(sync_url(url))
    try:
        rows_metadata.create_all(engine)
    finally:
        engine.dispose()
    _created.add(url)


async def insert_row(tx: Any, row: str) -> None:
    """Write one business row on an effect's transaction (a SQLAlchemy `AsyncConnection`)."""
    await tx.execute(sa.insert(workflow_rows).values(row=row))


async def committed_rows(sql: SqlConnection) -> list[str]:
    result = await sql.execute(sa.select(workflow_rows.c.row).order_by(workflow_rows.c.id))
    return [str(r[0]) for r in result.rows]


async def empty_rows(sql: SqlConnection) -> None:
    await sql.execute(sa.delete(workflow_rows))


async def stored_results(sql: SqlConnection, execution: str, key: str) -> int:
    """How many results are stored under step key `key` (`name#n`) of `execution`."""
    t = fenced_effect_results
    result = await sql.execute(
        sa.select(sa.func.count()).where(
            t.c.step_execution_id == execution, t.c.step_idempotency_key == key
        )
    )
    return int(result.rows[0][0])


class Calls:
    """The calls of the tests' step, effect, send and undo functions: `(what, instance)`."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str]] = []

    def __call__(self, what: str, instance: str) -> None:
        self.made.append((what, instance))

    def of(self, what: str) -> list[str]:
        """The instances that made the calls of `what`, in order."""
        return [instance for name, instance in self.made if name == what]


async def until(
    check: Callable[[], Awaitable[bool]],
    what: str | Callable[[], str],
    *,
    clock: VirtualClock | None = None,
    step_ms: int = POLL_MS,
    timeout_s: float = WAIT_S,
) -> None:
    """Poll `check` until it is true; fail naming `what` (a callable: built at the failure,
    to show the state then) past the bound. With `clock`, each round also moves the virtual
    clock by `step_ms`, so the engines' loops (child pumps, renewals) take their turns."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        if loop.time() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"waited {timeout_s:.0f} s for {said}")
        if clock is not None:
            await clock.advance(step_ms)
        await asyncio.sleep(0.01)


class Gate:
    """Where a step waits until the test opens it; `reached` tells the test it is there."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.opened = asyncio.Event()

    async def __call__(self) -> None:
        self.reached.set()
        await self.opened.wait()

    async def wait_reached(self) -> None:
        await asyncio.wait_for(self.reached.wait(), WAIT_S)

    def open(self) -> None:
        self.opened.set()


def frozen_clock() -> VirtualClock:
    """An instance's own clock that never moves: its keepers never renew and never stop
    trusting their leases, as in a process frozen (or paused between its lease check and
    its write) while the store's time goes on."""
    return VirtualClock(START)


class Cluster:
    """Instances made by a test, on one database and one virtual clock, all closed after it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.clock = VirtualClock(START)
        self.tenant = f"t-{uuid.uuid4().hex[:8]}"
        self.engines: list[Engine] = []
        self.apps: list[Application] = []
        self.events: dict[str, list[Event]] = {}

    async def engine(
        self,
        name: str,
        workflows: Workflows,
        *,
        background: bool = True,
        clock: Clock | None = None,
        lease_ms: int = LEASE_MS,
        **settings: Any,
    ) -> Engine:
        """An opened engine named `name` running `workflows`. `clock`: its own application
        clock (a frozen instance's view of time), else the cluster's; leases are decided by
        the cluster's clock either way. `background=False` starts none of its loops (no
        sweep, no child pump): it runs only what is started on it."""
        own = clock if clock is not None else self.clock
        application = Application(
            "workflows-test",
            sql_stores(checkpoint_saver=False),
            {DatabaseUrl: DatabaseUrl(self.url), StoreClock: StoreClock(self.clock), Clock: own},
            instance_id=name,
        )
        events: list[Event] = []
        engine = Engine(
            workflows,
            application=application,
            clock=own,
            lease_ms=lease_ms,
            poll_ms=settings.pop("poll_ms", POLL_MS),
            on_event=events.append,
            **settings,
        )
        self.apps.append(application)
        self.events[name] = events
        await engine.open(background=background)
        self.engines.append(engine)
        return engine

    async def state(self, engine: Engine, workflow_id: str) -> WorkflowState:
        return (await engine.status(workflow_id, tenant_id=self.tenant)).state

    async def wait_state(
        self, engine: Engine, workflow_id: str, state: WorkflowState, *, move: bool = False
    ) -> None:
        """Wait for the run to be in `state` (moving the clock with `move`)."""

        async def reached() -> bool:
            found = await self.state(engine, workflow_id)
            if found.ended and found is not state:
                status = await engine.status(workflow_id, tenant_id=self.tenant)
                raise AssertionError(f"{workflow_id} ended {found.value}: {status.error}")
            return found is state

        await until(
            reached,
            lambda: f"{workflow_id} {state.value}; events: {self.events}",
            clock=self.clock if move else None,
        )

    async def lease_log(self, engine: Engine, execution: str) -> list[tuple[str, str, int]]:
        """`(kind, instance, epoch)` of the execution's lease events, in save order."""
        return [
            (e.kind.value, e.instance_id, e.lease_epoch)
            for e in await engine.events.list(self.tenant, execution)
        ]

    async def wait_lease(self, engine: Engine, execution: str, last: tuple[str, str, int]) -> None:
        """Wait for the execution's latest lease event to be `last` (`(kind, instance,
        epoch)`): a run moves its record first and its lease after."""

        async def moved() -> bool:
            log = await self.lease_log(engine, execution)
            return bool(log) and log[-1] == last

        await until(moved, lambda: f"{execution}'s lease {last}; events: {self.events}")

    async def take_over(self, engine: Engine, workflow_id: str) -> ExecutionLease:
        """Move the clock past the run's lease and let `engine`'s sweep take the run over.
        An engine with background loops on the cluster's clock would race this sweep when
        the clock moves: the engines of such a test run without them."""
        await self.clock.advance(LEASE_MS + 1)
        taken = [lease for lease in await engine.sweep_once() if lease.execution_id == workflow_id]
        assert len(taken) == 1, f"{engine.instance_id} did not take {workflow_id} over"
        return taken[0]

    def of(self, kind: str, engine: str | None = None, **match: Any) -> list[Event]:
        """The events of `kind` matching `match` (of `engine`, else of every engine), each
        with its `engine`."""
        return [
            {**e, "engine": name}
            for name, events in self.events.items()
            if engine is None or name == engine
            for e in events
            if e.get("kind") == kind and all(e.get(k) == v for k, v in match.items())
        ]

    async def close(self) -> None:
        for engine in reversed(self.engines):
            await engine.close()
        for application in self.apps:
            await application.close()


async def open_cluster(sql_url: str, sql: SqlConnection) -> AsyncIterator[Cluster]:
    """The body of a test's `cluster` fixture (`sql` emptied the schema's tables)."""
    create_rows_table(sql_url)
    await empty_rows(sql)
    made = Cluster(sql_url)
    try:
        yield made
    finally:
        await made.close()
