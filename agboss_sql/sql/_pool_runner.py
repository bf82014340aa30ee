"""The pool runner: a server's raw async connections, one per running step, every wait bounded.

Each step gets one pooled connection; each statement is one await on it, inside
`BEGIN … COMMIT` when the step needs a transaction. The waits and their bounds
(`Timeouts`):

- a pooled connection: `pool_ms`, then `StoreTimeoutError(what="pool")`;
- connecting: `connect_ms` (the driver's own timeout too), then `what="connect"`;
- a statement: the server ends it at `statement_ms` and a lock wait at `lock_ms` (set in
  the session at connect); the client also gives up `GRACE_S` past `statement_ms`
  (`_deadline.StatementDeadline`), for a server that stopped answering (a black-holed
  connection). The connection is then dropped, never reused: its protocol state is
  unknown. Giving up never waits on the network: the dialects' connections drop
  themselves when a call is cancelled (psycopg would otherwise ask the server to cancel
  the query, through the same dead link).

Lease operations take their connections from lanes of their own (`_runner.Lane`): takes
from one (`Lane.TAKE`), the holder's moves of its lease (renew, release, yield, reclaim,
finish) from another (`Lane.HOLD`). A renewal never queues behind business work waiting on
row locks, nor behind takes waiting `lock_ms` on a row another session holds locked.

The work's transactions (`transaction()`: a fenced effect's own statements) run on a
SQLAlchemy engine over the same driver, made by `create_engine`: its connections are
opened under `connect_ms`, its statements bounded by the same client deadline (armed by
the engine's cursor events), and the connection of a committed transaction is kept
checked out for the next one (no pool round trip).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.util import greenlet_spawn

from agboss_sql._dialects import Capabilities, ServerDialect
from agboss_sql._timeouts import Timeouts
from agboss_sql.contracts.errors import StoreTimeoutError, StoreUnavailableError
from agboss_sql.sql._deadline import (
    ENGINE_DEADLINE,
    GRACE_S,
    DeadlinePassed,
    StatementDeadline,
    bound_error_under,
    bound_statements,
    connect_and_begin,
    end_deadline,
    statement_bound_s,
)
from agboss_sql.sql._progress import Progress, feed, send
from agboss_sql.sql._runner import Lane, Translate, driver_connection
from agboss_sql.sql.statements import Result, StatementCache, Step, single

T = TypeVar("T")

PRIORITY_LANE_SIZE = 2
"""Connections of the takes' lane (`Lane.TAKE`)."""
HOLD_LANE_SIZE = 2
"""Connections of the holders' lane (`Lane.HOLD`)."""


class _Lane:
    """Idle connections and a count of open ones, up to `size`."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.idle: list[Any] = []
        self.open = 0
        self.waiting = 0  # checkouts waiting on `available`
        self.available: asyncio.Condition | None = None

    def condition(self) -> asyncio.Condition:
        if self.available is None:
            self.available = asyncio.Condition()
        return self.available


class PoolRunner:
    """Pooled raw connections to one server database (a `_runner.Runner`)."""

    def __init__(
        self,
        dialect: ServerDialect,
        url: URL,
        timeouts: Timeouts,
        cache: StatementCache,
        pool_size: int,
    ) -> None:
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size must be a positive whole number, got {pool_size!r}")
        self.dialect = dialect
        self.url = url
        self.timeouts = timeouts
        self.cache = cache
        self.capabilities: Capabilities = dialect.CAPABILITIES
        self.pinned = False
        self.closed = False
        self._lanes: dict[int, _Lane] = {
            Lane.WORK: _Lane(pool_size),
            Lane.TAKE: _Lane(PRIORITY_LANE_SIZE),
            Lane.HOLD: _Lane(HOLD_LANE_SIZE),
        }
        self._statement_s = statement_bound_s(timeouts)
        # Connections of the engine's committed transactions, kept for the next one.
        self._kept: list[tuple[sa.Connection, AsyncConnection]] = []

    def pin(self, capabilities: Capabilities) -> None:
        """Use `capabilities` from now on: no server's answer changes them any more."""
        self.capabilities = capabilities
        self.pinned = True

    @property
    def open_connections(self) -> int:
        """Connections open now, every lane."""
        return sum(lane.open for lane in self._lanes.values())

    # --- checkout ---------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def connection(self, priority: Lane | bool = False) -> AsyncIterator[Any]:
        """A pooled connection held for the block (as `run` holds one for a step), returned
        after it, dropped when the block failed with the connection in doubt."""
        if self.closed:
            raise StoreUnavailableError("the connection is closed")
        lane = self._lanes[priority]
        raw = await self._checkout(lane)
        reusable = False
        try:
            yield raw
            reusable = True
        except Exception as exc:
            reusable = self._reusable_after(exc, raw)
            raise
        finally:
            await self._checkin(lane, raw, reusable)

    def _reusable_after(self, exc: Exception, raw: Any) -> bool:
        """Whether a connection whose step failed with `exc` may serve another: kept when
        alive and idle (its ROLLBACK done)."""
        return (
            not isinstance(exc, DeadlinePassed)
            and not self.dialect.is_disconnect(exc)
            and self._usable(raw)
        )

    def _usable(self, raw: Any) -> bool:
        try:
            return bool(self.dialect.is_usable(raw))
        except Exception:
            return False

    async def _checkout(self, lane: _Lane) -> Any:
        """An idle connection still usable, else a new one while fewer than the lane's size
        are open, else the next one returned, waiting at most `pool_ms`."""
        # Fast path: an idle connection and no checkout waiting for one (which it would
        # overtake). No await until it is checked, so nothing else takes it meanwhile.
        while lane.idle and not lane.waiting and not self.closed:
            raw = lane.idle.pop()
            if self._usable(raw):
                return raw
            await self._discard(lane, raw)
        available = lane.condition()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeouts.pool_ms / 1000
        while True:
            async with available:
                try:
                    while not self.closed and not lane.idle and lane.open >= lane.size:
                        remaining = deadline - loop.time()
                        if remaining <= 0:
                            raise StoreTimeoutError(
                                "pool",
                                self.timeouts.pool_ms,
                                f"all {lane.size} pooled connections stayed busy for "
                                f"{self.timeouts.pool_ms} ms (Timeouts.pool_ms); nothing was "
                                "sent",
                            )
                        # `asyncio.timeout`, not `wait_for`: a cancellation that meets the
                        # wake-up must stay a cancellation.
                        lane.waiting += 1
                        try:
                            with contextlib.suppress(TimeoutError):
                                async with asyncio.timeout(remaining):
                                    await available.wait()
                        finally:
                            lane.waiting -= 1
                except BaseException:
                    # Woken and then cancelled (or timed out), this waiter would swallow the
                    # wake-up meant for the connection just returned: pass it on.
                    available.notify()
                    raise
                if self.closed:
                    raise StoreUnavailableError("the connection is closed")
                raw = lane.idle.pop() if lane.idle else None
                if raw is None:
                    lane.open += 1
            if raw is None:
                return await self._connect(lane)
            if self._usable(raw):
                return raw
            await self._discard(lane, raw)

    async def _connect(self, lane: _Lane) -> Any:
        """A new raw connection, for a slot already counted in the lane."""
        bound_s = self.timeouts.connect_ms / 1000
        try:
            async with asyncio.timeout(bound_s):
                raw = await self.dialect.connect(self.url, self.timeouts)
        except BaseException as exc:
            await self._release_slot(lane)
            if isinstance(exc, TimeoutError):
                raise StoreTimeoutError(
                    "connect",
                    self.timeouts.connect_ms,
                    f"no connection to {self._safe_url()} within {self.timeouts.connect_ms} ms "
                    "(Timeouts.connect_ms); nothing was sent",
                ) from exc
            if not isinstance(exc, Exception):
                raise  # cancelled (e.g. a readiness timeout): never turned into an error
            if isinstance(exc, StoreUnavailableError):
                raise  # typed by the dialect (a server setting below the limits)
            raise StoreUnavailableError(
                f"cannot connect to {self._safe_url()}: {type(exc).__name__}: {exc}"
            ) from exc
        if self.closed:
            await self._discard(lane, raw)
            raise StoreUnavailableError("the connection is closed")
        if not self.pinned:
            self.capabilities = self.dialect.capabilities_of(raw)
        return raw

    async def _release_slot(self, lane: _Lane) -> None:
        # The condition's lock is never held across an await: taking it does not suspend,
        # so a cancellation cannot interrupt this bookkeeping.
        available = lane.condition()
        async with available:
            lane.open -= 1
            available.notify()

    async def _discard(self, lane: _Lane, raw: Any) -> None:
        await self._release_slot(lane)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.dialect.close(raw), GRACE_S)

    async def _checkin(self, lane: _Lane, raw: Any, reusable: bool) -> None:
        if reusable and not self.closed:
            lane.idle.append(raw)
            if lane.waiting:
                available = lane.condition()
                async with available:
                    available.notify()
        else:
            await self._discard(lane, raw)

    # --- statements -------------------------------------------------------------------

    async def bounded_execute(
        self, raw: Any, sql: str, params: Mapping[str, Any] | None
    ) -> tuple[list[Any] | None, int]:
        """`dialect.execute` given up `GRACE_S` past the statement bound."""
        answer: tuple[list[Any] | None, int] = await self.bounded(
            self.dialect.execute(raw, sql, params), raw
        )
        return answer

    async def bounded(self, awaitable: Any, raw: Any) -> Any:
        """Await `awaitable` (a call on `raw`) under the statement's client deadline; past
        it, the call is cancelled (the driver drops the connection: see the dialects'
        `connect`), `raw`'s socket closed, and `DeadlinePassed` raised. A cancellation by
        the caller stays a cancellation (and closes `raw` too)."""
        deadline = StatementDeadline(self._statement_s)
        deadline.arm()
        try:
            return await awaitable
        except asyncio.CancelledError:
            self.dialect.abort(raw)
            if not deadline.passed():
                raise
            raise self._deadline_passed() from None
        finally:
            deadline.disarm()

    def _deadline_passed(self) -> DeadlinePassed:
        return DeadlinePassed(
            f"no answer from {self._safe_url()} within {self.timeouts.statement_ms} ms "
            "(Timeouts.statement_ms)"
        )

    async def run(
        self, step: Step[T], transaction: bool, progress: Progress, priority: Lane | bool
    ) -> T:
        """Run `step` on a pooled connection, returned when the step ends, dropped when the
        step failed with the connection in doubt."""
        if self.closed:
            raise StoreUnavailableError("the connection is closed")
        lane = self._lanes[priority]
        raw = await self._checkout(lane)
        reusable = False
        try:
            answer = await self.drive(raw, step, transaction, progress)
            reusable = True
            return answer
        except Exception as exc:
            reusable = self._reusable_after(exc, raw)
            raise
        finally:
            # Cancelled mid-statement, the protocol state is unknown: the connection goes.
            await self._checkin(lane, raw, reusable)

    async def run_one(
        self,
        statement: Any,
        params: Mapping[str, Any],
        progress: Progress,
        priority: Lane | bool,
    ) -> Result:
        """One statement alone, in autocommit: `run` of a one-statement step without the
        step (the hot path of single-statement operations), with the same bounds, the same
        `progress` and the same fate for the connection."""
        if self.closed:
            raise StoreUnavailableError("the connection is closed")
        lane = self._lanes[priority]
        raw = await self._checkout(lane)
        reusable = False
        try:
            try:
                result = await send(
                    self.cache, statement, params, raw, self.bounded_execute, progress
                )
            except Exception:
                if progress.in_script:
                    # The server stopped the script at the failed statement with its
                    # transaction open: the connection goes (see `drive`).
                    self.dialect.abort(raw)
                raise
            reusable = True
            return result
        except Exception as exc:
            reusable = self._reusable_after(exc, raw)
            raise
        finally:
            await self._checkin(lane, raw, reusable)

    async def drive(self, raw: Any, step: Step[T], transaction: bool, progress: Progress) -> T:
        """Run `step` on `raw` (in a transaction of its own when `transaction`, rolled back
        when the step or a statement raises). After a cancellation or a passed deadline no
        `ROLLBACK` is sent (the connection may be mid-statement): `raw` is dropped."""
        cache = self.cache
        bounded = self.bounded
        text = self.dialect.run_text
        if transaction:
            if cache.listeners:
                cache.notify(self.dialect.BEGIN, {})
            await bounded(text(raw, self.dialect.BEGIN), raw)
        try:
            answer = await feed(cache, step, raw, self.bounded_execute, progress)
            if transaction:
                if cache.listeners:
                    cache.notify("COMMIT", {})
                progress.committing = True
                await bounded(text(raw, "COMMIT"), raw)
        except DeadlinePassed:
            step.close()
            raise
        except Exception:
            step.close()
            if progress.in_script:
                # The server stopped the script at the failed statement with its transaction
                # open: the connection goes, and the server rolls the transaction back.
                self.dialect.abort(raw)
            # A failed COMMIT ended the transaction already.
            if transaction and not progress.committing:
                if cache.listeners:
                    cache.notify("ROLLBACK", {})
                with contextlib.suppress(Exception):
                    await bounded(text(raw, "ROLLBACK"), raw)
            raise
        except BaseException:
            step.close()
            raise
        return answer

    async def drive_on(self, connection: AsyncConnection, step: Step[T]) -> T:
        """Run `step`'s statements on the driver connection under `connection`, in the
        transaction the caller holds open on it, each under the client deadline; past it,
        `connection` is invalidated (its socket is gone) and `DeadlinePassed` raised."""
        raw = await driver_connection(connection)
        try:
            return await feed(self.cache, step, raw, self.bounded_execute, Progress())
        except DeadlinePassed:
            await connection.invalidate()
            raise

    async def execute_on(
        self, connection: AsyncConnection, statement: Any, params: Mapping[str, Any]
    ) -> Result:
        """`drive_on` of the one-statement step."""
        return await self.drive_on(connection, single(statement, params)())

    # --- the engine, for the work's transactions -----------------------------------------

    def create_engine(self, url: URL, options: dict[str, Any]) -> AsyncEngine:
        """The engine of `options` (their `async_creator` opens the driver's connections),
        each connection opened within `connect_ms` and each statement under the client
        deadline of `transaction()`."""
        options = {**options, "async_creator": self._bounded_creator(options["async_creator"])}
        engine = create_async_engine(url, **options)
        bound_statements(engine)
        return engine

    async def _bounded_checkout(self, engine: AsyncEngine, deadline: StatementDeadline) -> Any:
        """`connect_and_begin` within `pool_ms`, `connect_ms` and a statement's bound: a new
        connection's set-up by SQLAlchemy (its first-connect and on-connect questions, sent
        after the bounded creator returned) has no client deadline of its own, and a server
        frozen at that instant held it until it woke. Past the bound the checkout is
        cancelled (the half-made connection is closed by the pool) and `StoreTimeoutError`
        raised: nothing of the caller's was sent."""
        timeouts = self.timeouts
        bound_s = (timeouts.pool_ms + timeouts.connect_ms) / 1000 + self._statement_s
        bound = asyncio.timeout(bound_s)
        try:
            async with bound:
                return await greenlet_spawn(connect_and_begin, engine.sync_engine, deadline)
        except Exception as exc:
            # Past the bound, whatever came out is the cancellation's doing: SQLAlchemy's
            # set-up may raise another error in its place (its handlers, its clean-up).
            if not isinstance(exc, TimeoutError) and not bound.expired():
                typed = bound_error_under(exc)  # a pooler's wait ended by its own bound
                if typed is None:
                    raise
                raise typed from exc
            raise StoreTimeoutError(
                "connect",
                timeouts.connect_ms,
                f"no connection to {self._safe_url()} set up within {bound_s:.1f} s "
                "(Timeouts.pool_ms + connect_ms + the statement bound); nothing was sent",
            ) from (None if isinstance(exc, TimeoutError) else exc)

    def _bounded_creator(self, create: Callable[[], Any]) -> Callable[[], Any]:
        """`create` (a new driver connection for the engine) bounded by `connect_ms`."""
        bound_ms = self.timeouts.connect_ms
        where = self._safe_url()

        async def bounded() -> Any:
            try:
                async with asyncio.timeout(bound_ms / 1000):
                    return await create()
            except TimeoutError:
                raise StoreTimeoutError(
                    "connect",
                    bound_ms,
                    f"no connection to {where} within {bound_ms} ms (Timeouts.connect_ms); "
                    "nothing was sent",
                ) from None

        return bounded

    def transaction_engine(self, engine: Callable[[], AsyncEngine]) -> sa.Engine:
        """`engine().sync_engine`."""
        return engine().sync_engine

    @contextlib.asynccontextmanager
    async def transaction(
        self, engine: Callable[[], AsyncEngine], translate: Translate
    ) -> AsyncIterator[AsyncConnection]:
        """A transaction on a connection of `engine()` (SQLAlchemy's `BEGIN`/`COMMIT`/
        `ROLLBACK`): the connection the last committed transaction kept, else one checked out
        and begun in one hop into SQLAlchemy's greenlet. Each statement is under the client
        deadline, COMMIT and ROLLBACK too; a connection a cancellation or a disconnect left
        in doubt is dropped, never reused. Failures are typed by `translate`, but for a
        transient conflict, which passes through for the caller's retry."""
        progress = Progress()
        progress.sent_write = True
        deadline = StatementDeadline(self._statement_s)
        kept = self._kept
        try:
            the_engine = engine()
            if kept:
                # A connection the last transaction left idle (no BEGIN is sent: the driver
                # begins with the first statement).
                sync, connection = kept.pop()
                sync.info[ENGINE_DEADLINE] = deadline
                sync.begin()
            else:
                sync = await self._bounded_checkout(the_engine, deadline)
                connection = AsyncConnection(the_engine, sync)
            # The info dict lives with the driver connection, across checkouts: the
            # deadline is this transaction's only while it runs.
            info = sync.info
            try:
                try:
                    yield connection
                except BaseException as exc:
                    end_deadline(info, deadline)
                    if self._unusable_after(exc):
                        await self._drop(connection)
                    else:
                        with contextlib.suppress(Exception):
                            await self._bounded_on(connection, connection.rollback)
                    raise
                end_deadline(info, deadline)
                progress.committing = True
                try:
                    await self._bounded_on(connection, connection.commit)
                except BaseException as exc:
                    if self._unusable_after(exc):
                        await self._drop(connection)
                    raise
                if len(kept) < _KEPT_CONNECTIONS and not self.closed:
                    # Kept checked out for the next transaction: no pool round trip.
                    kept.append((sync, connection))
                    return
            finally:
                end_deadline(info, deadline)
                if not sync.closed and (sync, connection) not in kept:
                    await greenlet_spawn(sync.close)
        except asyncio.CancelledError:
            # The statement deadline cancelled the task: a typed error, unless its caller
            # cancelled it too (then the caller's cancellation wins).
            if not deadline.passed():
                raise
            raise translate(self._deadline_passed(), progress) from None
        except Exception as exc:
            if self.dialect.is_retryable(exc):
                raise
            typed = translate(exc, progress)
            if typed is exc:
                raise  # typed already (its own cause kept)
            raise typed from exc

    def _unusable_after(self, exc: BaseException) -> bool:
        """Whether an engine connection must never be handed out again after `exc`: a
        cancellation may have left it mid-statement (aiomysql then answers every later call
        on it with "Cancelled during execution"), and a disconnect left nothing to reuse."""
        if isinstance(exc, asyncio.CancelledError):
            return True
        return isinstance(exc, Exception) and self.dialect.is_disconnect(exc)

    async def _drop(self, connection: AsyncConnection) -> None:
        """Close the driver connection under `connection` at once (no ROLLBACK on it: the
        server rolls the session's transaction back when the socket closes) and invalidate
        it, so the pool opens a fresh one; each part bounded by `GRACE_S`."""
        with contextlib.suppress(Exception):
            raw = (await connection.get_raw_connection()).driver_connection
            await asyncio.wait_for(self.dialect.close(raw), GRACE_S)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.invalidate(), GRACE_S)

    async def _bounded_on(self, connection: AsyncConnection, call: Callable[[], Any]) -> None:
        """`await call()` (a COMMIT or ROLLBACK on `connection`) under the client deadline;
        past it, `connection` is invalidated."""
        raw = await driver_connection(connection)
        try:
            await self.bounded(call(), raw)
        except DeadlinePassed:
            await connection.invalidate()
            raise

    # --- closing ----------------------------------------------------------------------

    def _safe_url(self) -> str:
        return self.url.render_as_string(hide_password=True)

    async def close(self) -> None:
        """Close the idle connections of every lane and the engine connections kept for the
        next transaction; checkouts waiting for a connection fail at once."""
        self.closed = True
        for lane in self._lanes.values():
            idle, lane.idle = lane.idle, []
            lane.open -= len(idle)
            if lane.available is not None:
                async with lane.available:
                    lane.available.notify_all()  # waiters for a connection fail now
            for raw in idle:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.dialect.close(raw), GRACE_S)
        kept, self._kept = self._kept, []
        for sync, _ in kept:
            with contextlib.suppress(Exception):
                await greenlet_spawn(sync.close)

    def forget(self) -> None:
        self.closed = True
        for lane in self._lanes.values():
            idle, lane.idle = lane.idle, []
            lane.open -= len(idle)
            for raw in idle:
                with contextlib.suppress(Exception):
                    self.dialect.close_without_loop(raw)


_KEPT_CONNECTIONS = 1
"""How many of the engine's connections `transaction()` keeps checked out while idle, for the
next transaction (the rest of the pool stays free for other users of the engine)."""
