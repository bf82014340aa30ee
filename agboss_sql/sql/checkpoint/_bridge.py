"""Which connection a saver call uses, on whichever event loop or thread it comes from.

A `SqlConnection` belongs to the event loop that opened its connections (an asyncio lock,
condition or socket bound to one loop fails or hangs on another). LangGraph apps call one
saver from several loops (a graph under one `asyncio.run`, then under another; a sync graph
in a worker thread beside an async one), so the saver keeps one connection per loop:

- the *home* loop (the first loop an async method runs on, or the bridge's loop when the
  saver owns its connection and is first used synchronously) uses the saver's connection;
- any other loop gets a connection of its own to the same database (`for_another_loop`),
  opened on first use there and dropped once that loop is closed.

Synchronous methods (`put`, `get_tuple`, `list`, ...) are called by LangGraph from any
thread, with or without a running loop. While the home loop runs on another thread, a
sync call runs there, on the saver's connection (what LangGraph's own async savers do: no
second pool, no thread of ours). Otherwise (no home loop yet, the home loop ended, the
call comes from the home loop's own thread, or the home loop does not start the call within
`HOME_START_S` because its thread is blocked, as by a sync graph run on it) it runs on an
event loop the bridge owns, on a daemon thread started on first use.

Every wait of a sync caller is bounded: a call whose loop stops before answering raises
`StoreUnavailableError` instead of waiting forever, and `close()` lets calls in flight on
the bridge's loop finish for at most `CLOSE_GRACE_S`, then cancels them (their callers get
`StoreUnavailableError`, or `CommitOutcomeUnknownError` for a write).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from agboss_sql.contracts.errors import CommitOutcomeUnknownError, StoreUnavailableError
from agboss_sql.sql.connection import SqlConnection

T = TypeVar("T")

CLOSE_GRACE_S = 5.0
"""How long `close()` lets a sync call in flight on the bridge's loop finish before
cancelling it."""

HOME_START_S = 1.0
"""How long a sync call waits for the home loop to start it before taking the bridge's loop
(a home loop whose thread is blocked never would)."""

_NOT_TAKEN = object()

_POLL_S = 0.25
"""How often a waiting sync caller checks that the loop running its call is still alive."""

_STOP_S = 10.0
"""How long `close()` waits for the bridge's loop to wind down after cancelling."""


class Pin:
    """The loop a run of sync calls must keep using (a `list()` iteration reads page after
    page through one async generator, which belongs to one loop and connection)."""

    __slots__ = ("loop",)

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None


class SyncBridge:
    """A saver's connections, one per event loop, and the loop its sync methods run on when
    no other can. Shared by a saver's shallow copies (LangGraph's `with_allowlist`), so one
    `close()` stops it for all of them."""

    def __init__(self, connection: SqlConnection) -> None:
        self._connection = connection
        self.owns = False
        """The saver owns `connection` (`from_conn_string`): the bridge's loop may be its home."""
        self._guard = threading.Lock()
        self._home: asyncio.AbstractEventLoop | None = None
        self._others: dict[asyncio.AbstractEventLoop, SqlConnection] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._calls: set[concurrent.futures.Future[Any]] = set()
        self._final = False
        self._home_stalled = False

    # --- which connection -----------------------------------------------------------------

    def here(self) -> SqlConnection:
        """The connection of the running event loop (see the module's docstring)."""
        loop = asyncio.get_running_loop()
        home = self._home
        if loop is home:
            # An async call runs here: the home loop is free again for sync calls.
            self._home_stalled = False
            return self._connection
        return self._claim(loop, claim=home is None)

    def _claim(self, loop: asyncio.AbstractEventLoop, *, claim: bool) -> SqlConnection:
        with self._guard:
            return self._claim_locked(loop, claim=claim)

    def _claim_locked(self, loop: asyncio.AbstractEventLoop, *, claim: bool) -> SqlConnection:
        """`_claim`, the guard held."""
        if self._home is None and claim:
            self._home = loop
        if loop is self._home:
            return self._connection
        found = self._others.get(loop)
        if found is None:
            for stale in [other for other in self._others if other.is_closed()]:
                _forget(self._others.pop(stale))
            found = self._others[loop] = self._connection.for_another_loop()
        return found

    # --- sync calls -----------------------------------------------------------------------

    def run(
        self,
        work: Callable[[SqlConnection], Coroutine[Any, Any, T]],
        *,
        writes: bool = False,
        pin: Pin | None = None,
    ) -> T:
        """`await work(connection)` on the home loop (while it runs on another thread and takes
        the call within `HOME_START_S`) or on the bridge's loop, from any thread; the answer,
        or a typed error within the call's own bounds (the loop stopping or the saver closing
        never leaves the caller waiting)."""
        with self._guard:
            if self._final:
                raise StoreUnavailableError("the checkpoint saver is closed")
            loop = pin.loop if pin is not None else None
            pinned = loop is not None
            if loop is None:
                loop = self._target()
            elif loop.is_closed() or (loop is not self._home and loop is not self._loop):
                raise StoreUnavailableError(
                    "the event loop this listing started on has stopped: list again"
                )
            if pin is not None:
                pin.loop = loop
            on_home = loop is not self._loop
        if on_home:
            answer = self._on_home(loop, work, writes)
            if answer is not _NOT_TAKEN:
                return answer  # type: ignore[return-value]
            # The home loop runs but did not take the call: its thread is blocked (a sync
            # graph run on the loop's own thread, whose saver calls come from LangGraph's
            # worker threads). The bridge serves until an async call shows the loop free.
            with self._guard:
                self._home_stalled = True
                if self._final:
                    raise StoreUnavailableError("the checkpoint saver is closed")
                if pinned:
                    raise StoreUnavailableError(
                        "the event loop this listing started on is blocked: list again"
                    )
                loop = self._target()
                if pin is not None:
                    pin.loop = loop
        with self._guard:
            if self._final:
                raise StoreUnavailableError("the checkpoint saver is closed")
            if loop is not self._loop:
                # close() stopped that loop meanwhile.
                if pin is not None:
                    raise StoreUnavailableError(
                        "the event loop this listing started on has stopped: list again"
                    )
                loop = self._target()
            # The bridge's loop is the home of a connection the saver owns, if nothing came
            # first. Chosen here, not when the call starts: close() closes what it hands out.
            connection = self._claim_locked(loop, claim=self.owns)
            future = asyncio.run_coroutine_threadsafe(work(connection), loop)
            self._calls.add(future)
            future.add_done_callback(self._calls.discard)
            thread = self._thread
            assert thread is not None
        return _wait(future, thread.is_alive, writes)

    def _on_home(
        self,
        loop: asyncio.AbstractEventLoop,
        work: Callable[[SqlConnection], Coroutine[Any, Any, T]],
        writes: bool,
    ) -> T | object:
        """`work` on the home loop, or `_NOT_TAKEN` when the loop did not start it within
        `HOME_START_S` (then it never will: starting and giving up exclude each other)."""
        gate = threading.Lock()
        state = {"started": False, "abandoned": False}
        started = threading.Event()
        connection = self._connection

        async def call() -> T | object:
            with gate:
                if state["abandoned"]:
                    return _NOT_TAKEN
                state["started"] = True
            started.set()
            return await work(connection)

        try:
            future = asyncio.run_coroutine_threadsafe(call(), loop)
        except RuntimeError:  # the loop closed meanwhile
            return _NOT_TAKEN
        if not started.wait(HOME_START_S):
            with gate:
                if not state["started"]:
                    state["abandoned"] = True
                    future.cancel()
                    return _NOT_TAKEN
        return _wait(future, loop.is_running, writes)

    def _target(self) -> asyncio.AbstractEventLoop:
        """Under the guard: the home loop when a sync call may run there, else the bridge's
        loop (started here on first use)."""
        home = self._home
        if (
            home is not None
            and home is not self._loop
            and not self._home_stalled
            and home.is_running()
            and not home.is_closed()
            and asyncio._get_running_loop() is not home
        ):
            return home
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=_serve, args=(loop,), name="agboss-checkpoint-saver", daemon=True
            )
            thread.start()
            self._loop, self._thread = loop, thread
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                "a synchronous SqlCheckpointSaver method was called from the saver's own "
                "event loop: use the async method (aput, aget_tuple, alist, ...)"
            )
        return self._loop

    # --- closing --------------------------------------------------------------------------

    def close(self, *, final: bool = False) -> None:
        """Stop the bridge's loop: calls in flight there get `CLOSE_GRACE_S` to finish, then are
        cancelled; its connection is closed. A later sync call starts a new loop, or (`final`)
        is refused with `StoreUnavailableError`."""
        with self._guard:
            self._final = self._final or final
            loop, thread = self._loop, self._thread
            calls = list(self._calls)
            if loop is None or thread is None:
                return
            if threading.current_thread() is thread:
                raise RuntimeError(
                    "close() was called from the saver's own event loop: use aclose()"
                )
            self._loop = self._thread = None
            own = self._others.pop(loop, None)
            if loop is self._home:
                # The saver's own connection lived on this loop: it closes with it.
                own = self._connection
        shutdown = asyncio.run_coroutine_threadsafe(_shutdown(calls, own), loop)
        with contextlib.suppress(Exception):
            shutdown.result(timeout=CLOSE_GRACE_S + _STOP_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=_STOP_S)
        if not thread.is_alive():
            loop.close()

    def _take_connections(
        self, *, home: bool
    ) -> list[tuple[asyncio.AbstractEventLoop | None, SqlConnection]]:
        """Remove and answer the other loops' connections (and, `home`, the
        saver's own), each with the loop it belongs to."""
        with self._guard:
            others = [loop for loop in self._others if loop is not self._loop]
            taken: list[tuple[asyncio.AbstractEventLoop | None, SqlConnection]] = [
                (loop, self._others.pop(loop)) for loop in others
            ]
            if home:
                taken.append((self._home, self._connection))
        return taken

    async def aclose_connections(self, *, home: bool) -> None:
        """Close the connections of other loops (and, `home`, the saver's own), each on its
        loop while that loop runs; one whose loop has ended is closed here, best effort (its
        sockets belonged to that loop)."""
        here = asyncio.get_running_loop()
        for loop, connection in self._take_connections(home=home):
            if loop is not None and loop.is_closed():
                _forget(connection)
                continue
            with contextlib.suppress(Exception):
                if loop is None or loop is here or not loop.is_running():
                    await asyncio.wait_for(connection.close(), _STOP_S)
                else:
                    closing = asyncio.run_coroutine_threadsafe(connection.close(), loop)
                    await asyncio.wait_for(asyncio.wrap_future(closing), _STOP_S)

    def close_connections(self, *, home: bool) -> None:
        """`aclose_connections` from synchronous code (on a short-lived thread of its own, so
        it works with or without a running loop here)."""
        taken = self._take_connections(home=home)
        if not taken:
            return

        def close_all() -> None:
            async def each() -> None:
                for loop, connection in taken:
                    if loop is not None and loop.is_closed():
                        _forget(connection)
                        continue
                    with contextlib.suppress(Exception):
                        if loop is not None and loop.is_running():
                            closing = asyncio.run_coroutine_threadsafe(connection.close(), loop)
                            await asyncio.wait_for(asyncio.wrap_future(closing), _STOP_S)
                        else:
                            await asyncio.wait_for(connection.close(), _STOP_S)

            asyncio.run(each())

        closer = threading.Thread(target=close_all, name="agboss-checkpoint-close", daemon=True)
        closer.start()
        closer.join(timeout=2 * _STOP_S)


def _forget(connection: SqlConnection) -> None:
    """Close a connection whose event loop has ended, without that loop (a driver's own
    close would schedule work on the dead loop, and its finalizer complain about it later)."""
    with contextlib.suppress(Exception):
        connection.forget()


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


async def _shutdown(calls: list[concurrent.futures.Future[Any]], own: SqlConnection | None) -> None:
    """On the bridge's loop: let `calls` finish for `CLOSE_GRACE_S`, cancel what remains, wait
    for the cancellations to land (bounded), close `own`."""
    waiting = [asyncio.wrap_future(call) for call in calls]
    if waiting:
        _, pending = await asyncio.wait(waiting, timeout=CLOSE_GRACE_S)
        if pending:
            for call in calls:
                call.cancel()
            await asyncio.wait(pending, timeout=_STOP_S)
    if own is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(own.close(), _STOP_S)


def _wait(future: concurrent.futures.Future[T], alive: Callable[[], bool], writes: bool) -> T:
    """The answer of a call submitted to a loop, never waiting once that loop stopped
    (`alive()` false)."""
    while True:
        try:
            return future.result(timeout=_POLL_S)
        except concurrent.futures.TimeoutError:
            if alive() or future.done():
                continue
            future.cancel()
            raise _closed_during(writes) from None
        except concurrent.futures.CancelledError:
            raise _closed_during(writes) from None


def _closed_during(writes: bool) -> Exception:
    if writes:
        return CommitOutcomeUnknownError(
            "the checkpoint saver was closed (or its event loop stopped) while this write "
            "ran: it may or may not have been applied; write again once a saver is open"
        )
    return StoreUnavailableError(
        "the checkpoint saver was closed (or its event loop stopped) while this call ran"
    )
