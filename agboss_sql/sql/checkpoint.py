"""`SqlCheckpointSaver`: LangGraph's checkpoint saver on the project's SQL connection.

A real `langgraph.checkpoint.base.BaseCheckpointSaver`: a graph compiled with it
persists and resumes on SQLite, PostgreSQL and MySQL/MariaDB, and any instance
sharing the database can resume another's thread.

Storage (`agboss_checkpoints`, `agboss_checkpoint_blobs`, `agboss_checkpoint_writes`):
a checkpoint row holds the checkpoint without its channel values; each channel value is
stored once per channel version, written by the `put` that introduced the version and
shared by every later checkpoint that still reads it. Values, bodies and pending writes
are serialised with the saver's LangGraph serde (`JsonPlusSerializer` by default);
metadata is JSON text, so `list` filters it in SQL. A pending write is keyed by
(checkpoint, task, index): a retried task does not duplicate it.

Statements per operation (n: more than `MAX_ROWS` new versions or writes take more):

| operation | PostgreSQL | MySQL/MariaDB | SQLite (one thread hop) |
|---|---|---|---|
| `aput` | 1 (blobs folded into the checkpoint upsert with `WITH`) | 1 alone, or BEGIN + 2 + COMMIT with new blobs | 1, or BEGIN + 2 + COMMIT |
| `aput`, fenced | 1 (lease raise folded in) | BEGIN + 3 + COMMIT | BEGIN + 3 + COMMIT |
| `aput_writes` | 1 | 1 (fenced: BEGIN + 2 + COMMIT) | 1 (fenced: BEGIN + 2 + COMMIT) |
| `aget_tuple` | 2: the checkpoint with its writes, then its values (1 without values) | 2 | 2 (one hop) |
| `alist`, per page | 3: checkpoints, their values, their writes | 3 | 3 (one hop) |
| `adelete_thread`, `acopy_thread` | 1 | BEGIN + 3 + COMMIT | BEGIN + 3 + COMMIT |

The latest checkpoint of a thread is read off the primary key (the greatest
`checkpoint_id` of `(thread_id, ns_hash)`), never by scanning its history.

Fencing (`fenced=True`): every `aput` and `aput_writes` raises the lease's fence
token in the same transaction as (on PostgreSQL: the same statement as) the write,
with the statement the fenced-effect store uses on `agboss_execution_leases`. The
write happens only while the lease in the run's config (`configurable["agboss_lease"]`)
is held at its epoch and live by the store's time; otherwise nothing is written and
`ExecutionFencedError` is raised, so an instance that wakes after a takeover cannot
overwrite the new holder's checkpoint.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import sqlalchemy as sa
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from agboss_sql.contracts.clocks import StoreClock
from agboss_sql.contracts.errors import ExecutionFencedError, InvalidIdentifierError
from agboss_sql.contracts.keys import checked_identifier, scope_key_of
from agboss_sql.contracts.types import ApplicationContext, ExecutionLease, LeaseCheck
from agboss_sql.sql._base import identity_hash
from agboss_sql.sql._fence import FenceStatements, refusal_of
from agboss_sql.sql.connection import Exec, SqlBuilder, SqlConnection, Step
from agboss_sql.sql.schema import checkpoint_blobs, checkpoint_writes, checkpoints
from agboss_sql.sql.schema import execution_leases as L

T = TypeVar("T")

C = checkpoints
B = checkpoint_blobs
W = checkpoint_writes

LEASE_KEY = "agboss_lease"
"""The `configurable` key that carries the writer's lease to a fenced saver: an
`ExecutionLease`, or a dict with `tenant_id`, `execution_id` and `lease_epoch`."""

MAX_ROWS = 32
"""Rows per multi-row statement (inserts and keyed look-ups); more take several."""

LIST_PAGE = 100
"""Checkpoints read per statement while listing one namespace of a thread."""

MAX_CHECKPOINT_ID = 64
MAX_VERSION = 128

_CHECKPOINT_KEY = ("thread_id", "ns_hash", "checkpoint_id")
_BLOB_KEY = ("thread_id", "ns_hash", "channel", "version")
_WRITE_KEY = ("thread_id", "ns_hash", "checkpoint_id", "task_id", "idx")
_BLOB_VALUES = ("channel", "version", "value_type", "value")
_CHECKPOINT_VALUES = (
    "checkpoint_ns",
    "parent_checkpoint_id",
    "run_hash",
    "checkpoint_type",
    "checkpoint",
    "metadata",
)
_LISTED = (
    "thread_id",
    "checkpoint_ns",
    "ns_hash",
    "checkpoint_id",
    "parent_checkpoint_id",
    "checkpoint_type",
    "checkpoint",
    "metadata",
)

# Rows of the checkpoint-with-writes read: the checkpoint, then its pending writes.
_CHECKPOINT_ROW = 0
_WRITE_ROW = 1


def _bind(name: str, column: sa.Column[Any]) -> sa.BindParameter[Any]:
    return sa.bindparam(name, type_=column.type)


def _bound(table: sa.Table, columns: Sequence[str], prefix: str) -> dict[str, Any]:
    return {column: _bind(f"{prefix}{column}", table.c[column]) for column in columns}


def _chunks(items: Sequence[T], size: int = MAX_ROWS) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class CheckpointStatements:
    """The saver's statements for one dialect and one kind of store time. Statements whose
    shape depends on a count (rows of a multi-row insert or look-up, metadata filters) are
    built on first use and kept, one per count."""

    def __init__(self, b: SqlBuilder) -> None:
        self.ops = ops = b.ops
        self.fold: bool = b.capabilities.dml_in_with
        self.json_exact: bool = b.capabilities.json_key_exact
        self._cache: dict[tuple[Any, ...], Any] = {}

        # The fence the fenced-effect store makes first (`_fence`): it raises the scope's
        # high-water mark to the token while the lease is held at that token and live by the
        # store's time; one row matched means held. It is the first statement of a fenced
        # write, so the lease row is locked before anything else is written.
        self.fences = FenceStatements(b)
        self.fence = self.fences.fence
        if self.fold:
            fence = self.fence.returning(L.c.lease_epoch).cte("agboss_fence")
            self._fenced: Any = sa.exists(sa.select(fence.c.lease_epoch))

        # The checkpoint with its pending writes, in one statement.
        thread = _bind("thread_id", C.c.thread_id)
        ns_hash = _bind("ns_hash", C.c.ns_hash)
        latest = (
            sa.select(sa.func.max(C.c.checkpoint_id))
            .where(C.c.thread_id == thread, C.c.ns_hash == ns_hash)
            .scalar_subquery()
        )
        self.read_latest = self._with_writes(latest)
        self.read_by_id = self._with_writes(_bind("checkpoint_id", C.c.checkpoint_id))

        self.select_blob_keys = sa.select(B.c.ns_hash, B.c.channel, B.c.version).where(
            B.c.thread_id == _bind("thread_id", B.c.thread_id)
        )
        self.lock_thread = ops.for_update(
            sa.select(C.c.ns_hash, C.c.checkpoint_id)
            .where(C.c.thread_id == thread)
            .order_by(C.c.ns_hash, C.c.checkpoint_id.desc())
        )

        # Whole-thread deletes and copies: one statement where writes fold into `WITH`.
        self.delete_thread = self._thread_statements(
            lambda table: sa.delete(table).where(
                table.c.thread_id == _bind("thread_id", table.c.thread_id)
            )
        )
        self.copy_thread = self._thread_statements(self._copy)

        self.prune_checkpoints = sa.delete(C).where(
            C.c.thread_id == thread,
            C.c.ns_hash == ns_hash,
            C.c.checkpoint_id < _bind("checkpoint_id", C.c.checkpoint_id),
        )
        self.prune_writes = sa.delete(W).where(
            W.c.thread_id == _bind("thread_id", W.c.thread_id),
            W.c.ns_hash == _bind("ns_hash", W.c.ns_hash),
            W.c.checkpoint_id < _bind("checkpoint_id", W.c.checkpoint_id),
        )
        self.orphan_head = (
            sa.update(C)
            .where(
                C.c.thread_id == thread,
                C.c.ns_hash == ns_hash,
                C.c.checkpoint_id == _bind("checkpoint_id", C.c.checkpoint_id),
            )
            .values(parent_checkpoint_id=None)
        )

    # --- statement builders ------------------------------------------------------------

    def _with_writes(self, checkpoint_id: Any) -> Any:
        thread = _bind("thread_id", C.c.thread_id)
        ns_hash = _bind("ns_hash", C.c.ns_hash)
        checkpoint = sa.select(
            sa.literal_column(str(_CHECKPOINT_ROW), sa.Integer).label("kind"),
            C.c.checkpoint_id.label("a"),
            C.c.parent_checkpoint_id.label("b"),
            C.c.metadata.label("c"),
            sa.cast(sa.null(), sa.Integer).label("n"),
            C.c.checkpoint_type.label("t"),
            C.c.checkpoint.label("data"),
        ).where(C.c.thread_id == thread, C.c.ns_hash == ns_hash, C.c.checkpoint_id == checkpoint_id)
        writes = sa.select(
            sa.literal_column(str(_WRITE_ROW), sa.Integer),
            W.c.task_id,
            W.c.channel,
            W.c.task_path,
            W.c.idx,
            W.c.value_type,
            W.c.value,
        ).where(W.c.thread_id == thread, W.c.ns_hash == ns_hash, W.c.checkpoint_id == checkpoint_id)
        return sa.union_all(checkpoint, writes)

    def _thread_statements(self, build: Any) -> list[Any]:
        """The statements of a whole-thread change, in the order a `put` takes its locks
        (values before checkpoints); on a dialect that folds writes into `WITH`, one."""
        writes, blobs, rows = build(W), build(B), build(C)
        if self.fold:
            return [rows.add_cte(writes.cte("agboss_writes"), blobs.cte("agboss_blobs"))]
        return [writes, blobs, rows]

    def _copy(self, table: sa.Table) -> Any:
        columns = [column.name for column in table.c]
        source = sa.select(
            *(
                _bind("target", table.c.thread_id) if name == "thread_id" else table.c[name]
                for name in columns
            )
        ).where(table.c.thread_id == _bind("source", table.c.thread_id))
        keys = [column.name for column in table.primary_key.columns]
        return self.ops.skip_duplicates(self.ops.insert(table).from_select(columns, source), keys)

    def cached(self, key: tuple[Any, ...], build: Any) -> Any:
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = build()
        return found

    def blob_insert(self, count: int, *, fenced: bool) -> Any:
        """Insert `count` blobs of one thread namespace, skipping versions already stored;
        `fenced` (folding dialects only): a `WITH` part written only when the fence held."""
        return self.cached(("blobs", count, fenced), lambda: self._blob_insert(count, fenced))

    def _blob_insert(self, count: int, fenced: bool) -> Any:
        shared = _bound(B, ("thread_id", "ns_hash"), "p_")
        rows = [{**shared, **_bound(B, _BLOB_VALUES, f"b{i}_")} for i in range(count)]
        statement = self.ops.insert(B)
        if fenced:
            table = sa.values(*(sa.column(c, B.c[c].type) for c in _BLOB_VALUES), name="rows")
            table = table.data([tuple(row[c] for c in _BLOB_VALUES) for row in rows])
            selected = sa.select(
                shared["thread_id"], shared["ns_hash"], *(table.c[c] for c in _BLOB_VALUES)
            ).where(self._fenced)
            statement = statement.from_select(["thread_id", "ns_hash", *_BLOB_VALUES], selected)
        else:
            statement = statement.values(rows)
        return self.ops.skip_duplicates(statement, _BLOB_KEY)

    def checkpoint_upsert(self, *, fenced: bool) -> Any:
        """Insert a checkpoint or replace its body and metadata (LangGraph may save one id
        again); `fenced` (folding dialects only): written only when the fence held, and
        returning the key then."""
        return self.cached(("checkpoint", fenced), lambda: self._checkpoint_upsert(fenced))

    def _checkpoint_upsert(self, fenced: bool) -> Any:
        row = _bound(C, (*_CHECKPOINT_KEY, *_CHECKPOINT_VALUES), "p_")
        statement = self.ops.insert(C)
        if fenced:
            statement = statement.from_select(
                list(row), sa.select(*row.values()).where(self._fenced)
            )
        else:
            statement = statement.values(row)
        statement = self.ops.replace_duplicates(
            statement, _CHECKPOINT_KEY, ("run_hash", "checkpoint_type", "checkpoint", "metadata")
        )
        return statement.returning(C.c.checkpoint_id) if fenced else statement

    def put(self, blob_count: int, *, fenced: bool) -> Any:
        """Folding dialects: the blobs (at most `MAX_ROWS`) and the checkpoint in one statement,
        fenced or not."""
        return self.cached(("put", blob_count, fenced), lambda: self._put(blob_count, fenced))

    def _put(self, blob_count: int, fenced: bool) -> Any:
        statement = self.checkpoint_upsert(fenced=fenced)
        if blob_count:
            blobs = self._blob_insert(blob_count, fenced).cte("agboss_new_blobs")
            statement = statement.add_cte(blobs)
        return statement

    def writes_insert(self, count: int, *, replace: bool, fenced: bool) -> Any:
        """Insert `count` pending writes of one checkpoint and task: skipping keys already
        written, or (`replace`) overwriting them; `fenced` (folding dialects only): written
        only when the fence held, returning a row per write then."""
        return self.cached(
            ("writes", count, replace, fenced), lambda: self._writes(count, replace, fenced)
        )

    def _writes(self, count: int, replace: bool, fenced: bool) -> Any:
        shared = _bound(W, ("thread_id", "ns_hash", "checkpoint_id", "task_id", "task_path"), "p_")
        per_row = ("idx", "channel", "value_type", "value")
        rows = [{**shared, **_bound(W, per_row, f"w{i}_")} for i in range(count)]
        columns = list(rows[0])
        statement = self.ops.insert(W)
        if fenced:
            table = sa.values(*(sa.column(c, W.c[c].type) for c in per_row), name="rows")
            table = table.data([tuple(row[c] for c in per_row) for row in rows])
            selected = sa.select(
                *(table.c[c] if c in per_row else shared[c] for c in columns)
            ).where(self._fenced)
            statement = statement.from_select(columns, selected)
        else:
            statement = statement.values(rows)
        if replace:
            statement = self.ops.replace_duplicates(
                statement, _WRITE_KEY, ("channel", "value_type", "value")
            )
        else:
            statement = self.ops.skip_duplicates(statement, _WRITE_KEY)
        return statement.returning(W.c.idx) if fenced else statement

    def keyed(self, table: sa.Table, columns: Sequence[str], key: Sequence[str], count: int) -> Any:
        """Select `columns` of the rows with any of `count` keys (`k<i>_<column>`): a
        `UNION ALL` of one look-up per key, so every dialect probes the primary key once per
        key whatever its statistics say (an `OR` of keys let PostgreSQL scan a thread's
        whole history and filter it)."""
        return self.cached(
            ("keyed", table.name, tuple(columns), tuple(key), count),
            lambda: self._keyed(table, columns, key, count),
        )

    def _keyed(
        self, table: sa.Table, columns: Sequence[str], key: Sequence[str], count: int
    ) -> Any:
        lookups = [
            sa.select(*(table.c[c] for c in columns)).where(
                *(table.c[c] == _bind(f"k{i}_{c}", table.c[c]) for c in key)
            )
            for i in range(count)
        ]
        return lookups[0] if count == 1 else sa.union_all(*lookups)

    def keyed_delete(self, table: sa.Table, key: Sequence[str], count: int) -> Any:
        """Delete the rows with any of `count` keys (`k<i>_<column>`)."""
        return self.cached(
            ("delete", table.name, tuple(key), count),
            lambda: sa.delete(table).where(
                sa.or_(
                    *(
                        sa.and_(*(table.c[c] == _bind(f"k{i}_{c}", table.c[c]) for c in key))
                        for i in range(count)
                    )
                )
            ),
        )

    def listing(self, shape: _ListShape) -> Any:
        """The checkpoints `list` reads for one combination of criteria, newest first."""
        return self.cached(("list", shape), lambda: self._listing(shape))

    def _listing(self, shape: _ListShape) -> Any:
        statement = sa.select(*(C.c[c] for c in _LISTED))
        if shape.thread:
            statement = statement.where(C.c.thread_id == _bind("thread_id", C.c.thread_id))
        if shape.namespace:
            statement = statement.where(C.c.ns_hash == _bind("ns_hash", C.c.ns_hash))
        if shape.checkpoint_id:
            statement = statement.where(
                C.c.checkpoint_id == _bind("checkpoint_id", C.c.checkpoint_id)
            )
        if shape.before:
            statement = statement.where(C.c.checkpoint_id < _bind("before", C.c.checkpoint_id))
        for index in range(shape.filters):
            statement = statement.where(self.ops.json_key_equals(C.c.metadata, index))
        statement = statement.order_by(C.c.checkpoint_id.desc())
        if shape.limit:
            statement = statement.limit(sa.bindparam("limit", type_=sa.Integer))
        return statement

    def run_checkpoints(self, count: int) -> Any:
        """Lock the checkpoints of any of `count` runs (`k<i>_run_hash`)."""
        return self.cached(
            ("runs", count),
            lambda: self.ops.for_update(
                sa.select(C.c.thread_id, C.c.ns_hash, C.c.checkpoint_id).where(
                    C.c.run_hash.in_([_bind(f"k{i}_run_hash", C.c.run_hash) for i in range(count)])
                )
            ),
        )

    def namespace_bodies(self) -> Any:
        """The bodies of every checkpoint of one thread namespace (which versions they read),
        read with a shared lock: what is decided from them holds until the commit."""
        return self.cached(
            ("bodies",),
            lambda: self.ops.for_share(
                sa.select(C.c.checkpoint_type, C.c.checkpoint).where(
                    C.c.thread_id == _bind("thread_id", C.c.thread_id),
                    C.c.ns_hash == _bind("ns_hash", C.c.ns_hash),
                )
            ),
        )

    def namespace_blob_keys(self) -> Any:
        """The blob versions stored for one thread namespace."""
        return self.cached(
            ("blob-keys",),
            lambda: sa.select(B.c.channel, B.c.version).where(
                B.c.thread_id == _bind("thread_id", B.c.thread_id),
                B.c.ns_hash == _bind("ns_hash", B.c.ns_hash),
            ),
        )


@dataclass(frozen=True, slots=True)
class _ListShape:
    thread: bool
    namespace: bool
    checkpoint_id: bool
    before: bool
    limit: bool
    filters: int


_Found = tuple[
    Sequence[Any],
    dict[str, Any],
    Mapping[tuple[Any, Any, Any, Any], tuple[Any, Any]],
    Sequence[Sequence[Any]],
]
"""A checkpoint as read: its row, decoded body, the values it reads, its pending writes."""


@dataclass(frozen=True, slots=True)
class _Lease:
    tenant_id: str
    execution_id: str
    token: int


def _keyed_params(keys: Sequence[Sequence[Any]], columns: Sequence[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for i, key in enumerate(keys):
        for column, value in zip(columns, key, strict=True):
            params[f"k{i}_{column}"] = value
    return params


def _metadata_json(metadata: Mapping[str, Any]) -> str:
    # Values that are not JSON (a UUID run id, say) are kept as their text, as the
    # serializable metadata of LangGraph's own savers would show them.
    return json.dumps(
        metadata, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str
    )


def _json_value(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=False, default=str))


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode()
    return str(value)


def _checked_key(what: str, value: str, limit: int) -> str:
    if len(value) > limit:
        raise InvalidIdentifierError(
            f"{what} must be at most {limit} characters, got {len(value)}: {value!r:.80}"
        )
    return value


class _SyncBridge:
    """The saver's synchronous side: an event loop on a daemon thread of its own (started on
    first use) and the connection that loop uses. Shared by a saver's shallow copies
    (LangGraph's `with_allowlist`), so one `close()` stops it for all of them."""

    def __init__(self, connection: SqlConnection) -> None:
        self._connection = connection
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._own: SqlConnection | None = None

    def run(self, work: Callable[[SqlConnection], Coroutine[Any, Any, T]]) -> T:
        """`await work(connection)` on the bridge's loop, from any thread but that loop's."""
        with self._guard:
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

    def close(self) -> None:
        """Close the loop's own connection and stop the loop (a later call starts anew)."""
        with self._guard:
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


class SqlCheckpointSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpoints on SQLite, PostgreSQL or MySQL/MariaDB, on this instance's
    `SqlConnection` (the tables come from the project's schema and migrations).

    The async methods run on the caller's event loop. The sync methods (`put`,
    `get_tuple`, `list`, ...) run the async ones on an event loop thread the saver owns,
    so a synchronous graph works from any thread, with or without a running loop; on a
    server database that loop uses a second pool to the same database (closed by
    `close()`/`aclose()`), on SQLite the same connection.

    `fenced=True`: every checkpoint and pending write is written only while the lease in
    `configurable["agboss_lease"]` is held (checked in the write's transaction, by
    `store_clock`'s time: database time by default), else `ExecutionFencedError`.
    Deleting, copying and pruning threads are not fenced.
    """

    lease_check: ClassVar[LeaseCheck] = LeaseCheck.ATOMIC

    def __init__(
        self,
        connection: SqlConnection,
        *,
        serde: SerializerProtocol | None = None,
        fenced: bool = False,
        store_clock: StoreClock | None = None,
        application: ApplicationContext | None = None,
    ) -> None:
        super().__init__(serde=serde)
        if store_clock is not None and not isinstance(store_clock, StoreClock):
            raise TypeError(
                "store_clock decides lease expiry: pass a StoreClock (StoreClock() for database "
                f"time, StoreClock(clock) in tests), got {type(store_clock).__name__}"
            )
        self.connection = connection
        self.backend: str | None = connection.backend
        self.fenced = fenced
        self.store_clock = store_clock if store_clock is not None else StoreClock()
        self.application = application
        self._sql = self._statements(connection)
        self._sync = _SyncBridge(connection)

    def _statements(self, connection: SqlConnection) -> CheckpointStatements:
        return connection.prepared(
            CheckpointStatements, database_time=self.store_clock.is_database_time
        )

    async def ping(self) -> None:
        """Return when the database answers."""
        await self.connection.ping()

    # --- keys and values -----------------------------------------------------------------

    @staticmethod
    def _thread_of(config: RunnableConfig) -> str:
        configurable = config.get("configurable") or {}
        if "thread_id" not in configurable:
            raise ValueError(
                "a checkpoint config needs configurable['thread_id'] (the conversation or run "
                "whose checkpoints these are)"
            )
        return checked_identifier("thread_id", _text(configurable["thread_id"]))

    @staticmethod
    def _ns_of(config: RunnableConfig) -> str:
        return _text((config.get("configurable") or {}).get("checkpoint_ns") or "")

    def _lease_of(self, config: RunnableConfig) -> _Lease:
        lease = (config.get("configurable") or {}).get(LEASE_KEY)
        if isinstance(lease, ExecutionLease):
            tenant_id, execution_id, token = lease.tenant_id, lease.execution_id, lease.lease_epoch
        elif isinstance(lease, Mapping):
            try:
                tenant_id = lease["tenant_id"]
                execution_id = lease["execution_id"]
                token = lease["lease_epoch"]
            except KeyError as missing:
                raise ValueError(
                    f"configurable[{LEASE_KEY!r}] lacks {missing}: give tenant_id, "
                    "execution_id and lease_epoch (or the ExecutionLease itself)"
                ) from None
        else:
            raise ValueError(
                f"this saver is fenced: every write needs the writer's lease in "
                f"configurable[{LEASE_KEY!r}] (an ExecutionLease, or a dict of tenant_id, "
                f"execution_id and lease_epoch), got {type(lease).__name__}"
            )
        if isinstance(token, bool) or not isinstance(token, int):
            raise ValueError(f"a lease epoch is an int, got {token!r}")
        return _Lease(
            checked_identifier("tenant_id", tenant_id),
            checked_identifier("execution_id", execution_id),
            token,
        )

    def _fence_params(self, lease: _Lease) -> dict[str, Any]:
        params: dict[str, Any] = {
            "tenant_id": lease.tenant_id,
            "execution_id": lease.execution_id,
            "token": lease.token,
        }
        if not self.store_clock.is_database_time:
            params["now"] = self.store_clock.now()
        return params

    def _dumps(self, value: Any) -> tuple[str, bytes | None]:
        kind, data = self.serde.dumps_typed(value)
        return kind, data

    def _loads(self, kind: Any, data: Any) -> Any:
        if isinstance(data, memoryview):
            data = bytes(data)
        return self.serde.loads_typed((_text(kind), data))

    def get_next_version(self, current: str | None, channel: None) -> str:
        """The next version of a channel: an increasing counter with a random fraction, so two
        branches forked from one checkpoint never give one version two values."""
        # Versions another saver wrote may be ints: the counter is the integer part.
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # --- writes --------------------------------------------------------------------------

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Save `checkpoint` and the values of its `new_versions` in one transaction (fenced:
        only while the lease is held); answer the config that names it."""
        return await self._put(self.connection, config, checkpoint, metadata, new_versions)

    async def _put(
        self,
        connection: SqlConnection,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        sql = self._statements(connection)
        thread_id = self._thread_of(config)
        ns = self._ns_of(config)
        ns_hash = identity_hash(ns)
        checkpoint_id = _checked_key("checkpoint id", _text(checkpoint["id"]), MAX_CHECKPOINT_ID)
        parent_id = get_checkpoint_id(config)
        if parent_id:
            _checked_key("parent checkpoint id", _text(parent_id), MAX_CHECKPOINT_ID)
        lease = self._lease_of(config) if self.fenced else None

        values = checkpoint["channel_values"]
        versions = checkpoint["channel_versions"]
        body = dict(checkpoint)
        # Values of versioned channels live in the blobs, once per version; a value whose
        # channel has no version (not LangGraph's way) stays in the body.
        body["channel_values"] = {k: v for k, v in values.items() if k not in versions}
        blob_rows: list[tuple[str, str, str, bytes | None]] = []
        for channel, version in new_versions.items():
            if channel in values:
                kind, data = self._dumps(values[channel])
                blob_rows.append(
                    (
                        channel,
                        _checked_key("channel version", str(version), MAX_VERSION),
                        kind,
                        data,
                    )
                )
        body_kind, body_data = self._dumps(body)
        stored_metadata = get_serializable_checkpoint_metadata(config, metadata)
        run_id = stored_metadata.get("run_id")
        row: dict[str, Any] = {
            "thread_id": thread_id,
            "ns_hash": ns_hash,
            "checkpoint_id": checkpoint_id,
            "checkpoint_ns": ns,
            "parent_checkpoint_id": parent_id or None,
            "run_hash": identity_hash(str(run_id)) if run_id is not None else None,
            "checkpoint_type": body_kind,
            "checkpoint": body_data,
            "metadata": _metadata_json(stored_metadata),
        }
        row = {f"p_{column}": value for column, value in row.items()}
        shared: dict[str, Any] = {"p_thread_id": thread_id, "p_ns_hash": ns_hash}
        blob_execs: list[Exec] = []
        for chunk in _chunks(blob_rows):
            params = dict(shared)
            for i, values_of_row in enumerate(chunk):
                for column, value in zip(_BLOB_VALUES, values_of_row, strict=True):
                    params[f"b{i}_{column}"] = value
            blob_execs.append(Exec(sql.blob_insert(len(chunk), fenced=False), params))

        if sql.fold and len(blob_execs) <= 1:
            params = dict(row)
            if blob_execs:
                params.update(blob_execs[0].params)
            statement = sql.put(len(blob_rows), fenced=lease is not None)
            if lease is not None:
                params.update(self._fence_params(lease))
                if not (await connection.execute(statement, params)).rows:
                    raise await self._fenced_error(connection, lease)
            else:
                await connection.execute(statement, params)
        else:
            writes = [*blob_execs, Exec(sql.checkpoint_upsert(fenced=False), row)]
            if not await self._write(connection, lease, writes):
                assert lease is not None
                raise await self._fenced_error(connection, lease)
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
            }
        }

    async def _write(
        self, connection: SqlConnection, lease: _Lease | None, writes: list[Exec]
    ) -> bool:
        """Run `writes` atomically, after the fence when `lease`: one statement alone, several
        in one transaction whose first statement takes the lease row. False: fenced."""
        sql = self._statements(connection)
        if lease is None and len(writes) == 1:
            await connection.execute(writes[0].statement, writes[0].params)
            return True
        fence = Exec(sql.fence, self._fence_params(lease)) if lease is not None else None

        def step() -> Step[bool]:
            if fence is not None and (yield fence).rowcount != 1:
                return False
            for write in writes:
                _ = yield write
            return True

        return await connection.run(step, transaction=True)

    async def _fenced_error(self, connection: SqlConnection, lease: _Lease) -> ExecutionFencedError:
        """Why the fence refused (read after the refusal, for the message only)."""
        sql = self._statements(connection)
        row = (await connection.execute(sql.fences.diagnose, self._fence_params(lease))).first()
        scope = scope_key_of(lease.tenant_id, lease.execution_id)
        return ExecutionFencedError(scope, lease.token, refusal_of(row, lease.token))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Save a task's pending writes for the checkpoint `config` names, keyed by (task,
        index) so a retried task adds nothing; special channels (errors, interrupts, resumes)
        replace their earlier value. Fenced: only while the lease is held."""
        await self._put_writes(self.connection, config, writes, task_id, task_path)

    async def _put_writes(
        self,
        connection: SqlConnection,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> None:
        if not writes:
            return
        sql = self._statements(connection)
        thread_id = self._thread_of(config)
        checkpoint_id = get_checkpoint_id(config)
        if not checkpoint_id:
            raise ValueError("pending writes belong to a checkpoint: configurable['checkpoint_id']")
        lease = self._lease_of(config) if self.fenced else None
        shared: dict[str, Any] = {
            "p_thread_id": thread_id,
            "p_ns_hash": identity_hash(self._ns_of(config)),
            "p_checkpoint_id": _checked_key(
                "checkpoint id", _text(checkpoint_id), MAX_CHECKPOINT_ID
            ),
            "p_task_id": checked_identifier("task_id", _text(task_id)),
            "p_task_path": task_path,
        }
        replace = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        rows = [
            (WRITES_IDX_MAP.get(channel, idx), channel, *self._dumps(value))
            for idx, (channel, value) in enumerate(writes)
        ]
        execs: list[Exec] = []
        for chunk in _chunks(rows):
            params = dict(shared)
            for i, (idx, channel, kind, data) in enumerate(chunk):
                params.update(
                    {f"w{i}_idx": idx, f"w{i}_channel": channel, f"w{i}_value_type": kind}
                )
                params[f"w{i}_value"] = data
            execs.append(Exec(sql.writes_insert(len(chunk), replace=replace, fenced=False), params))
        if lease is not None and sql.fold and len(execs) == 1:
            statement = sql.writes_insert(len(rows), replace=replace, fenced=True)
            params = {**execs[0].params, **self._fence_params(lease)}
            result = await connection.execute(statement, params)
            if not result.rows and not await self._fence_holds(connection, lease):
                raise await self._fenced_error(connection, lease)
            return
        if not await self._write(connection, lease, execs):
            assert lease is not None
            raise await self._fenced_error(connection, lease)

    async def _fence_holds(self, connection: SqlConnection, lease: _Lease) -> bool:
        # A folded fenced write that returned no row was fenced, unless every write was
        # already stored (skipped duplicates return nothing): the fence alone tells.
        sql = self._statements(connection)
        result = await connection.execute(sql.fence, self._fence_params(lease))
        return result.rowcount == 1

    # --- reads ---------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint `config` names (its `checkpoint_id`), or the thread namespace's
        latest (a primary-key probe), with its pending writes and parent; `None` if absent."""
        return await self._get_tuple(self.connection, config)

    async def _get_tuple(
        self, connection: SqlConnection, config: RunnableConfig
    ) -> CheckpointTuple | None:
        sql = self._statements(connection)
        thread_id = self._thread_of(config)
        ns = self._ns_of(config)
        checkpoint_id = get_checkpoint_id(config)
        params: dict[str, Any] = {"thread_id": thread_id, "ns_hash": identity_hash(ns)}
        if checkpoint_id:
            params["checkpoint_id"] = _text(checkpoint_id)
        statement = sql.read_by_id if checkpoint_id else sql.read_latest
        # One step: on SQLite one thread hop, on a server one pooled connection.
        found = await connection.run(
            lambda: self._read(sql, statement, params, ns), transaction=False
        )
        return None if found is None else self._tuple_of(*found)

    def _read(
        self, sql: CheckpointStatements, statement: Any, params: dict[str, Any], ns: str
    ) -> Step[_Found | None]:
        """Read a checkpoint with its pending writes, then the values its versions name."""
        result = yield Exec(statement, params)
        found = None
        writes: list[Sequence[Any]] = []
        for kind_of_row, *row in result.rows:
            if kind_of_row == _CHECKPOINT_ROW:
                found = row
            else:
                # (task_id, channel, task_path, idx, value_type, value)
                writes.append(row)
        if found is None:
            return None
        thread_id, ns_hash = params["thread_id"], params["ns_hash"]
        checkpoint_id, parent_id, metadata, _, kind, data = found
        listed = (thread_id, ns, ns_hash, checkpoint_id, parent_id, kind, data, metadata)
        body = self._loads(kind, data)
        keys = [(thread_id, ns_hash, ch, str(v)) for ch, v in body["channel_versions"].items()]
        blobs = yield from self._blobs(sql, keys)
        return listed, body, blobs, writes

    def _blobs(
        self, sql: CheckpointStatements, keys: Sequence[tuple[Any, Any, str, str]]
    ) -> Step[dict[tuple[Any, Any, Any, Any], tuple[Any, Any]]]:
        """The stored values of these (thread, namespace hash, channel, version) keys."""
        found: dict[tuple[Any, Any, Any, Any], tuple[Any, Any]] = {}
        columns = (*_BLOB_KEY, "value_type", "value")
        for chunk in _chunks(list(dict.fromkeys(keys))):
            statement = sql.keyed(B, columns, _BLOB_KEY, len(chunk))
            result = yield Exec(statement, _keyed_params(chunk, _BLOB_KEY))
            for thread_id, ns_hash, channel, version, kind, value in result.rows:
                found[(thread_id, ns_hash, channel, version)] = (kind, value)
        return found

    def _tuple_of(
        self,
        row: Sequence[Any],
        body: dict[str, Any],
        blobs: Mapping[tuple[str, str, str, str], tuple[Any, Any]],
        writes: Sequence[Sequence[Any]],
    ) -> CheckpointTuple:
        thread_id, ns, ns_hash, checkpoint_id, parent_id, _, _, metadata = row
        values = dict(body.get("channel_values") or {})
        for channel, version in body["channel_versions"].items():
            stored = blobs.get((thread_id, ns_hash, channel, str(version)))
            if stored is not None:
                values[channel] = self._loads(*stored)
        body["channel_values"] = values
        pending: list[PendingWrite] = [
            (_text(task_id), _text(channel), self._loads(kind, value))
            for task_id, channel, _, _, kind, value in sorted(
                writes, key=lambda w: writes_sort_key(_text(w[2]), _text(w[0]), int(w[3]))
            )
        ]
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": checkpoint_id,
                }
            },
            checkpoint=body,  # type: ignore[arg-type]
            metadata=json.loads(_text(metadata)),
            parent_config=(
                {
                    "configurable": {
                        "thread_id": thread_id,
                        "checkpoint_ns": ns,
                        "checkpoint_id": parent_id,
                    }
                }
                if parent_id
                else None
            ),
            pending_writes=pending,
        )

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """The checkpoints matching `config` (thread, and namespace when given), every key of
        `filter` equal in their metadata, older than `before`, newest first, at most `limit`."""
        async for found in self._list(self.connection, config, filter, before, limit):
            yield found

    async def _list(
        self,
        connection: SqlConnection,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> AsyncIterator[CheckpointTuple]:
        sql = self._statements(connection)
        if limit is not None and limit <= 0:
            return
        params: dict[str, Any] = {}
        configurable = (config or {}).get("configurable") or {}
        thread = config is not None and "thread_id" in configurable
        namespace = thread and configurable.get("checkpoint_ns") is not None
        if thread:
            assert config is not None
            params["thread_id"] = self._thread_of(config)
        if namespace:
            assert config is not None
            params["ns_hash"] = identity_hash(self._ns_of(config))
        checkpoint_id = get_checkpoint_id(config) if thread and config is not None else None
        if checkpoint_id:
            params["checkpoint_id"] = _text(checkpoint_id)
        before_id = get_checkpoint_id(before) if before is not None else None
        filters = [(key, _json_value(value)) for key, value in (filter or {}).items()]
        for index, (key, value) in enumerate(filters):
            params.update(sql.ops.json_key_params(index, str(key), value))
        # Objects and arrays are compared again here where the SQL test only narrows.
        recheck = [
            (key, value)
            for key, value in filters
            if isinstance(value, (dict, list)) and not sql.json_exact
        ]
        # One namespace of one thread is read in pages off its key; anything wider at once.
        paged = namespace and not checkpoint_id
        remaining = limit
        cursor = _text(before_id) if before_id else None
        while True:
            page = LIST_PAGE if paged else None
            if remaining is not None and not recheck:
                page = remaining if page is None else min(page, remaining)
            shape = _ListShape(
                thread=thread,
                namespace=namespace,
                checkpoint_id=bool(checkpoint_id),
                before=cursor is not None,
                limit=page is not None,
                filters=len(filters),
            )
            page_params = dict(params)
            if cursor is not None:
                page_params["before"] = cursor
            if page is not None:
                page_params["limit"] = page
            page_rows, found_tuples = await connection.run(
                functools.partial(self._page, sql, shape, page_params), transaction=False
            )
            for found_tuple in found_tuples:
                listed = self._tuple_of(*found_tuple)
                if any(listed.metadata.get(key) != value for key, value in recheck):
                    continue
                yield listed
                if remaining is not None:
                    remaining -= 1
                    if remaining <= 0:
                        return
            if not paged or page is None or page_rows < page:
                return
            cursor = _text(found_tuples[-1][0][3])

    def _page(
        self, sql: CheckpointStatements, shape: _ListShape, params: dict[str, Any]
    ) -> Step[tuple[int, list[_Found]]]:
        """One page of listed checkpoints, with their values and pending writes read by key."""
        rows = (yield Exec(sql.listing(shape), params)).rows
        if not rows:
            return 0, []
        bodies = [self._loads(row[5], row[6]) for row in rows]
        blob_keys = [
            (row[0], row[2], channel, str(version))
            for row, body in zip(rows, bodies, strict=True)
            for channel, version in body["channel_versions"].items()
        ]
        blobs = yield from self._blobs(sql, blob_keys)
        checkpoint_keys = [(row[0], row[2], row[3]) for row in rows]
        writes: dict[tuple[Any, Any, Any], list[Sequence[Any]]] = {}
        columns = (
            *_CHECKPOINT_KEY,
            "task_id",
            "channel",
            "task_path",
            "idx",
            "value_type",
            "value",
        )
        for chunk in _chunks(list(dict.fromkeys(checkpoint_keys))):
            statement = sql.keyed(W, columns, _CHECKPOINT_KEY, len(chunk))
            result = yield Exec(statement, _keyed_params(chunk, _CHECKPOINT_KEY))
            for thread_id, ns_hash, checkpoint_id, *write in result.rows:
                writes.setdefault((thread_id, ns_hash, checkpoint_id), []).append(write)
        return len(rows), [
            (row, body, blobs, writes.get((row[0], row[2], row[3]), []))
            for row, body in zip(rows, bodies, strict=True)
        ]

    # --- deleting, copying, pruning ------------------------------------------------------

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, pending write and value of `thread_id`, atomically."""
        await self._delete_thread(self.connection, thread_id)

    async def _delete_thread(self, connection: SqlConnection, thread_id: str) -> None:
        sql = self._statements(connection)
        params = {"thread_id": checked_identifier("thread_id", _text(thread_id))}
        await self._write(connection, None, [Exec(s, params) for s in sql.delete_thread])

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, pending write and value of one thread to another, atomically
        (rows the target already has are kept)."""
        await self._copy_thread(self.connection, source_thread_id, target_thread_id)

    async def _copy_thread(self, connection: SqlConnection, source: str, target: str) -> None:
        sql = self._statements(connection)
        params = {
            "source": checked_identifier("source_thread_id", _text(source)),
            "target": checked_identifier("target_thread_id", _text(target)),
        }
        if params["source"] == params["target"]:
            return
        await self._write(connection, None, [Exec(s, params) for s in sql.copy_thread])

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints whose metadata names one of `run_ids`, their pending writes,
        and the values no remaining checkpoint of their namespace reads, in one transaction."""
        await self._delete_for_runs(self.connection, run_ids)

    async def _delete_for_runs(self, connection: SqlConnection, run_ids: Sequence[str]) -> None:
        if isinstance(run_ids, str):
            raise TypeError("run_ids must be a sequence of run ids, not a str")
        hashes = list(dict.fromkeys(identity_hash(str(run_id)) for run_id in run_ids))
        if not hashes:
            return
        sql = self._statements(connection)

        def step() -> Step[None]:
            doomed: list[tuple[Any, Any, Any]] = []
            for runs in _chunks(hashes):
                found = {f"k{i}_run_hash": value for i, value in enumerate(runs)}
                doomed += (yield Exec(sql.run_checkpoints(len(runs)), found)).rows
            for keys in _chunks(doomed):
                params = _keyed_params(keys, _CHECKPOINT_KEY)
                yield Exec(sql.keyed_delete(C, _CHECKPOINT_KEY, len(keys)), params)
                yield Exec(sql.keyed_delete(W, _CHECKPOINT_KEY, len(keys)), params)
            for thread_id, ns_hash in dict.fromkeys((row[0], row[1]) for row in doomed):
                yield from self._collect_blobs(sql, thread_id, ns_hash)

        await connection.run(step, transaction=True)

    def _collect_blobs(self, sql: CheckpointStatements, thread_id: Any, ns_hash: Any) -> Step[None]:
        """Delete the values of one thread namespace that no checkpoint of it reads."""
        params = {"thread_id": thread_id, "ns_hash": ns_hash}
        read: set[tuple[str, str]] = set()
        for kind, data in (yield Exec(sql.namespace_bodies(), params)).rows:
            versions = self._loads(kind, data)["channel_versions"]
            read.update((channel, str(version)) for channel, version in versions.items())
        stored = (yield Exec(sql.namespace_blob_keys(), params)).rows
        garbage = [
            (thread_id, ns_hash, channel, version)
            for channel, version in stored
            if (channel, version) not in read
        ]
        for chunk in _chunks(garbage):
            yield Exec(sql.keyed_delete(B, _BLOB_KEY, len(chunk)), _keyed_params(chunk, _BLOB_KEY))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`"keep_latest"`: keep each namespace's latest checkpoint of each thread (its pending
        writes and the values it reads; its parent link is cleared), delete the rest;
        `"delete"`: delete the threads. One transaction per thread. A thread that uses a
        `DeltaChannel` is refused for `"keep_latest"` (`NotImplementedError`), as its state
        needs the ancestors."""
        await self._prune(self.connection, thread_ids, strategy)

    async def _prune(
        self, connection: SqlConnection, thread_ids: Sequence[str], strategy: str
    ) -> None:
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread ids, not a str")
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        threads = [checked_identifier("thread_id", _text(t)) for t in dict.fromkeys(thread_ids)]
        for thread_id in threads:
            if strategy == "delete":
                await self._delete_thread(connection, thread_id)
            else:
                await connection.run(self._keep_latest_of(connection, thread_id))

    def _keep_latest_of(
        self, connection: SqlConnection, thread_id: str
    ) -> Callable[[], Step[None]]:
        return lambda: self._keep_latest(connection, thread_id)

    def _keep_latest(self, connection: SqlConnection, thread_id: str) -> Step[None]:
        sql = self._statements(connection)
        rows = (yield Exec(sql.lock_thread, {"thread_id": thread_id})).rows
        heads: dict[Any, Any] = {}
        for ns_hash, checkpoint_id in rows:
            # Rows come newest first per namespace, in the database's own order.
            heads.setdefault(ns_hash, checkpoint_id)
        if not heads:
            return
        keys = [(thread_id, ns_hash, checkpoint_id) for ns_hash, checkpoint_id in heads.items()]
        read: set[tuple[Any, str, str]] = set()
        for heads_chunk in _chunks(keys):
            statement = sql.keyed(
                C,
                ("ns_hash", "checkpoint_type", "checkpoint", "metadata"),
                _CHECKPOINT_KEY,
                len(heads_chunk),
            )
            for ns_hash, kind, data, metadata in (
                yield Exec(statement, _keyed_params(heads_chunk, _CHECKPOINT_KEY))
            ).rows:
                if "counters_since_delta_snapshot" in json.loads(_text(metadata)):
                    raise NotImplementedError(
                        f"keep_latest cannot prune thread {thread_id!r}: it uses a DeltaChannel, "
                        "whose state is rebuilt from the ancestors pruning would delete"
                    )
                versions = self._loads(kind, data)["channel_versions"]
                read.update((ns_hash, ch, str(v)) for ch, v in versions.items())
        for ns_hash, head in heads.items():
            params = {"thread_id": thread_id, "ns_hash": ns_hash, "checkpoint_id": head}
            yield Exec(sql.prune_checkpoints, params)
            yield Exec(sql.prune_writes, params)
            yield Exec(sql.orphan_head, params)
        stored = (yield Exec(sql.select_blob_keys, {"thread_id": thread_id})).rows
        garbage: list[tuple[str, Any, Any, Any]] = [
            (thread_id, ns_hash, channel, version)
            for ns_hash, channel, version in stored
            if (ns_hash, channel, version) not in read
        ]
        for chunk in _chunks(garbage):
            yield Exec(sql.keyed_delete(B, _BLOB_KEY, len(chunk)), _keyed_params(chunk, _BLOB_KEY))

    # --- synchronous methods: the async ones on the saver's own event loop -----------------

    def _run_sync(self, work: Callable[[SqlConnection], Coroutine[Any, Any, T]]) -> T:
        return self._sync.run(work)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """`aput`, from synchronous code."""
        result: RunnableConfig = self._run_sync(
            lambda c: self._put(c, config, checkpoint, metadata, new_versions)
        )
        return result

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """`aput_writes`, from synchronous code."""
        self._run_sync(lambda c: self._put_writes(c, config, writes, task_id, task_path))

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """`aget_tuple`, from synchronous code."""
        found: CheckpointTuple | None = self._run_sync(lambda c: self._get_tuple(c, config))
        return found

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """`alist`, from synchronous code (read a page at a time)."""
        pages: list[AsyncIterator[CheckpointTuple]] = []

        async def next_item(connection: SqlConnection) -> tuple[bool, CheckpointTuple | None]:
            if not pages:
                pages.append(self._list(connection, config, filter, before, limit))
            try:
                return True, await anext(pages[0])
            except StopAsyncIteration:
                return False, None

        while True:
            more, found = self._run_sync(next_item)
            if not more:
                return
            assert found is not None
            yield found

    def delete_thread(self, thread_id: str) -> None:
        """`adelete_thread`, from synchronous code."""
        self._run_sync(lambda c: self._delete_thread(c, thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """`adelete_for_runs`, from synchronous code."""
        self._run_sync(lambda c: self._delete_for_runs(c, run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """`acopy_thread`, from synchronous code."""
        self._run_sync(lambda c: self._copy_thread(c, source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`aprune`, from synchronous code."""
        self._run_sync(lambda c: self._prune(c, thread_ids, strategy))

    def close(self) -> None:
        """Stop the saver's event loop thread and close the pool it used (the connection
        given to the saver stays open: its owner closes it)."""
        self._sync.close()

    async def aclose(self) -> None:
        """`close()`, from async code (without blocking the caller's loop)."""
        await asyncio.to_thread(self._sync.close)
