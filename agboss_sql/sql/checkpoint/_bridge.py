"""The saver's synchronous side: its async methods run on an event loop of its own.

LangGraph calls `put`, `get_tuple`, `list`, ... from synchronous graphs, on any thread and
with or without a running loop. The bridge runs the async method on a loop it owns, on a
daemon thread started on first use; that loop has its own `SqlConnection` to the same
database (`for_another_loop`: connections belong to the loop that opened them), closed by
`close()`. After `close(final=True)` (the saver closed with the connection it owns) a
synchronous call is refused, as an async one is by the closed connection.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from agboss_sql.contracts.errors import StoreUnavailableError
from agboss_sql.sql.connection import SqlConnection

T = TypeVar("T")


class SyncBridge:
    """The saver's synchronous side: an event loop on a daemon thread of its own (started on
    first use) and the connection that loop uses. Shared by a saver's shallow copies
    (LangGraph's `with_allowlist`), so one `close()` stops it for all of them."""

    def __init__(self, connection: SqlConnection) -> None:
        self._connection = connection
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._own: SqlConnection | None = None
        self._final = False

    def run(self, work: Callable[[SqlConnection], Coroutine[Any, Any, T]]) -> T:
        """`await work(connection)` on the bridge's loop, from any thread but that loop's."""
        with self._guard:
            if self._final:
                raise StoreUnavailableError("the checkpoint saver is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=self._serve, args=(loop,), name="agboss-checkpoint-saver", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
                # A connection belongs to the loop that opened it: this loop gets its own.
                self._own = self._connection.for_another_loop()
            loop, connection = self._loop, self._own or self._connection
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                "a synchronous SqlCheckpointSaver method was called from the saver's own "
                "event loop: use the async method (aput, aget_tuple, alist, ...)"
            )
        return asyncio.run_coroutine_threadsafe(work(connection), loop).result()

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()

    def close(self, *, final: bool = False) -> None:
        """Close the loop's own connection and stop the loop: a later call starts anew, or
        (`final`) is refused with `StoreUnavailableError`."""
        with self._guard:
            self._final = self._final or final
            loop, thread, own = self._loop, self._thread, self._own
            self._loop = self._thread = self._own = None
        if loop is None or thread is None:
            return
        if threading.current_thread() is thread:
            raise RuntimeError("close() was called from the saver's own event loop: use aclose()")
        if own is not None:
            asyncio.run_coroutine_threadsafe(own.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
