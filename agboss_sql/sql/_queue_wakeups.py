"""`NotifiedWakeups`: an idle claimer told that children were queued, where the database
notifies (PostgreSQL `LISTEN`/`NOTIFY`, `Capabilities.notifications`).

The child queue's transactions that make a child claimable (`enqueue`, `enqueue_many`, the
finish that moves a waiting parent back to `queued`) send `pg_notify` on `WAKE_CHANNEL`;
PostgreSQL delivers it when (and only if) the transaction commits. A listener holds one
connection of its own (not the pool's: a listening session must stay open and idle), opened
at its first wait, which `LISTEN`s and then waits for a notification at most as long as its
caller's poll would. Every wait is bounded: the connection's opening by `Timeouts.connect_ms`,
each wait by its `timeout_ms`. A listener that cannot listen (the server away, its
connection lost) answers False once its wait's time ran out, drops its connection and opens
a new one at a later wait (not sooner than `_REOPEN_S` after the last try): the caller's
poll is the fallback and nothing depends on a notification arriving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from agboss_sql._dialects import _pg_pooling, server_dialect
from agboss_sql.contracts.stores import QueueWakeups
from agboss_sql.sql._queue_batch import WAKE_CHANNEL
from agboss_sql.sql.connection import SqlConnection

logger = logging.getLogger("agboss_sql.sql")

_REOPEN_S = 1.0
"""The least time between two attempts to open a listening connection."""


class NotifiedWakeups(QueueWakeups):
    """One claimer's listener on the child queue's notifications (see the module)."""

    def __init__(self, connection: SqlConnection) -> None:
        self._url = connection.url
        self._timeouts = connection.timeouts
        self._driver = server_dialect(connection.url.get_backend_name())
        self._raw: Any = None
        self._next_open = 0.0
        self._closed = False
        self.listening = False
        """Whether a listening connection is open (for tests and status)."""

    @classmethod
    def of(cls, connection: SqlConnection) -> NotifiedWakeups | None:
        """A listener for `connection`'s database, or `None` where no session can listen:
        no notifications, or a transaction pooler between (it lends its sessions)."""
        if not connection.capabilities.notifications:
            return None
        if _pg_pooling.pooling_of(connection.url) is not None:
            return None
        return cls(connection)

    async def _open(self) -> bool:
        loop = asyncio.get_running_loop()
        if self._raw is not None:
            return True
        if self._closed or loop.time() < self._next_open:
            return False
        self._next_open = loop.time() + _REOPEN_S
        raw = None
        try:
            async with asyncio.timeout(self._timeouts.connect_ms / 1000 * 2):
                raw = await self._driver.connect(self._url, self._timeouts)
                can_listen = getattr(self._driver, "can_listen", None)
                if can_listen is not None and not can_listen(raw):
                    # Behind a transaction pooler no session stays to listen: poll only.
                    self._closed = True
                    self._driver.abort(raw)
                    return False
                await self._driver.run_text(raw, f"LISTEN {WAKE_CHANNEL}")
        except Exception as exc:
            logger.info("could not listen for queued children (polling meanwhile): %s", exc)
            if raw is not None:
                self._driver.abort(raw)
            return False
        self._raw = raw
        self.listening = True
        return True

    def _drop(self) -> None:
        raw, self._raw = self._raw, None
        self.listening = False
        if raw is not None:
            with contextlib.suppress(Exception):
                self._driver.abort(raw)

    async def wait(self, timeout_ms: int) -> bool:
        """Wait at most `timeout_ms` for children queued since the last call: True when a
        notification came, False when the time ran out or nothing could be listened to (see
        the module)."""
        timeout_s = max(0.0, timeout_ms / 1000)
        loop = asyncio.get_running_loop()
        ends = loop.time() + timeout_s
        if not await self._open():
            await asyncio.sleep(max(0.0, ends - loop.time()))
            return False
        try:
            # The driver's wait is bounded by its timeout; the outer bound covers a wait
            # stuck on a connection whose server went away without a word.
            async with asyncio.timeout(timeout_s + self._timeouts.connect_ms / 1000):
                return await self._driver.wait_notification(self._raw, max(0.0, ends - loop.time()))
        except Exception as exc:
            logger.info("the listener for queued children failed (polling meanwhile): %s", exc)
            self._drop()
            await asyncio.sleep(max(0.0, ends - loop.time()))
            return False

    async def close(self) -> None:
        """Stop listening: the listening connection is closed (bounded to 2 s)."""
        self._closed = True
        raw, self._raw = self._raw, None
        self.listening = False
        if raw is None:
            return
        try:
            async with asyncio.timeout(2):
                await self._driver.close(raw)
        except Exception:
            self._driver.abort(raw)


__all__ = ["NotifiedWakeups"]
