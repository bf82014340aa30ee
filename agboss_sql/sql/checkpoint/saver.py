"""`SqlCheckpointSaver`: LangGraph's `BaseCheckpointSaver` on the project's `SqlConnection`.

How it stores and what it sends per operation: the package's docstring
(`agboss_sql.sql.checkpoint`). The statements are in `_statements`, the writer's lease in
`_lease`, the synchronous methods' event loop in `_bridge`; fenced writes use the fence of
the fenced-effect store (`agboss_sql.sql._fence`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import threading
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from types import TracebackType
from typing import Any, ClassVar, TypeVar

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
from sqlalchemy.engine import URL

from agboss_sql.contracts.clocks import StoreClock
from agboss_sql.contracts.errors import InvalidIdentifierError
from agboss_sql.contracts.keys import unstorable_text_rule_of
from agboss_sql.contracts.types import ApplicationContext, LeaseCheck
from agboss_sql.sql._base import identity_hash
from agboss_sql.sql._fence import fence_params, fenced
from agboss_sql.sql.checkpoint._appends import (
    MIN_BASE,
    MSGPACK,
    appended,
    array_header,
    joined,
)
from agboss_sql.sql.checkpoint._bridge import Pin, SyncBridge
from agboss_sql.sql.checkpoint._decoded import DecodedLists
from agboss_sql.sql.checkpoint._lease import CheckpointLease, lease_of
from agboss_sql.sql.checkpoint._statements import (
    BLOB_KEY,
    BLOB_ROW,
    BLOB_VALUES,
    CHECKPOINT_KEY,
    CHECKPOINT_ROW,
    LIST_PAGE,
    MAX_CHECKPOINT_ID,
    MAX_LOOKUPS,
    MAX_ROWS,
    MAX_VERSION,
    WRITE_ROW,
    CheckpointStatements,
    ListShape,
    chunks,
    keyed_params,
)
from agboss_sql.sql.checkpoint._values import (
    DEFAULT_VALUE_CACHE_BYTES,
    Stored,
    ValueCache,
    ValueKey,
    fetched_entries,
)
from agboss_sql.sql.connection import Exec, SqlConnection, Step
from agboss_sql.sql.schema import checkpoint_blobs, checkpoint_writes, checkpoints
from agboss_sql.sql.timeouts import Timeouts

T = TypeVar("T")

ValueKeys = list[tuple[str, str, str]]
"""(channel, channel hash, version) of each value a checkpoint body reads from a blob row."""

Found = tuple[
    Sequence[Any],
    dict[str, Any],
    Mapping[tuple[Any, Any, Any, Any], tuple[Any, Any]],
    Sequence[Sequence[Any]],
    ValueKeys,
]
"""A checkpoint as read: its row, decoded body, the values it reads, its pending writes, and
the keys of those values (`_value_keys` of the body as read)."""


# Values that are not JSON (a UUID run id, say) are kept as their text, as the serializable
# metadata of LangGraph's own savers would show them. One encoder for every put:
# `json.dumps` with options builds a new one per call.
_METADATA_ENCODER = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str
)


def _metadata_json(metadata: Mapping[str, Any]) -> str:
    return _METADATA_ENCODER.encode(metadata)


def _json_value(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=False, default=str))


def _text(value: Any) -> str:
    if type(value) is str:
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode()
    return str(value)


def _key_text(what: str, value: Any) -> str:
    """`value` as the text LangGraph means by it (any text: empty, long, ending in spaces:
    it is keyed by its SHA-256), or `InvalidIdentifierError` for a text no database here can
    store (a NUL character, a lone surrogate), before anything is sent."""
    text = _text(value)
    unstorable = unstorable_text_rule_of(text)
    if unstorable is not None:
        raise InvalidIdentifierError(f"{what} must not hold {unstorable}, got {text!r:.80}")
    return text


@functools.lru_cache(maxsize=4096)
def _channel_hash(channel: str) -> str:
    """A channel's key column: graphs reuse a few names, so each is hashed once."""
    return identity_hash(channel)


@functools.lru_cache(maxsize=4096)
def _written_channel_hash(channel: str) -> str:
    """The key column of a channel a put writes: its name checked as `_key_text` checks it
    (a refusal raises, and is not cached), then hashed; once per name."""
    return _channel_hash(_key_text("channel", channel))


@functools.lru_cache(maxsize=8192)
def _key_hash(text: str) -> str:
    """A thread id's, namespace's or run id's key column: every step of a thread hashes the
    same few, so each is hashed once while it is in use."""
    return identity_hash(text)


INLINE_TEXT = 1024
"""Characters of the longest text value kept in the checkpoint body rather than a blob row."""

_INT64 = (-(2**63), 2**63)


def _inlined(value: Any) -> bool:
    """Whether a channel value is a small scalar kept in the checkpoint body (as LangGraph's
    own savers keep them): None, a bool, a float, a 64-bit int, or a text of at most
    `INLINE_TEXT` characters; exact types only, so a subclass (an enum, say) keeps the type
    its serde records in a blob."""
    kind = type(value)
    if value is None or kind is bool or kind is float:
        return True
    if kind is int:
        return bool(_INT64[0] <= value < _INT64[1])
    return kind is str and len(value) <= INLINE_TEXT


def _blob_versions(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The channel versions of a checkpoint body whose values are in blob rows: those not in
    its `channel_values` (a body holds the values it inlines; one written before values
    were inlined holds only unversioned ones, so the same rule reads both)."""
    inline = body.get("channel_values") or {}
    versions: Mapping[str, Any] = body["channel_versions"]
    if not inline:
        return versions
    return {ch: v for ch, v in versions.items() if ch not in inline}


def _value_keys(body: Mapping[str, Any]) -> ValueKeys:
    """(channel, channel hash, version) of each value `body` reads from a blob row
    (`_blob_versions`)."""
    return [(ch, _channel_hash(str(ch)), str(v)) for ch, v in _blob_versions(body).items()]


EXPECTED_NAMESPACES = 4096
"""Thread namespaces whose latest checkpoint's values a saver remembers (see `_expect`)."""

BlobKeys = tuple[tuple[str, str], ...]
"""(channel hash, version) of the values a checkpoint reads."""

BASES = 16384
"""Channels whose latest value stored whole a saver remembers, as the base of appends."""

Rows = dict[tuple[Any, Any, Any, Any], tuple[Any, Any, Any]]
"""Value rows as read, by key: (value type, value, base version)."""


_BLOB_PARAMS = tuple(tuple(f"b{i}_{column}" for column in BLOB_VALUES) for i in range(MAX_ROWS))
"""The parameter names of the `i`th blob row of a multi-row insert, in `BLOB_VALUES` order."""


class _BaseGone(Exception):
    """A put's append names a base value no longer stored (deleted by another saver since
    this one wrote it): the put is made again with every value whole."""


def _kept(version: str) -> bool:
    """Whether a value of this version may be kept (`_values`): only versions made by
    `get_next_version` (or LangGraph's savers, in the same form), whose random fraction no
    later put of another value repeats, even after its thread was deleted elsewhere and
    begun again. A version a caller made up (`"1"`) may name another value after that."""
    return len(version) > 34 and version[32] == "."


def _base_worthy(version: str, kind: str, data: bytes | None) -> bool:
    """Whether a value stored whole may be the base of later appends: a list the serde wrote
    (`_appends`) big enough to pay, of a version whose bytes `_values` may keep."""
    return (
        kind == MSGPACK
        and data is not None
        and len(data) > MIN_BASE
        and array_header(data) is not None
        and _kept(version)
    )


def _checked_key(what: str, value: str, limit: int) -> str:
    if len(value) > limit:
        raise InvalidIdentifierError(
            f"{what} must be at most {limit} characters, got {len(value)}: {value!r:.80}"
        )
    return value


class SqlCheckpointSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpoints on SQLite, PostgreSQL or MySQL/MariaDB, on this instance's
    `SqlConnection` (the tables come from the project's schema and migrations).

    Built on a connection the caller owns (`SqlCheckpointSaver(connection)`, which stays
    open after the saver is closed), or on one of its own, as LangGraph's savers are (with
    `async with` or `with`; `setup()` runs the project's migrations):

        async with SqlCheckpointSaver.from_conn_string("postgresql://…") as saver:
            await saver.setup()
            graph = builder.compile(checkpointer=saver)

    Any event loop, any thread: the async methods run on the caller's loop, on the saver's
    connection on the first loop it serves and on a connection of its own on any other (a
    second `asyncio.run`, say). The sync methods (`put`, `get_tuple`, `list`, ...) run on
    that first loop while it runs on another thread (a sync graph in a worker thread beside
    async ones), else on an event loop the saver starts on a daemon thread (see `_bridge`).
    Sync and async calls mix freely; `close()` never leaves a sync call waiting.

    `value_cache_bytes`: how many bytes of serialised values the saver keeps to answer later
    reads without fetching them again, and at most as many again of decoded lists kept to
    decode a growing list's next value from (see the package's docstring; 0 keeps none).

    `fenced=True`: every checkpoint and pending write is written only while the lease in
    `configurable["agboss_lease"]` is held at its epoch by the instance it names (checked
    in the write's transaction, by
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
        value_cache_bytes: int = DEFAULT_VALUE_CACHE_BYTES,
    ) -> None:
        super().__init__(serde=serde)
        values = ValueCache(value_cache_bytes)
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
        self._sync = SyncBridge(connection)
        self._owns_connection = False
        # The values the latest checkpoint of a thread namespace read when this saver last
        # wrote or read it: a read names them in its first statement (one round trip), and
        # reads whatever else the checkpoint found then names. Only a guess: never trusted.
        self._expected: dict[tuple[str, str], BlobKeys] = {}
        self._expected_guard = threading.Lock()
        # The version of each channel's latest value this saver stored whole, by (thread,
        # namespace, channel) hashes: the base a later value of the channel may be stored
        # as an append to (`_appends`), if its bytes are still in `_values`. Guarded by
        # `_expected_guard`.
        self._bases: dict[tuple[str, str, str], str] = {}
        # The serialised values this saver wrote or read, by key (`_values`): a read takes
        # the values its checkpoint names from here rather than fetch them again.
        self._values = values
        # Per channel, the list this saver decoded last, kept to decode the channel's next
        # value from (`_decoded`): a growing conversation decodes only what it added.
        self._decoded = DecodedLists(value_cache_bytes)

    @classmethod
    def from_conn_string(
        cls,
        conn_string: str | URL,
        *,
        serde: SerializerProtocol | None = None,
        fenced: bool = False,
        store_clock: StoreClock | None = None,
        application: ApplicationContext | None = None,
        pool_size: int = 8,
        timeouts: Timeouts | None = None,
        value_cache_bytes: int = DEFAULT_VALUE_CACHE_BYTES,
    ) -> OwnedSaver:
        """A saver on a `SqlConnection` of its own to `conn_string` (a database URL:
        `sqlite:///path`, `postgresql://…`, `mysql://…`, or a bare SQLite file path as
        LangGraph's SQLite savers take; `pool_size` and `timeouts` are the
        connection's), to open with `async with` or `with` (as LangGraph's
        `AsyncPostgresSaver` / `PostgresSaver` and the SQLite ones are): the saver and every
        connection it opened are closed when the block exits, however it exits. The other
        options are the constructor's (a bad one is refused here, before any block runs).
        The tables come from the project's migrations: `setup()` runs them. Opening it sends
        nothing: the first call connects."""
        if isinstance(conn_string, str) and "://" not in conn_string:
            # A bare path, as `SqliteSaver.from_conn_string("checkpoints.sqlite")` takes.
            conn_string = f"sqlite:///{conn_string}"
        connection = SqlConnection(conn_string, pool_size=pool_size, timeouts=timeouts)
        saver = cls(
            connection,
            serde=serde,
            fenced=fenced,
            store_clock=store_clock,
            application=application,
            value_cache_bytes=value_cache_bytes,
        )
        saver._owns_connection = True
        saver._sync.owns = True
        return OwnedSaver(saver)

    def setup(self) -> _Done:
        """Bring the database's schema to the project's head revision (the migrations `agboss-sql
        upgrade` runs, under the database's migration lock, so instances starting together
        take turns; at head it only checks). Synchronous, and awaitable too, so both
        `saver.setup()` (as with `PostgresSaver`) and `await saver.setup()` (as with
        `AsyncPostgresSaver`) work; from async code `await saver.asetup()` does not block the
        event loop meanwhile."""
        from agboss_sql.sql.migrate import upgrade

        upgrade(self.connection.url)
        return _Done()

    async def asetup(self) -> None:
        """`setup()` on a worker thread, without blocking the caller's event loop."""
        from agboss_sql.sql.migrate import upgrade

        await asyncio.to_thread(upgrade, self.connection.url)

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
        return _key_text("thread_id", configurable["thread_id"])

    @staticmethod
    def _ns_of(config: RunnableConfig) -> str:
        return _key_text(
            "checkpoint_ns", (config.get("configurable") or {}).get("checkpoint_ns") or ""
        )

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
        return await self._put(self._sync.here(), config, checkpoint, metadata, new_versions)

    async def _put(
        self,
        connection: SqlConnection,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
        appends: bool = True,
    ) -> RunnableConfig:
        sql = self._statements(connection)
        thread_id = self._thread_of(config)
        thread_hash = _key_hash(thread_id)
        ns = self._ns_of(config)
        ns_hash = _key_hash(ns)
        checkpoint_id = _checked_key("checkpoint id", _text(checkpoint["id"]), MAX_CHECKPOINT_ID)
        parent_id = get_checkpoint_id(config)
        if parent_id:
            _checked_key("parent checkpoint id", _text(parent_id), MAX_CHECKPOINT_ID)
        lease = lease_of(config) if self.fenced else None

        values = checkpoint["channel_values"]
        versions = checkpoint["channel_versions"]
        body = dict(checkpoint)
        # Values of versioned channels live in the blobs, once per version, but for small
        # scalars (`_inlined`), which stay in the body of every checkpoint that reads them,
        # as does a value whose channel has no version (not LangGraph's way).
        inline = {k: v for k, v in values.items() if k not in versions or _inlined(v)}
        body["channel_values"] = inline
        blob_rows: list[tuple[str, str, str, bytes | None, str | None]] = []
        # The values as the serde wrote them, to keep (`_values`), and the bases the
        # appends among them name.
        whole: list[tuple[ValueKey, Stored]] = []
        bases: dict[str, str] = {}
        for channel, version in new_versions.items():
            if channel in values and channel not in inline:
                kind, data = self._dumps(values[channel])
                key: ValueKey = (
                    thread_hash,
                    ns_hash,
                    _written_channel_hash(channel),
                    _checked_key("channel version", str(version), MAX_VERSION),
                )
                whole.append((key, (kind, data)))
                append = self._as_append(key, kind, data) if appends else None
                if append is None:
                    blob_rows.append((key[2], key[3], kind, data, None))
                else:
                    blob_rows.append((key[2], key[3], kind, append[0], append[1]))
                    bases[key[2]] = append[1]
        body_kind, body_data = self._dumps(body)
        stored_metadata = get_serializable_checkpoint_metadata(config, metadata)
        run_id = stored_metadata.get("run_id")
        # The checkpoint row, named as the statements bind it (`p_<column>`).
        row: dict[str, Any] = {
            "p_thread_hash": thread_hash,
            "p_ns_hash": ns_hash,
            "p_thread_id": thread_id,
            "p_checkpoint_id": checkpoint_id,
            "p_checkpoint_ns": ns,
            "p_parent_checkpoint_id": parent_id or None,
            "p_run_hash": _key_hash(str(run_id)) if run_id is not None else None,
            "p_checkpoint_type": body_kind,
            "p_checkpoint": body_data,
            "p_metadata": _metadata_json(stored_metadata),
        }
        # The appends' bases (`a<i>_…`): the put writes only if every one is still stored.
        held: dict[str, Any] = {}
        for i, (channel_hash, base_version) in enumerate(bases.items()):
            held[f"a{i}_channel_hash"] = channel_hash
            held[f"a{i}_version"] = base_version

        def blob_params(chunk: Sequence[tuple[Any, ...]], params: dict[str, Any]) -> None:
            # A chunk is at most `MAX_ROWS` rows (one multi-row insert).
            for names, values_of_row in zip(_BLOB_PARAMS[: len(chunk)], chunk, strict=True):
                params.update(zip(names, values_of_row, strict=True))

        def writes() -> list[Exec]:
            """The put as separate statements: the blobs a chunk each, then the checkpoint."""
            out = []
            for chunk in chunks(blob_rows):
                params = {"p_thread_hash": thread_hash, "p_ns_hash": ns_hash}
                blob_params(chunk, params)
                out.append(Exec(sql.blob_insert(len(chunk), fenced=False), params))
            out.append(Exec(sql.checkpoint_upsert(fenced=False), row))
            return out

        one = len(blob_rows) <= MAX_ROWS
        try:
            if sql.fold and one:
                # One statement: the blobs, the checkpoint and (fenced) the fence, folded.
                fence = fence_params(lease, self.store_clock) if lease is not None else None
                params = dict(row)
                blob_params(blob_rows, params)
                params.update(held)
                if fence is not None:
                    params.update(fence)
                statement = sql.put(len(blob_rows), fenced=lease is not None, bases=len(bases))
                result = await connection.execute(statement, params)
                if bases and not result.rows:
                    raise _BaseGone
                if lease is not None and not result.rows:
                    # Refused: the fenced transaction below refuses too, naming the reason.
                    await self._write(connection, writes(), lease, fence)
            elif sql.scripts and lease is None and one and blob_rows:
                # One round trip: BEGIN, the blobs, the checkpoint and COMMIT in one text
                # (with appends, both under their bases' check, and the count of bases there).
                params = dict(row)
                blob_params(blob_rows, params)
                params.update(held)
                result = await connection.execute(
                    sql.put_script(len(blob_rows), len(bases)), params
                )
                if bases and (result.scalar() or 0) < len(bases):
                    raise _BaseGone
            else:
                base_check = (
                    len(bases),
                    {"p_thread_hash": thread_hash, "p_ns_hash": ns_hash, **held},
                )
                await self._write(connection, writes(), lease, None, base_check if bases else None)
        except _BaseGone:
            self._forget_bases(thread_hash, ns_hash, bases)
            return await self._put(
                connection, config, checkpoint, metadata, new_versions, appends=False
            )
        self._expect(thread_hash, ns_hash, _value_keys(body))
        self._values.keep(entry for entry in whole if _kept(entry[0][3]))
        self._remember_bases(
            (thread_hash, ns_hash, r[0], r[1])
            for r in blob_rows
            if r[4] is None and _base_worthy(r[1], r[2], r[3])
        )
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
            }
        }

    def _as_append(self, key: ValueKey, kind: str, data: bytes | None) -> tuple[bytes, str] | None:
        """`data` as an append (and the base version it names) to the channel's latest value
        this saver stored whole, if it begins with every element of that value (`_appends`)."""
        if kind != MSGPACK or not data:
            return None
        thread_hash, ns_hash, channel_hash, version = key
        with self._expected_guard:
            base_version = self._bases.get((thread_hash, ns_hash, channel_hash))
        if base_version is None or base_version == version:
            return None
        base = self._values.found(((thread_hash, ns_hash, channel_hash, base_version),))
        stored = next(iter(base.values()), None)
        if stored is None or stored[0] != MSGPACK or not stored[1]:
            return None
        append = appended(stored[1], data)
        return None if append is None else (append, base_version)

    def _remember_bases(self, rows: Iterable[ValueKey]) -> None:
        """Remember (thread hash, namespace hash, channel hash, version) values stored whole
        as their channels' bases."""
        with self._expected_guard:
            bases = self._bases
            for thread_hash, ns_hash, channel_hash, version in rows:
                bases.pop((thread_hash, ns_hash, channel_hash), None)
                bases[(thread_hash, ns_hash, channel_hash)] = version
            while len(bases) > BASES:
                del bases[next(iter(bases))]

    def _forget_bases(self, thread_hash: str, ns_hash: str, channels: Iterable[str]) -> None:
        with self._expected_guard:
            for channel_hash in channels:
                self._bases.pop((thread_hash, ns_hash, channel_hash), None)

    def _expect(self, thread_hash: str, ns_hash: str, value_keys: ValueKeys) -> None:
        """Remember the values a thread namespace's latest checkpoint reads (`_value_keys`
        of its body)."""
        keys = tuple((channel_hash, version) for _, channel_hash, version in value_keys)
        namespace = (thread_hash, ns_hash)
        with self._expected_guard:
            expected = self._expected
            expected.pop(namespace, None)
            expected[namespace] = keys
            if len(expected) > EXPECTED_NAMESPACES:
                del expected[next(iter(expected))]

    def _expected_of(self, thread_hash: str, ns_hash: str) -> BlobKeys:
        with self._expected_guard:
            return self._expected.get((thread_hash, ns_hash), ())

    async def _write(
        self,
        connection: SqlConnection,
        writes: list[Exec],
        lease: CheckpointLease | None = None,
        fence: Mapping[str, Any] | None = None,
        bases: tuple[int, Mapping[str, Any]] | None = None,
    ) -> None:
        """Run `writes` atomically: one statement alone, several in one transaction. Fenced
        (`lease`; `fence`: its fence parameters, if already read): in one transaction whose
        first statement is the fenced-effect store's fence (`_fence.fenced`), which takes the
        lease row and raises the mark, or refuses with `ExecutionFencedError` naming the
        reason, and nothing is written. `bases` (their count, the parameters of `lock_bases`): the base
        values a put's appends name are locked next, and if one is gone nothing is written
        (`_BaseGone`)."""
        if lease is None and bases is None and len(writes) == 1:
            await connection.execute(writes[0].statement, writes[0].params)
            return
        sql = self._statements(connection)
        params: dict[str, Any] = {}
        if lease is not None:
            params = dict(fence) if fence is not None else fence_params(lease, self.store_clock)

        def step() -> Step[None]:
            if lease is not None:
                yield from fenced(sql.fences, lease, params)
            if bases is not None:
                count, held = bases
                found = (yield Exec(sql.lock_bases(count), dict(held))).rows
                if len(found) < count:
                    raise _BaseGone
            for write in writes:
                _ = yield write

        await connection.run(step, transaction=True)

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
        await self._put_writes(self._sync.here(), config, writes, task_id, task_path)

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
        lease = lease_of(config) if self.fenced else None
        task = _key_text("task_id", task_id)
        shared: dict[str, Any] = {
            "p_thread_hash": _key_hash(thread_id),
            "p_ns_hash": _key_hash(self._ns_of(config)),
            "p_checkpoint_id": _checked_key(
                "checkpoint id", _text(checkpoint_id), MAX_CHECKPOINT_ID
            ),
            "p_task_hash": identity_hash(task),
            "p_task_id": task,
            "p_task_path": task_path,
        }
        replace = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        rows = [
            (WRITES_IDX_MAP.get(channel, idx), _key_text("channel", channel), *self._dumps(value))
            for idx, (channel, value) in enumerate(writes)
        ]
        execs: list[Exec] = []
        for chunk in chunks(rows):
            params = dict(shared)
            for i, (idx, channel, kind, data) in enumerate(chunk):
                params.update(
                    {f"w{i}_idx": idx, f"w{i}_channel": channel, f"w{i}_value_type": kind}
                )
                params[f"w{i}_value"] = data
            execs.append(Exec(sql.writes_insert(len(chunk), replace=replace, fenced=False), params))
        fence = fence_params(lease, self.store_clock) if lease is not None else {}
        if lease is not None and sql.fold and len(execs) == 1:
            statement = sql.writes_insert(len(rows), replace=replace, fenced=True)
            result = await connection.execute(statement, {**execs[0].params, **fence})
            if result.rows:
                return
            # No row: refused, or every write was stored already (skipped duplicates return
            # none). The fenced transaction tells which: it refuses, or adds nothing.
        await self._write(connection, execs, lease, fence)

    # --- reads ---------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint `config` names (its `checkpoint_id`), or the thread namespace's
        latest (a primary-key probe), with its pending writes and parent; `None` if absent."""
        return await self._get_tuple(self._sync.here(), config)

    async def _get_tuple(
        self, connection: SqlConnection, config: RunnableConfig
    ) -> CheckpointTuple | None:
        sql = self._statements(connection)
        thread_id = self._thread_of(config)
        ns = self._ns_of(config)
        checkpoint_id = get_checkpoint_id(config)
        params: dict[str, Any] = {
            "thread_hash": _key_hash(thread_id),
            "ns_hash": _key_hash(ns),
        }
        if checkpoint_id:
            params["checkpoint_id"] = _text(checkpoint_id)
        thread_hash, ns_hash = params["thread_hash"], params["ns_hash"]
        # The values this checkpoint is expected to read are named in the first statement,
        # but those this saver keeps (`_values`): they are taken from there if the checkpoint
        # read names them.
        expected = self._expected_of(thread_hash, ns_hash)
        kept = self._values.found((thread_hash, ns_hash, ch, v) for ch, v in expected)
        ask = tuple(k for k in expected if (thread_hash, ns_hash, *k) not in kept)[:MAX_ROWS]
        for i, (channel_hash, version) in enumerate(ask):
            params[f"k{i}_channel_hash"] = channel_hash
            params[f"k{i}_version"] = version
        statement = sql.read(by_id=bool(checkpoint_id), blobs=len(ask))
        # One step: on SQLite run inline without interleaving, on a server on one pooled
        # connection.
        found = await connection.run(
            lambda: self._read(sql, statement, params, thread_id, ns, ask, kept),
            transaction=False,
        )
        if found is None:
            return None
        if not checkpoint_id:
            self._expect(thread_hash, ns_hash, found[4])
        return self._tuple_of(*found)

    def _read(
        self,
        sql: CheckpointStatements,
        statement: Any,
        params: dict[str, Any],
        thread_id: str,
        ns: str,
        expected: BlobKeys,
        kept: Mapping[ValueKey, tuple[str, bytes | None]],
    ) -> Step[Found | None]:
        """Read a checkpoint with its pending writes and the `expected` values, then the values
        its versions name that were neither expected nor `kept` (values this saver keeps,
        valid for any checkpoint that names them: see `_values`)."""
        result = yield Exec(statement, params)
        found = None
        thread_hash, ns_hash = params["thread_hash"], params["ns_hash"]
        writes: list[Sequence[Any]] = []
        rows: Rows = {}
        for kind_of_row, *row in result.rows:
            if kind_of_row == CHECKPOINT_ROW:
                found = row
            elif kind_of_row == BLOB_ROW:
                channel_hash, version, base, _, value_type, value = row
                rows[(thread_hash, ns_hash, channel_hash, version)] = (value_type, value, base)
            else:
                # (task_id, channel, task_path, idx, value_type, value)
                writes.append(row)
        if found is None:
            return None
        checkpoint_id, parent_id, metadata, _, kind, data = found
        listed = (
            thread_id,
            ns,
            ns_hash,
            checkpoint_id,
            parent_id,
            kind,
            data,
            metadata,
            thread_hash,
        )
        body = self._loads(kind, data)
        value_keys = _value_keys(body)
        # A value expected but not found is not stored (one statement, one snapshot).
        asked = set(expected)
        keys = [(thread_hash, ns_hash, h, v) for _, h, v in value_keys if (h, v) not in asked]
        blobs: dict[tuple[Any, Any, Any, Any], tuple[Any, Any]] = {}
        if keys:
            held = {**kept, **self._values.found(k for k in keys if k not in kept)}
            blobs.update((k, held[k]) for k in keys if k in held)
            missing = [k for k in keys if k not in held]
            if missing:
                rows.update((yield from self._blobs(sql, missing)))
        if rows:
            fetched = yield from self._whole(sql, rows)
            blobs.update(fetched)
            self._values.keep(e for e in fetched_entries(fetched) if _kept(e[0][3]))
        return listed, body, blobs, writes, value_keys

    def _blobs(
        self, sql: CheckpointStatements, keys: Sequence[tuple[Any, Any, Any, Any]]
    ) -> Step[Rows]:
        """The stored rows of these (thread, namespace, channel hashes, version) keys."""
        found: Rows = {}
        columns = (*BLOB_KEY, "value_type", "value", "base_version")
        for chunk in chunks(list(dict.fromkeys(keys))):
            statement = sql.keyed(checkpoint_blobs, columns, BLOB_KEY, len(chunk))
            result = yield Exec(statement, keyed_params(chunk, BLOB_KEY))
            for thread_hash, ns_hash, channel_hash, version, kind, value, base in result.rows:
                found[(thread_hash, ns_hash, channel_hash, version)] = (kind, value, base)
        return found

    def _whole(
        self, sql: CheckpointStatements, rows: Rows
    ) -> Step[dict[tuple[Any, Any, Any, Any], tuple[Any, Any]]]:
        """The whole values of these rows: an append (`_appends`) joined to its base, taken
        from the rows, from `_values`, or read. An append whose base is not stored is left
        out, as a value whose row is not."""
        whole: dict[tuple[Any, Any, Any, Any], tuple[Any, Any]] = {}
        appends: dict[tuple[Any, Any, Any, Any], tuple[Any, bytes, tuple[Any, Any, Any, Any]]] = {}
        for key, (kind, value, base) in rows.items():
            if isinstance(value, memoryview):
                value = bytes(value)
            if base is None or value is None:
                whole[key] = (kind, value)
            else:
                appends[key] = (kind, value, (key[0], key[1], key[2], _text(base)))
        if not appends:
            return whole
        bases: dict[tuple[Any, Any, Any, Any], tuple[Any, Any]] = {}
        wanted = {base for _, _, base in appends.values()}
        for base in wanted:
            if base in whole:
                bases[base] = whole[base]
        bases.update(self._values.found(b for b in wanted if b not in bases))
        missing = [b for b in wanted if b not in bases]
        if missing:
            more = yield from self._blobs(sql, missing)
            # A base is stored whole (never an append).
            bases.update(
                (k, (kind, bytes(value) if isinstance(value, memoryview) else value))
                for k, (kind, value, base) in more.items()
                if base is None and value is not None
            )
        for key, (kind, value, base) in appends.items():
            stored = bases.get(base)
            if stored is not None and stored[1] is not None:
                whole[key] = (kind, joined(stored[1], value))
        return whole

    def _tuple_of(
        self,
        row: Sequence[Any],
        body: dict[str, Any],
        blobs: Mapping[tuple[str, str, str, str], tuple[Any, Any]],
        writes: Sequence[Sequence[Any]],
        value_keys: ValueKeys,
    ) -> CheckpointTuple:
        thread_id, ns, ns_hash, checkpoint_id, parent_id, _, _, metadata, thread_hash = row
        thread_id, ns = _text(thread_id), _text(ns)
        values = dict(body.get("channel_values") or {})
        for channel, channel_hash, version in value_keys:
            stored = blobs.get((thread_hash, ns_hash, channel_hash, version))
            if stored is not None:
                kind, data = stored
                values[channel] = self._decoded.decode(
                    self.serde, (thread_hash, ns_hash, channel_hash), _text(kind), data
                )
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
        async for found in self._list(self._sync.here(), config, filter, before, limit):
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
            params["thread_hash"] = _key_hash(self._thread_of(config))
        if namespace:
            assert config is not None
            params["ns_hash"] = _key_hash(self._ns_of(config))
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
            shape = ListShape(
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
        self, sql: CheckpointStatements, shape: ListShape, params: dict[str, Any]
    ) -> Step[tuple[int, list[Found]]]:
        """One page of listed checkpoints, with their values and pending writes read by key."""
        rows = (yield Exec(sql.listing(shape), params)).rows
        if not rows:
            return 0, []
        bodies = [self._loads(row[5], row[6]) for row in rows]
        value_keys = [_value_keys(body) for body in bodies]
        # The page's values and pending writes, by key, in as few statements as fit.
        lookups: list[tuple[int, tuple[Any, ...]]] = [
            (BLOB_ROW, key)
            for key in dict.fromkeys(
                (row[8], row[2], channel_hash, version)
                for row, keys in zip(rows, value_keys, strict=True)
                for _, channel_hash, version in keys
            )
        ]
        lookups += [
            (WRITE_ROW, key) for key in dict.fromkeys((row[8], row[2], row[3]) for row in rows)
        ]
        rows_read: Rows = {}
        writes: dict[tuple[Any, Any, Any], list[Sequence[Any]]] = {}
        for chunk in chunks(lookups, MAX_LOOKUPS):
            blob_keys = [key for kind, key in chunk if kind == BLOB_ROW]
            write_keys = [key for kind, key in chunk if kind == WRITE_ROW]
            params = {
                **keyed_params(blob_keys, BLOB_KEY, prefix="b"),
                **keyed_params(write_keys, CHECKPOINT_KEY, prefix="w"),
            }
            statement = sql.values_and_writes(len(blob_keys), len(write_keys))
            for kind_of_row, thread_hash, ns_hash, key, *rest in (
                yield Exec(statement, params)
            ).rows:
                if kind_of_row == BLOB_ROW:
                    version, base, _, _, value_type, value = rest
                    rows_read[(thread_hash, ns_hash, key, version)] = (value_type, value, base)
                else:
                    # (task_id, channel, task_path, idx, value_type, value)
                    writes.setdefault((thread_hash, ns_hash, key), []).append(rest)
        blobs = yield from self._whole(sql, rows_read)
        return len(rows), [
            (row, body, blobs, writes.get((row[8], row[2], row[3]), []), keys)
            for row, body, keys in zip(rows, bodies, value_keys, strict=True)
        ]

    # --- deleting, copying, pruning ------------------------------------------------------

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, pending write and value of `thread_id`, atomically."""
        await self._delete_thread(self._sync.here(), thread_id)

    async def _delete_thread(self, connection: SqlConnection, thread_id: str) -> None:
        sql = self._statements(connection)
        params = {"thread_hash": identity_hash(_key_text("thread_id", thread_id))}
        await self._write(connection, [Exec(s, params) for s in sql.delete_thread])
        self._values.forget_thread(params["thread_hash"])
        self._decoded.forget_thread(params["thread_hash"])

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, pending write and value of one thread to another, atomically
        (rows the target already has are kept)."""
        await self._copy_thread(self._sync.here(), source_thread_id, target_thread_id)

    async def _copy_thread(self, connection: SqlConnection, source: str, target: str) -> None:
        sql = self._statements(connection)
        source = _key_text("source_thread_id", source)
        target = _key_text("target_thread_id", target)
        if source == target:
            return
        params = {
            "source_hash": identity_hash(source),
            "target_hash": identity_hash(target),
            "target": target,
        }
        await self._write(connection, [Exec(s, params) for s in sql.copy_thread])

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints whose metadata names one of `run_ids`, their pending writes,
        and the values no remaining checkpoint of their namespace reads, in one transaction."""
        await self._delete_for_runs(self._sync.here(), run_ids)

    async def _delete_for_runs(self, connection: SqlConnection, run_ids: Sequence[str]) -> None:
        if isinstance(run_ids, str):
            raise TypeError("run_ids must be a sequence of run ids, not a str")
        hashes = list(dict.fromkeys(identity_hash(str(run_id)) for run_id in run_ids))
        if not hashes:
            return
        sql = self._statements(connection)

        def step() -> Step[None]:
            doomed: list[tuple[Any, Any, Any]] = []
            for runs in chunks(hashes):
                found = {f"k{i}_run_hash": value for i, value in enumerate(runs)}
                doomed += (yield Exec(sql.run_checkpoints(len(runs)), found)).rows
            for keys in chunks(doomed):
                params = keyed_params(keys, CHECKPOINT_KEY)
                yield Exec(sql.keyed_delete(checkpoints, CHECKPOINT_KEY, len(keys)), params)
                yield Exec(sql.keyed_delete(checkpoint_writes, CHECKPOINT_KEY, len(keys)), params)
            for thread_hash, ns_hash in dict.fromkeys((row[0], row[1]) for row in doomed):
                yield from self._collect_blobs(sql, thread_hash, ns_hash)

        await connection.run(step, transaction=True)

    def _collect_blobs(
        self, sql: CheckpointStatements, thread_hash: Any, ns_hash: Any
    ) -> Step[None]:
        """Delete the values of one thread namespace that no checkpoint of it reads."""
        params = {"thread_hash": thread_hash, "ns_hash": ns_hash}
        read: set[tuple[str, str]] = set()
        for kind, data in (yield Exec(sql.namespace_bodies(), params)).rows:
            versions = self._loads(kind, data)["channel_versions"]
            read.update((identity_hash(ch), str(version)) for ch, version in versions.items())
        stored = (yield Exec(sql.namespace_blob_keys(), params)).rows
        # An append read keeps its base.
        read.update(
            (channel, _text(base))
            for channel, version, base in stored
            if base is not None and (channel, version) in read
        )
        garbage = [
            (thread_hash, ns_hash, channel, version)
            for channel, version, _ in stored
            if (channel, version) not in read
        ]
        for chunk in chunks(garbage):
            yield Exec(
                sql.keyed_delete(checkpoint_blobs, BLOB_KEY, len(chunk)),
                keyed_params(chunk, BLOB_KEY),
            )

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`"keep_latest"`: keep each namespace's latest checkpoint of each thread (its pending
        writes and the values it reads; its parent link is cleared), delete the rest;
        `"delete"`: delete the threads. One transaction per thread. A thread that uses a
        `DeltaChannel` is refused for `"keep_latest"` (`NotImplementedError`), as its state
        needs the ancestors."""
        await self._prune(self._sync.here(), thread_ids, strategy)

    async def _prune(
        self, connection: SqlConnection, thread_ids: Sequence[str], strategy: str
    ) -> None:
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread ids, not a str")
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        threads = [_key_text("thread_id", t) for t in dict.fromkeys(thread_ids)]
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
        thread_hash = identity_hash(thread_id)
        rows = (yield Exec(sql.lock_thread, {"thread_hash": thread_hash})).rows
        heads: dict[Any, Any] = {}
        for ns_hash, checkpoint_id in rows:
            # Rows come newest first per namespace, in the database's own order.
            heads.setdefault(ns_hash, checkpoint_id)
        if not heads:
            return
        keys = [(thread_hash, ns_hash, checkpoint_id) for ns_hash, checkpoint_id in heads.items()]
        read: set[tuple[Any, str, str]] = set()
        for heads_chunk in chunks(keys):
            statement = sql.keyed(
                checkpoints,
                ("ns_hash", "checkpoint_type", "checkpoint", "metadata"),
                CHECKPOINT_KEY,
                len(heads_chunk),
            )
            for ns_hash, kind, data, metadata in (
                yield Exec(statement, keyed_params(heads_chunk, CHECKPOINT_KEY))
            ).rows:
                if "counters_since_delta_snapshot" in json.loads(_text(metadata)):
                    raise NotImplementedError(
                        f"keep_latest cannot prune thread {thread_id!r}: it uses a DeltaChannel, "
                        "whose state is rebuilt from the ancestors pruning would delete"
                    )
                versions = self._loads(kind, data)["channel_versions"]
                read.update((ns_hash, identity_hash(ch), str(v)) for ch, v in versions.items())
        for ns_hash, head in heads.items():
            params = {"thread_hash": thread_hash, "ns_hash": ns_hash, "checkpoint_id": head}
            yield Exec(sql.prune_checkpoints, params)
            yield Exec(sql.prune_writes, params)
            yield Exec(sql.orphan_head, params)
        stored = (yield Exec(sql.select_blob_keys, {"thread_hash": thread_hash})).rows
        # An append read keeps its base.
        read.update(
            (ns_hash, channel, _text(base))
            for ns_hash, channel, version, base in stored
            if base is not None and (ns_hash, channel, version) in read
        )
        garbage: list[tuple[str, Any, Any, Any]] = [
            (thread_hash, ns_hash, channel, version)
            for ns_hash, channel, version, _ in stored
            if (ns_hash, channel, version) not in read
        ]
        for chunk in chunks(garbage):
            yield Exec(
                sql.keyed_delete(checkpoint_blobs, BLOB_KEY, len(chunk)),
                keyed_params(chunk, BLOB_KEY),
            )

    # --- synchronous methods: the async ones on the saver's own event loop -----------------

    def _run_sync(
        self,
        work: Callable[[SqlConnection], Coroutine[Any, Any, T]],
        *,
        writes: bool = False,
        pin: Pin | None = None,
    ) -> T:
        return self._sync.run(work, writes=writes, pin=pin)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """`aput`, from synchronous code."""
        result: RunnableConfig = self._run_sync(
            lambda c: self._put(c, config, checkpoint, metadata, new_versions), writes=True
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
        self._run_sync(
            lambda c: self._put_writes(c, config, writes, task_id, task_path), writes=True
        )

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
        pin = Pin()

        async def next_item(connection: SqlConnection) -> tuple[bool, CheckpointTuple | None]:
            if not pages:
                pages.append(self._list(connection, config, filter, before, limit))
            try:
                return True, await anext(pages[0])
            except StopAsyncIteration:
                return False, None

        while True:
            more, found = self._run_sync(next_item, pin=pin)
            if not more:
                return
            assert found is not None
            yield found

    def delete_thread(self, thread_id: str) -> None:
        """`adelete_thread`, from synchronous code."""
        self._run_sync(lambda c: self._delete_thread(c, thread_id), writes=True)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """`adelete_for_runs`, from synchronous code."""
        self._run_sync(lambda c: self._delete_for_runs(c, run_ids), writes=True)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """`acopy_thread`, from synchronous code."""
        self._run_sync(
            lambda c: self._copy_thread(c, source_thread_id, target_thread_id), writes=True
        )

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`aprune`, from synchronous code."""
        self._run_sync(lambda c: self._prune(c, thread_ids, strategy), writes=True)

    def close(self) -> None:
        """Stop the event loop of the sync methods and close its connection (a later sync
        call starts them anew). A sync call in flight there finishes, or after
        `CLOSE_GRACE_S` is cancelled and raises `StoreUnavailableError`
        (`CommitOutcomeUnknownError` for a write): no caller is left waiting. The saver's
        own connection is not closed here: one given to the constructor stays its owner's,
        one from `from_conn_string` is closed on leaving the block (or by `aclose()`)."""
        self._sync.close()

    async def aclose(self) -> None:
        """`close()` without blocking the caller's loop, and the connections the saver opened
        for other event loops; then, for a saver from `from_conn_string`, its own connection
        too: later calls, sync or async, fail with `StoreUnavailableError`. A connection
        given to the constructor stays open."""
        await asyncio.to_thread(functools.partial(self._sync.close, final=self._owns_connection))
        await self._sync.aclose_connections(home=self._owns_connection)

    def _close_owned(self) -> None:
        """The sync `with` block's exit: `aclose()`, from synchronous code."""
        self._sync.close(final=self._owns_connection)
        self._sync.close_connections(home=self._owns_connection)

    async def __aenter__(self) -> SqlCheckpointSaver:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """`aclose()` on leaving `async with saver:`."""
        await self.aclose()


class _Done:
    """What `setup()` answers: already done, and awaitable (`await saver.setup()`)."""

    def __await__(self) -> Generator[None, None, None]:
        return
        yield


class OwnedSaver:
    """What `SqlCheckpointSaver.from_conn_string` answers: the saver, opened by `async with`
    or `with`, and closed with every connection it opened when the block exits."""

    def __init__(self, saver: SqlCheckpointSaver) -> None:
        self.saver = saver

    def __enter__(self) -> SqlCheckpointSaver:
        return self.saver

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.saver._close_owned()

    async def __aenter__(self) -> SqlCheckpointSaver:
        return self.saver

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.saver.aclose()
