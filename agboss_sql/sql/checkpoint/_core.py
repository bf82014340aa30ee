"""What every part of the saver shares: its state, keys, serde, remembered values and the
atomic write; the module-level helpers that turn LangGraph's keys and values into rows.

`SaverCore` is the base of the saver's async methods (`_writes`, `_reads`, `_aio`); the
public class, with the synchronous methods, is `saver.SqlCheckpointSaver`.
"""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, writes_sort_key
from langgraph.checkpoint.serde.base import SerializerProtocol

from agboss_sql.contracts.clocks import StoreClock
from agboss_sql.contracts.errors import (
    InvalidIdentifierError,
    InvalidPayloadError,
    InvalidValueError,
)
from agboss_sql.contracts.limits import (
    MAX_CHANNEL_VERSION_LENGTH,
    MAX_CHECKPOINT_ID_LENGTH,
    MAX_CHECKPOINT_WRITE_BYTES,
    MAX_SAVER_KEY_LENGTH,
    over_limit,
    unstorable_text_rule_of,
)
from agboss_sql.contracts.types import ApplicationContext, LeaseCheck
from agboss_sql.sql._base import identity_hash
from agboss_sql.sql._fence import fence_params, fenced
from agboss_sql.sql.checkpoint._bridge import SyncBridge
from agboss_sql.sql.checkpoint._decoded import DecodedLists
from agboss_sql.sql.checkpoint._layout import BODY_HOLDS_LISTS
from agboss_sql.sql.checkpoint._lease import CheckpointLease
from agboss_sql.sql.checkpoint._statements import CheckpointStatements
from agboss_sql.sql.checkpoint._sync import SyncDatabase
from agboss_sql.sql.checkpoint._values import (
    DEFAULT_VALUE_CACHE_BYTES,
    BoundedCache,
    ValueCache,
    ValueKey,
)
from agboss_sql.sql.connection import Exec, SqlConnection, Step

Database = SqlConnection | SyncDatabase
"""What the saver's operations run on: the connection of the running event loop (async
methods), or the synchronous driver connections (sync methods, `_sync`)."""

ValueKeys = list[tuple[str, str, str]]
"""(channel, channel hash, version) of each value a checkpoint body reads from a blob row."""


def _text(value: Any) -> str:
    if type(value) is str:
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode()
    return str(value)


_KEPT_KEY_TEXT = 256
"""Characters of the longest key text whose check is remembered (`_storable_key_text`)."""


@functools.lru_cache(maxsize=8192)
def _storable_key_text(text: str) -> bool:
    """Whether `_key_text` takes `text` (a text of at most `_KEPT_KEY_TEXT` characters):
    every call of a thread checks the same few, so each is checked once while in use."""
    return unstorable_text_rule_of(text) is None


def _key_text(what: str, value: Any) -> str:
    """`value` as the text LangGraph means by it (any text: empty, long, ending in spaces:
    it is keyed by its SHA-256), or `InvalidIdentifierError` for a text no database here can
    store (a NUL character, a lone surrogate) or longer than `MAX_SAVER_KEY_LENGTH`, before
    anything is sent."""
    text = value if type(value) is str else _text(value)
    if len(text) <= _KEPT_KEY_TEXT and _storable_key_text(text):
        return text
    if len(text) > MAX_SAVER_KEY_LENGTH:
        raise InvalidIdentifierError(
            over_limit(what, len(text), "MAX_SAVER_KEY_LENGTH", MAX_SAVER_KEY_LENGTH),
            limit="MAX_SAVER_KEY_LENGTH",
        )
    unstorable = unstorable_text_rule_of(text)
    if unstorable is not None:
        raise InvalidIdentifierError(f"{what} must not hold {unstorable}, got {text!r:.80}")
    return text


def _checked_write_bytes(what: str, size: int) -> None:
    """`InvalidPayloadError` when one saver call would write `size` bytes, over
    `MAX_CHECKPOINT_WRITE_BYTES`, before anything is sent."""
    if size > MAX_CHECKPOINT_WRITE_BYTES:
        raise InvalidPayloadError(
            over_limit(
                what, size, "MAX_CHECKPOINT_WRITE_BYTES", MAX_CHECKPOINT_WRITE_BYTES, "bytes"
            ),
            limit="MAX_CHECKPOINT_WRITE_BYTES",
        )


def _checked_filter(filters: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """`filters` (a metadata filter's keys and values) unless a key or a text inside a value
    holds what no database stores (a NUL character, a lone surrogate): `InvalidValueError`
    on every database, before any statement (PostgreSQL's JSON refuses a NUL, the others
    would match nothing)."""
    pending: list[Any] = [part for pair in filters for part in pair]
    while pending:
        part = pending.pop()
        if isinstance(part, dict):
            pending.extend(part.keys())
            pending.extend(part.values())
        elif isinstance(part, (list, tuple)):
            pending.extend(part)
        elif isinstance(part, str):
            unstorable = unstorable_text_rule_of(part)
            if unstorable is not None:
                raise InvalidValueError(f"a metadata filter must not hold {unstorable}")
    return filters


def _utf8_size(what: str, text: str) -> int:
    """Bytes of `text` as UTF-8, or `InvalidPayloadError` for a lone surrogate (no UTF-8
    form: no database stores it), before anything is sent."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidPayloadError(f"{what} holds a lone surrogate: no UTF-8 form") from None


def _write_order(write: Sequence[Any]) -> tuple[str, str, int]:
    """`writes_sort_key` of a pending write as read (task id, channel, task path, index, …)."""
    task_id, _, task_path, idx = write[0], write[1], write[2], write[3]
    if type(task_path) is str and type(task_id) is str and type(idx) is int:
        return writes_sort_key(task_path, task_id, idx)
    return writes_sort_key(_text(task_path), _text(task_id), int(idx))


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


_CHANNEL_HASHES: dict[str, str] = {}
"""`_channel_hash` of the channel names bodies read name, by name: a list reads every
checkpoint's few names again, and a dictionary look-up costs half a cached call."""


def _value_keys(body: Mapping[str, Any]) -> ValueKeys:
    """(channel, channel hash, version) of each value `body` reads from a blob row: the
    channel versions not in its `channel_values` (a body holds the values it inlines; one
    written before values were inlined holds only unversioned ones, so the same rule reads
    both)."""
    inline = body.get("channel_values") or ()
    hashes = _CHANNEL_HASHES
    keys: ValueKeys = []
    for ch, v in body["channel_versions"].items():
        if ch in inline:
            continue
        if type(ch) is str:
            channel_hash = hashes.get(ch)
            if channel_hash is None:
                if len(hashes) >= 4096:
                    hashes.clear()
                channel_hash = hashes[ch] = _channel_hash(ch)
        else:
            channel_hash = _channel_hash(str(ch))
        keys.append((ch, channel_hash, v if type(v) is str else str(v)))
    return keys


EXPECTED_NAMESPACES = 4096
"""Thread namespaces whose latest checkpoint's values a saver remembers (see `_expect`)."""

BlobKeys = tuple[tuple[str, str], ...]
"""(channel hash, version) of the values a checkpoint reads."""

BASES = 16384
"""Channels whose latest value stored whole a saver remembers, as the base of appends."""


class _BaseGone(Exception):
    """A put's append names a base value no longer stored (deleted by another saver since
    this one wrote it): the put is made again with every value whole."""


def _kept(version: str) -> bool:
    """Whether a value of this version may be kept (`_values`): only versions made by
    `get_next_version` (or LangGraph's savers, in the same form), whose random fraction no
    later put of another value repeats, even after its thread was deleted elsewhere and
    begun again. A version a caller made up (`"1"`) may name another value after that."""
    return len(version) > 34 and version[32] == "."


_KEY_LIMITS = {
    MAX_CHECKPOINT_ID_LENGTH: "MAX_CHECKPOINT_ID_LENGTH",
    MAX_CHANNEL_VERSION_LENGTH: "MAX_CHANNEL_VERSION_LENGTH",
}


def _checked_key(what: str, value: str, limit: int) -> str:
    if len(value) > limit:
        name = _KEY_LIMITS.get(limit, "MAX_IDENTIFIER_LENGTH")
        raise InvalidIdentifierError(
            f"{what} must be at most {limit} characters ({name}), got {len(value)}: {value!r:.80}",
            limit=name,
        )
    return value


class SaverCore(BaseCheckpointSaver[str]):
    """The saver's state and what its reads and writes share (see `saver.SqlCheckpointSaver`
    for the options and the promises)."""

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
        # The sync methods' synchronous driver connections (`_sync`).
        self._native = SyncDatabase(connection)
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
        # What a `DeltaChannel` history walk needs of each checkpoint body it read (`_delta`),
        # by checkpoint key, with the stored bytes it was decoded from; within the same bound.
        self._delta_bodies: BoundedCache[tuple[str, str, str], tuple[Any, Any, Any, Any]] = (
            BoundedCache(value_cache_bytes)
        )

    def _statements(self, connection: Database) -> CheckpointStatements:
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
        """A checkpoint body as the serde wrote it (its type's `BODY_HOLDS_LISTS` left out)."""
        if isinstance(data, memoryview):
            data = bytes(data)
        kind = _text(kind)
        if kind.startswith(BODY_HOLDS_LISTS):
            kind = kind[len(BODY_HOLDS_LISTS) :]
        return self.serde.loads_typed((kind, data))

    def get_next_version(self, current: str | None, channel: None) -> str:
        """The next version of a channel: an increasing counter with a random fraction, so two
        branches forked from one checkpoint never give one version two values."""
        # Versions another saver wrote may be ints: the counter is the integer part.
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

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
        connection: Database,
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
