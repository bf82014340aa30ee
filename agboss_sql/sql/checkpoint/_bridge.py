"""Which connection a saver's async call uses, on whichever event loop it comes from.

A `SqlConnection` belongs to the event loop that opened its connections (an asyncio lock,
condition or socket bound to one loop fails or hangs on another). LangGraph apps call one
saver from several loops (a graph under one `asyncio.run`, then under another; an async
graph beside sync ones in worker threads), so the saver keeps one connection per loop:

- the *home* loop (the first loop an async method runs on) uses the saver's connection;
- any other loop gets a connection of its own to the same database (`for_another_loop`),
  opened on first use there and dropped once that loop is closed.

Synchronous methods use no loop at all: they run on the saver's synchronous driver
connections (`_sync`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from agboss_sql.sql.connection import SqlConnection

_STOP_S = 10.0
"""How long closing a connection of another loop may take."""


class SyncBridge:
    """A saver's connections, one per event loop. Shared by a saver's shallow copies
    (LangGraph's `with_allowlist`)."""

    def __init__(self, connection: SqlConnection) -> None:
        self._connection = connection
        self._guard = threading.Lock()
        self._home: asyncio.AbstractEventLoop | None = None
        self._others: dict[asyncio.AbstractEventLoop, SqlConnection] = {}

    def here(self) -> SqlConnection:
        """The connection of the running event loop (see the module's docstring)."""
        loop = asyncio.get_running_loop()
        if loop is self._home:
            return self._connection
        with self._guard:
            if self._home is None:
                self._home = loop
            if loop is self._home:
                return self._connection
            found = self._others.get(loop)
            if found is None:
                for stale in [other for other in self._others if other.is_closed()]:
                    _forget(self._others.pop(stale))
                found = self._others[loop] = self._connection.for_another_loop()
            return found

    # --- closing --------------------------------------------------------------------------

    def _take_connections(
        self, *, home: bool
    ) -> list[tuple[asyncio.AbstractEventLoop | None, SqlConnection]]:
        """Remove and answer the other loops' connections (and, `home`, the
        saver's own), each with the loop it belongs to."""
        with self._guard:
            taken: list[tuple[asyncio.AbstractEventLoop | None, SqlConnection]] = list(
                self._others.items()
            )
            self._others.clear()
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
        if all(loop is None for loop, _ in taken):
            # Only the saver's own connection, which no async call ever ran on (sync use
            # alone): it has no loop to close on, and nothing a loop would close. No thread
            # and no event loop are started for it (0.2 ms of CPU and wall at load 10).
            for _, connection in taken:
                _forget(connection)
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
