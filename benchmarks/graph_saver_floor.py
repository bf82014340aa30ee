"""The two savers `graph_saver_bench.py` measures the official savers against, besides ours:

- `FreeSaver`, *the graph alone*: a saver that costs nothing. The official saver's time over
  it is the most any saver could reach on a path.
- `DurableFloorSaver`, *the durable floor*: the least a saver can do that keeps LangGraph's
  promise and stores each new channel version whole, as the official savers do. A sync call
  returns only once what it was given is committed: each `put` serializes its new versions'
  values and the rest of its checkpoint, each `put_writes` its writes, with the graph's
  serializer, and commits them as one `INSERT` in autocommit on the raw driver (stdlib
  `sqlite3` in WAL at `synchronous=NORMAL`, psycopg, PyMySQL), into one table keyed for the
  reads a saver must answer. It reads back from memory, as `FreeSaver` does: it never
  decodes, never looks a checkpoint up, and keeps no history a new process could read. The
  official saver's time over it is the most a saver that commits each call before it returns
  could reach on a sync write path. A saver that stores less than each new version whole
  (ours appends a grown list's new items) can go under it where versions grow, as the chat's
  messages do; the 4-node graph's small state leaves little to save that way.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from sqlalchemy.engine import URL

FLOOR_TABLE = "bench_durable_floor"


class FreeSaver(BaseCheckpointSaver[int]):
    """A saver that costs nothing: it keeps the objects it is given, neither serialized nor
    copied, in a dict shared by every instance made over it, and hands them back. Time with
    it is the graph's own; no saver can go under it."""

    def __init__(self, kept: dict[tuple[str, str], dict[str, Any]] | None = None) -> None:
        super().__init__()
        self.kept: dict[tuple[str, str], dict[str, Any]] = {} if kept is None else kept

    @staticmethod
    def _where(config: Any) -> tuple[tuple[str, str], str | None]:
        c = config["configurable"]
        return (c["thread_id"], c.get("checkpoint_ns", "")), c.get("checkpoint_id")

    def get_tuple(self, config: Any) -> Any:
        key, wanted = self._where(config)
        tuples = self.kept.get(key)
        if not tuples:
            return None
        if wanted is None:
            return tuples[next(reversed(tuples))]
        return tuples.get(wanted)

    def list(
        self, config: Any, *, filter: Any = None, before: Any = None, limit: int | None = None
    ) -> Iterator[Any]:
        from langgraph.checkpoint.base import CheckpointTuple

        if config is None:
            return
        key, _ = self._where(config)
        stop = before["configurable"]["checkpoint_id"] if before else None
        passed = stop is None
        given = 0
        for checkpoint_id in reversed(list(self.kept.get(key, {}))):
            if not passed:
                passed = checkpoint_id == stop
                continue
            if limit is not None and given >= limit:
                return
            given += 1
            found: CheckpointTuple = self.kept[key][checkpoint_id]
            yield found

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        from langgraph.checkpoint.base import CheckpointTuple

        key, parent = self._where(config)
        saved: Any = {
            "configurable": {
                "thread_id": key[0],
                "checkpoint_ns": key[1],
                "checkpoint_id": checkpoint["id"],
            }
        }
        parent_config = (
            {"configurable": {**saved["configurable"], "checkpoint_id": parent}} if parent else None
        )
        self.kept.setdefault(key, {})[checkpoint["id"]] = CheckpointTuple(
            saved, checkpoint, metadata, parent_config, []
        )
        return saved

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        key, checkpoint_id = self._where(config)
        found = self.kept.get(key, {}).get(checkpoint_id or "")
        if found is not None:
            found.pending_writes.extend((task_id, channel, value) for channel, value in writes)

    async def aget_tuple(self, config: Any) -> Any:
        return self.get_tuple(config)

    async def alist(
        self, config: Any, *, filter: Any = None, before: Any = None, limit: int | None = None
    ) -> AsyncIterator[Any]:
        for found in self.list(config, filter=filter, before=before, limit=limit):
            yield found

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: Any, writes: Any, task_id: str, task_path: str = ""
    ) -> None:
        self.put_writes(config, writes, task_id, task_path)


class DurableFloorSaver(FreeSaver):
    """The least a durable sync saver does (the module's docstring): each write call is
    serialized and committed, one `INSERT` a call, before it returns. Connections: a pool on
    a server (LangGraph calls from several executor threads at once), a call taking an idle
    one or opening one; one shared under a lock on SQLite, whose writers take turns anyway. Sync calls only: the async
    methods would block the event loop, so the benchmark runs it on the sync write paths."""

    def __init__(self, url: URL, kept: dict[tuple[str, str], dict[str, Any]] | None = None) -> None:
        super().__init__(kept)
        self.url = url
        self.backend = url.get_backend_name()
        self._lock = threading.Lock()
        self._opened: list[Any] = []
        self._idle: list[Any] = []
        marks = "?" if self.backend == "sqlite" else "%s"
        verb = {
            "sqlite": "INSERT OR REPLACE INTO",
            "postgresql": "INSERT INTO",
        }.get(self.backend, "REPLACE INTO")
        tail = " ON CONFLICT DO NOTHING" if self.backend == "postgresql" else ""
        self._row = f"({', '.join([marks] * 6)})"
        self._insert = (
            f"{verb} {FLOOR_TABLE} (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, body) "
            "VALUES {rows}" + tail
        )
        # The first connection creates the table, before any call (calls open more at once).
        first = self._connect(create=True)
        self._opened.append(first)
        if self.backend != "sqlite":
            self._idle.append(first)

    # --- connections ----------------------------------------------------------------------

    def _connect(self, *, create: bool = False) -> Any:
        """A new connection in autocommit; `create`: the table created if absent."""
        blob = {"sqlite": "BLOB", "postgresql": "BYTEA"}.get(self.backend, "LONGBLOB")
        table = (
            f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} (thread_id VARCHAR(64) NOT NULL, "
            "checkpoint_ns VARCHAR(64) NOT NULL, checkpoint_id VARCHAR(64) NOT NULL, "
            f"task_id VARCHAR(64) NOT NULL, idx INTEGER NOT NULL, body {blob} NOT NULL, "
            "PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx))"
        )
        if self.backend == "sqlite":
            raw: Any = sqlite3.connect(
                self.url.database or "", isolation_level=None, check_same_thread=False
            )
            raw.execute("PRAGMA journal_mode=WAL")
            raw.execute("PRAGMA synchronous=NORMAL")
            if create:
                raw.execute(table)
        elif self.backend == "postgresql":
            import psycopg

            plain = self.url.set(drivername="postgresql")
            raw = psycopg.connect(
                plain.render_as_string(hide_password=False), autocommit=True, connect_timeout=10
            )
            if create:
                raw.execute(table)
        else:
            import pymysql

            raw = pymysql.connect(
                host=self.url.host or "127.0.0.1",
                port=self.url.port or 3306,
                user=self.url.username or "root",
                password=self.url.password or "",
                database=self.url.database,
                autocommit=True,
                binary_prefix=True,
                connect_timeout=10,
                read_timeout=60,
                write_timeout=60,
            )
            if create:
                with raw.cursor() as cursor:
                    cursor.execute(table)
        return raw

    def _commit(self, rows: list[tuple[Any, ...]]) -> None:
        """`rows` in one INSERT, committed before this returns (autocommit)."""
        sql = self._insert.format(rows=", ".join([self._row] * len(rows)))
        flat = [value for row in rows for value in row]
        if self.backend == "sqlite":
            with self._lock:
                self._shared().execute(sql, flat)
            return
        with self._lock:
            raw = self._idle.pop() if self._idle else None
        if raw is None:
            raw = self._connect()
            with self._lock:
                self._opened.append(raw)
        if self.backend == "postgresql":
            raw.execute(sql, flat)
        else:
            with raw.cursor() as cursor:
                cursor.execute(sql, flat)
        with self._lock:
            self._idle.append(raw)

    def _shared(self) -> Any:
        """SQLite's one connection (called under `_lock`)."""
        return self._opened[0]

    def close(self) -> None:
        with self._lock:
            opened, self._opened, self._idle = self._opened, [], []
        for raw in opened:
            with contextlib.suppress(Exception):
                raw.close()

    # --- the write calls ----------------------------------------------------------------

    def _body(self, value: Any) -> bytes:
        kind, data = self.serde.dumps_typed(value)
        return kind.encode() + b"\0" + data

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        key, _ = self._where(config)
        # As the official savers store a checkpoint: its new channel versions' values, whole,
        # and the rest of it with its metadata.
        values = checkpoint["channel_values"]
        changed = {channel: values[channel] for channel in new_versions if channel in values}
        body = self._body({**checkpoint, "channel_values": changed}) + self._body(metadata)
        self._commit([(key[0], key[1], checkpoint["id"], "", -1, body)])
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        key, checkpoint_id = self._where(config)
        rows = [
            (key[0], key[1], checkpoint_id or "", task_id, index, self._body(value))
            for index, (_, value) in enumerate(writes)
        ]
        if rows:
            self._commit(rows)
        super().put_writes(config, writes, task_id, task_path)
