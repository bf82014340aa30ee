"""The saver's writes: `aput` (a checkpoint and its new values, as appends where they pay)
and `aput_writes` (a task's pending writes), each in one statement, script or transaction
as the database allows (see the package's docstring for the statements per operation)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)

from agboss_sql.sql._base import identity_hash
from agboss_sql.sql._fence import fence_params
from agboss_sql.sql.checkpoint._appends import MIN_BASE, MSGPACK, appended, array_header
from agboss_sql.sql.checkpoint._core import (
    Database,
    SaverCore,
    _BaseGone,
    _checked_key,
    _checked_write_bytes,
    _kept,
    _key_hash,
    _key_text,
    _text,
    _utf8_size,
    _value_keys,
    _written_channel_hash,
)
from agboss_sql.sql.checkpoint._layout import (
    BLOB_VALUES,
    BODY_HOLDS_LISTS,
    MAX_BODY_TYPE,
    MAX_CHECKPOINT_ID,
    MAX_ROWS,
    MAX_VERSION,
    chunks,
)
from agboss_sql.sql.checkpoint._lease import CheckpointLease, lease_of
from agboss_sql.sql.checkpoint._statements import CheckpointStatements
from agboss_sql.sql.checkpoint._values import Stored, ValueKey
from agboss_sql.sql.connection import Exec

INLINE_TEXT = 1024
"""Characters of the longest text value kept in the checkpoint body rather than a blob row."""

INLINE_ITEMS = 16
"""Elements of the longest list kept in the checkpoint body (`_inlined`)."""

INLINE_ITEM_TEXT = 64
"""Characters of the longest text element of a list kept in the checkpoint body."""

_INT64 = (-(2**63), 2**63)


def _scalar(value: Any, text: int) -> bool:
    kind = type(value)
    if value is None or kind is bool or kind is float:
        return True
    if kind is int:
        return bool(_INT64[0] <= value < _INT64[1])
    return kind is str and len(value) <= text


def _inlined(value: Any) -> bool:
    """Whether a channel value is kept in the checkpoint body rather than a value row: a
    small scalar (None, a bool, a float, a 64-bit int, a text of at most `INLINE_TEXT`
    characters, as LangGraph's own savers keep them) or a short list of such scalars (at
    most `INLINE_ITEMS`, texts of at most `INLINE_ITEM_TEXT` characters); exact types only,
    so a subclass (an enum, say) keeps the type its serde records in a blob.

    A checkpoint that reads a version kept inline holds it in its body, and that version
    has no row: every put decides again from the value alone, so a later checkpoint that
    still reads the version keeps it in its body too. These bounds are part of what is
    stored: raising them is safe, lowering them is not (a put would then look for a row
    that was never written)."""
    if type(value) is list:
        return len(value) <= INLINE_ITEMS and all(_scalar(item, INLINE_ITEM_TEXT) for item in value)
    return _scalar(value, INLINE_TEXT)


# Values that are not JSON (a UUID run id, say) are kept as their text, as the serializable
# metadata of LangGraph's own savers would show them. One encoder for every put:
# `json.dumps` with options builds a new one per call.
_METADATA_ENCODER = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str
)


def _metadata_json(metadata: Mapping[str, Any]) -> str:
    return _METADATA_ENCODER.encode(metadata)


_BLOB_PARAMS = tuple(tuple(f"b{i}_{column}" for column in BLOB_VALUES) for i in range(MAX_ROWS))
"""The parameter names of the `i`th blob row of a multi-row insert, in `BLOB_VALUES` order."""


_WRITE_PARAMS = tuple(
    (f"w{i}_idx", f"w{i}_channel", f"w{i}_value_type", f"w{i}_value") for i in range(MAX_ROWS)
)
"""The parameter names of the `i`th pending write of a multi-row insert: its index, channel,
value type and value."""


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


BlobRow = tuple[str, str, str, bytes | None, str | None]
"""A value row a put writes: (channel hash, version, value type, the value or its append to
its base, the base's version or None)."""


class _PutKeys(NamedTuple):
    """The keys of the checkpoint a put writes, checked."""

    thread_id: str
    thread_hash: str
    ns: str
    ns_hash: str
    checkpoint_id: str
    parent_id: str | None


class _NewValues(NamedTuple):
    """What a put writes besides the checkpoint's keys and metadata."""

    body: dict[str, Any]
    """The checkpoint with only the values it keeps inline (`_inlined`)."""
    rows: list[BlobRow]
    """The value rows of its new versions."""
    whole: list[tuple[ValueKey, Stored]]
    """Those values as the serde wrote them, to keep (`_values`)."""
    bases: dict[str, str]
    """The base version each append names, by channel hash."""
    lists: bool
    """Whether the body keeps a versioned list inline (`BODY_HOLDS_LISTS`)."""


def _blob_params(chunk: Sequence[BlobRow], params: dict[str, Any]) -> None:
    """Add the parameters of a chunk of at most `MAX_ROWS` value rows (one multi-row insert)."""
    for names, values_of_row in zip(_BLOB_PARAMS[: len(chunk)], chunk, strict=True):
        params.update(zip(names, values_of_row, strict=True))


def _held(bases: Mapping[str, str]) -> dict[str, Any]:
    """The parameters naming the appends' bases (`a<i>_…`): the put writes only if every one
    is still stored."""
    held: dict[str, Any] = {}
    for i, (channel_hash, base_version) in enumerate(bases.items()):
        held[f"a{i}_channel_hash"] = channel_hash
        held[f"a{i}_version"] = base_version
    return held


def _separate(sql: CheckpointStatements, row: dict[str, Any], rows: list[BlobRow]) -> list[Exec]:
    """A put as separate statements: the value rows a chunk each, then the checkpoint."""
    out = []
    for chunk in chunks(rows):
        params = {"p_thread_hash": row["p_thread_hash"], "p_ns_hash": row["p_ns_hash"]}
        _blob_params(chunk, params)
        out.append(Exec(sql.blob_insert(len(chunk), fenced=False), params))
    out.append(Exec(sql.checkpoint_upsert(fenced=False), row))
    return out


class SaverWrites(SaverCore):
    """The saver's async writes."""

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
        connection: Database,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
        appends: bool = True,
    ) -> RunnableConfig:
        keys = self._put_keys(config, checkpoint)
        lease = lease_of(config) if self.fenced else None
        new = self._new_values(keys, checkpoint, new_versions, appends)
        row = self._checkpoint_row(keys, config, metadata, new.body, new.lists)
        _checked_write_bytes(
            "a put",
            len(row["p_checkpoint"] or b"")
            + _utf8_size("a checkpoint's metadata", row["p_metadata"])
            + sum(len(data or b"") for _, _, _, data, _ in new.rows),
        )
        try:
            await self._send_put(connection, row, new, lease)
        except _BaseGone:
            self._forget_bases(keys.thread_hash, keys.ns_hash, new.bases)
            return await self._put(
                connection, config, checkpoint, metadata, new_versions, appends=False
            )
        self._remember_put(keys, new)
        return {
            "configurable": {
                "thread_id": keys.thread_id,
                "checkpoint_ns": keys.ns,
                "checkpoint_id": keys.checkpoint_id,
            }
        }

    def _put_keys(self, config: RunnableConfig, checkpoint: Checkpoint) -> _PutKeys:
        thread_id = self._thread_of(config)
        ns = self._ns_of(config)
        checkpoint_id = _checked_key("checkpoint id", _text(checkpoint["id"]), MAX_CHECKPOINT_ID)
        parent_id = get_checkpoint_id(config)
        if parent_id:
            _checked_key("parent checkpoint id", _text(parent_id), MAX_CHECKPOINT_ID)
        return _PutKeys(
            thread_id, _key_hash(thread_id), ns, _key_hash(ns), checkpoint_id, parent_id
        )

    def _new_values(
        self,
        keys: _PutKeys,
        checkpoint: Checkpoint,
        new_versions: ChannelVersions,
        appends: bool,
    ) -> _NewValues:
        """The body to store and the value rows of `new_versions`, as appends to their
        channels' bases where they pay (`appends`)."""
        values = checkpoint["channel_values"]
        versions = checkpoint["channel_versions"]
        body = dict(checkpoint)
        # Values of versioned channels live in the blobs, once per version, but for small
        # scalars and short lists of them (`_inlined`), which stay in the body of every
        # checkpoint that reads them, as does a value whose channel has no version (not
        # LangGraph's way).
        inline = {k: v for k, v in values.items() if k not in versions or _inlined(v)}
        body["channel_values"] = inline
        lists = any(type(v) is list and k in versions for k, v in inline.items())
        rows: list[BlobRow] = []
        whole: list[tuple[ValueKey, Stored]] = []
        bases: dict[str, str] = {}
        for channel, version in new_versions.items():
            # Checked whether or not the value is a row: the limit is the same for every
            # version, wherever its value is kept.
            checked = _checked_key("channel version", str(version), MAX_VERSION)
            if channel in values and channel not in inline:
                kind, data = self._dumps(values[channel])
                key: ValueKey = (
                    keys.thread_hash,
                    keys.ns_hash,
                    _written_channel_hash(channel),
                    checked,
                )
                whole.append((key, (kind, data)))
                append = self._as_append(key, kind, data) if appends else None
                if append is None:
                    rows.append((key[2], key[3], kind, data, None))
                else:
                    rows.append((key[2], key[3], kind, append[0], append[1]))
                    bases[key[2]] = append[1]
        return _NewValues(body, rows, whole, bases, lists)

    def _checkpoint_row(
        self,
        keys: _PutKeys,
        config: RunnableConfig,
        metadata: CheckpointMetadata,
        body: dict[str, Any],
        lists: bool,
    ) -> dict[str, Any]:
        """The checkpoint row, named as the statements bind it (`p_<column>`); its type marked
        when the body keeps lists inline (`BODY_HOLDS_LISTS`)."""
        body_kind, body_data = self._dumps(body)
        if lists:
            body_kind = BODY_HOLDS_LISTS + body_kind
            if len(body_kind) > MAX_BODY_TYPE:
                raise ValueError(
                    f"the serde's type {body_kind[len(BODY_HOLDS_LISTS) :]!r} is too long: a "
                    f"checkpoint body's type is at most {MAX_BODY_TYPE - len(BODY_HOLDS_LISTS)} "
                    "characters"
                )
        stored_metadata = get_serializable_checkpoint_metadata(config, metadata)
        run_id = stored_metadata.get("run_id")
        return {
            "p_thread_hash": keys.thread_hash,
            "p_ns_hash": keys.ns_hash,
            "p_thread_id": keys.thread_id,
            "p_checkpoint_id": keys.checkpoint_id,
            "p_checkpoint_ns": keys.ns,
            "p_parent_checkpoint_id": keys.parent_id or None,
            "p_run_hash": _key_hash(str(run_id)) if run_id is not None else None,
            "p_checkpoint_type": body_kind,
            "p_checkpoint": body_data,
            "p_metadata": _metadata_json(stored_metadata),
        }

    async def _send_put(
        self,
        connection: Database,
        row: dict[str, Any],
        new: _NewValues,
        lease: CheckpointLease | None,
    ) -> None:
        """Write the put in as few round trips as the database allows; `_BaseGone` if a base
        its appends name is no longer stored (nothing is written then)."""
        sql = self._statements(connection)
        held = _held(new.bases)
        one = len(new.rows) <= MAX_ROWS
        if sql.fold and one:
            await self._put_folded(connection, sql, row, new, held, lease)
        elif sql.scripts and lease is None and one and new.rows:
            await self._put_script(connection, sql, row, new, held)
        else:
            base_check = (
                len(new.bases),
                {"p_thread_hash": row["p_thread_hash"], "p_ns_hash": row["p_ns_hash"], **held},
            )
            await self._write(
                connection,
                _separate(sql, row, new.rows),
                lease,
                None,
                base_check if new.bases else None,
            )

    async def _put_folded(
        self,
        connection: Database,
        sql: CheckpointStatements,
        row: dict[str, Any],
        new: _NewValues,
        held: dict[str, Any],
        lease: CheckpointLease | None,
    ) -> None:
        """One statement: the value rows, the checkpoint and (fenced) the fence, folded."""
        fence = fence_params(lease, self.store_clock) if lease is not None else None
        params = dict(row)
        _blob_params(new.rows, params)
        params.update(held)
        if fence is not None:
            params.update(fence)
        statement = sql.put(len(new.rows), fenced=lease is not None, bases=len(new.bases))
        result = await connection.execute(statement, params)
        if new.bases and not result.rows:
            raise _BaseGone
        if lease is not None and not result.rows:
            # Refused: the fenced transaction below refuses too, naming the reason.
            await self._write(connection, _separate(sql, row, new.rows), lease, fence)

    async def _put_script(
        self,
        connection: Database,
        sql: CheckpointStatements,
        row: dict[str, Any],
        new: _NewValues,
        held: dict[str, Any],
    ) -> None:
        """One round trip: BEGIN, the value rows, the checkpoint and COMMIT in one text (with
        appends, both under their bases' check, and the count of bases there)."""
        params = dict(row)
        _blob_params(new.rows, params)
        params.update(held)
        result = await connection.execute(sql.put_script(len(new.rows), len(new.bases)), params)
        if new.bases and (result.scalar() or 0) < len(new.bases):
            raise _BaseGone

    def _remember_put(self, keys: _PutKeys, new: _NewValues) -> None:
        """Remember what a put wrote: the values its checkpoint reads, their bytes, and the
        values stored whole that later appends may name as their base."""
        thread_hash, ns_hash = keys.thread_hash, keys.ns_hash
        self._expect(thread_hash, ns_hash, _value_keys(new.body))
        self._values.keep(entry for entry in new.whole if _kept(entry[0][3]))
        self._remember_bases(
            (thread_hash, ns_hash, r[0], r[1])
            for r in new.rows
            if r[4] is None and _base_worthy(r[1], r[2], r[3])
        )

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
        connection: Database,
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
            "p_task_path": _key_text("task_path", task_path),
        }
        replace = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        rows: list[tuple[int, str, str, bytes | None]] = []
        size = 0
        for idx, (channel, value) in enumerate(writes):
            name = _key_text("channel", channel)
            kind, data = self._dumps(value)
            rows.append((WRITES_IDX_MAP.get(channel, idx), name, kind, data))
            size += len(data or b"") + len(name.encode("utf-8"))
        _checked_write_bytes("a put_writes", size)
        if lease is None and len(rows) <= MAX_ROWS:
            # A task's writes in one statement, alone in autocommit (as `_write` sends it),
            # without building the list of statements a fenced or longer put_writes needs.
            await connection.execute(
                sql.writes_insert(len(rows), replace=replace, fenced=False),
                _writes_params(shared, rows),
            )
            return
        execs = [
            Exec(
                sql.writes_insert(len(chunk), replace=replace, fenced=False),
                _writes_params(shared, chunk),
            )
            for chunk in chunks(rows)
        ]
        fence = fence_params(lease, self.store_clock) if lease is not None else {}
        if lease is not None and sql.fold and len(execs) == 1:
            statement = sql.writes_insert(len(rows), replace=replace, fenced=True)
            result = await connection.execute(statement, {**execs[0].params, **fence})
            if result.rows:
                return
            # No row: refused, or every write was stored already (skipped duplicates return
            # none). The fenced transaction tells which: it refuses, or adds nothing.
        await self._write(connection, execs, lease, fence)


def _writes_params(
    shared: Mapping[str, Any], chunk: Sequence[tuple[int, str, str, bytes | None]]
) -> dict[str, Any]:
    """The parameters of one multi-row insert of pending writes: the task's, then each
    write's (`_WRITE_PARAMS`)."""
    params = dict(shared)
    for names, values_of_row in zip(_WRITE_PARAMS, chunk, strict=False):
        params.update(zip(names, values_of_row, strict=True))
    return params
