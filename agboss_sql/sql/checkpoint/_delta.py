"""`aget_delta_channel_history`: what a `DeltaChannel` is rebuilt from, read in a few
statements instead of one `get_tuple` per ancestor.

A `DeltaChannel` stores its value only now and then (a `_DeltaSnapshot`); between those
checkpoints it stores nothing, and LangGraph rebuilds it from the nearest ancestor that
stores it (the seed) and the pending writes made to it since. `BaseCheckpointSaver`'s own
walk reads every ancestor whole with `get_tuple`, one round trip each, up to the channel's
`snapshot_frequency` (100 by default) at every load of the thread. Here one statement reads
up to `DELTA_PAGE` checkpoints, a range of ids from the target down (`ancestors`), whose
parent links are followed here (ids order a thread only within one process: a parent
outside the range is read from its own place); one more reads the values that may seed the
channels with the writes of the walked range of checkpoints (`_range_rows`, as a listing's
page reads them). A longer walk repeats the two.

The answer is the base class's, by its contract: for each channel, the writes to it of
every ancestor from the target's parent up to and including its seed, oldest first and in
each checkpoint's `pending_writes` order, and the seed's value when one was found.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import DeltaChannelHistory, PendingWrite, get_checkpoint_id

from agboss_sql.sql.checkpoint._core import (
    Database,
    _channel_hash,
    _key_hash,
    _text,
    _write_order,
)
from agboss_sql.sql.checkpoint._reads import Rows, SaverReads
from agboss_sql.sql.checkpoint._statements import CheckpointStatements, ListShape
from agboss_sql.sql.connection import Exec, Step

DELTA_PAGE = 256
"""Checkpoints one statement of a delta history reads (a range of ids from the target or an
ancestor down: a chat of LangGraph's default `snapshot_frequency` has up to about 150
between snapshots)."""

_LATEST = ListShape(
    thread=True, namespace=True, checkpoint_id=False, before=False, limit=True, filters=0
)

_Walked = tuple[str, frozenset[Any], Mapping[Any, Any], Any, Any]
"""An ancestor walked: its id, the channels its body holds values of, its channel versions,
and its body (type and bytes) as stored."""

BODY_OVERHEAD = 400
"""Bytes counted per kept body beside its stored bytes: its key, the entry, the set of its
channels (`VERSION_COST` more a channel version)."""

VERSION_COST = 120
"""Bytes counted per channel version a kept body holds: a dictionary slot and two texts."""

_Seed = tuple[bool, Any]
"""How a channel's seed was found: (True, the value decoded from the body that holds it)
or (False, the key of its value row)."""


@dataclass(slots=True)
class _Walk:
    """What a walk has found so far, added to as each run of ancestors is settled."""

    active: dict[str, str]
    """The channels still without a seed, with their hashes."""
    chains: dict[str, list[Any]]
    """Each channel's walked ancestors, nearest first, through its seed's."""
    found: dict[str, _Seed] = field(default_factory=dict)
    rows_read: Rows = field(default_factory=dict)
    writes_of: dict[Any, list[Sequence[Any]]] = field(default_factory=dict)


class SaverDeltaHistory(SaverReads):
    """The saver's `DeltaChannel` history (see the module's docstring)."""

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """For each of `channels`: the pending writes to it of the ancestors of the
        checkpoint `config` names (its parent's first, following parent links, not ids),
        up to the nearest ancestor that stores a value of it, oldest first, and that value
        as `seed` (absent when no ancestor stores one). What `BaseCheckpointSaver`'s walk
        answers, in two statements per `DELTA_PAGE` ancestors."""
        return await self._delta_history(self._sync.here(), config, channels)

    async def _delta_history(
        self, connection: Database, config: RunnableConfig, channels: Sequence[str]
    ) -> dict[str, DeltaChannelHistory]:
        if isinstance(channels, str):
            raise TypeError("channels is a sequence of channel names, not one name")
        if not channels:
            return {}
        sql = self._statements(connection)
        thread_id = self._thread_of(config)
        ns = self._ns_of(config)
        checkpoint_id = get_checkpoint_id(config)
        thread_hash, ns_hash = _key_hash(thread_id), _key_hash(ns)
        seeds, writes = await connection.run(
            lambda: self._walk(
                sql,
                thread_hash,
                ns_hash,
                _text(checkpoint_id) if checkpoint_id else None,
                list(dict.fromkeys(channels)),
            ),
            transaction=False,
        )
        history: dict[str, DeltaChannelHistory] = {}
        for channel in channels:
            entry: DeltaChannelHistory = {"writes": writes.get(channel, [])}
            if channel in seeds:
                entry["seed"] = seeds[channel]
            history[channel] = entry
        return history

    def _walk(
        self,
        sql: CheckpointStatements,
        thread_hash: str,
        ns_hash: str,
        target: str | None,
        channels: list[str],
    ) -> Step[tuple[dict[str, Any], dict[str, list[PendingWrite]]]]:
        """The seeds found and each channel's writes, oldest first: the ancestors read a
        range of ids at a time (`ancestors`, from the target down), their parent links
        followed here, each run of them walked for the channels still unseeded before the
        next range is read."""
        base = {"thread_hash": thread_hash, "ns_hash": ns_hash}
        if target is None:
            latest = (yield Exec(sql.listing(_LATEST), {**base, "limit": 1})).rows
            if not latest:
                return {}, {}
            target = _text(latest[0][3])
        # (parent id, body type, body) of every checkpoint read, by id.
        read: dict[str, tuple[Any, Any, Any]] = {}
        if not (yield from self._ancestors_from(sql, base, target, read)):
            return {}, {}
        walk = _Walk(
            {channel: _channel_hash(channel) for channel in channels},
            {channel: [] for channel in channels},
        )
        walked = {target}
        run: list[_Walked] = []
        current = target
        while walk.active:
            parent = read[current][0]
            if parent is None or parent in walked:
                # The root, or a parent link that loops back (no put makes one).
                break
            if parent not in read:
                if run:
                    yield from self._seed_page(sql, thread_hash, ns_hash, run, walk)
                    run = []
                    if not walk.active:
                        break
                # The next range starts at the parent; none does if it is not stored
                # (deleted). A parent written by a process whose clock ran behind has an id
                # above its child's: it is read from its own place all the same.
                if not (yield from self._ancestors_from(sql, base, parent, read)):
                    break
            walked.add(parent)
            _, kind, data = read[parent]
            run.append((parent, *self._body_keys((thread_hash, ns_hash, parent), kind, data)))
            current = parent
        if run and walk.active:
            yield from self._seed_page(sql, thread_hash, ns_hash, run, walk)
        seeds = yield from self._seeds(sql, thread_hash, ns_hash, walk.found, walk.rows_read)
        return seeds, self._channel_writes(walk.chains, walk.writes_of)

    @staticmethod
    def _ancestors_from(
        sql: CheckpointStatements,
        base: dict[str, Any],
        first: str,
        read: dict[str, tuple[Any, Any, Any]],
    ) -> Step[bool]:
        """Read up to `DELTA_PAGE` checkpoints from `first` down into `read`; whether
        `first` is stored."""
        rows = (yield Exec(sql.ancestors(), {**base, "upto": first, "limit": DELTA_PAGE})).rows
        for checkpoint_id, parent_id, kind, data in rows:
            read.setdefault(
                _text(checkpoint_id),
                (_text(parent_id) if parent_id is not None else None, kind, data),
            )
        return bool(rows) and _text(rows[0][0]) == first

    def _body_keys(
        self, key: tuple[str, str, str], kind: Any, data: Any
    ) -> tuple[frozenset[Any], Mapping[Any, Any], Any, Any]:
        """The channels a body holds values of and its channel versions, decoded once per
        stored body: each load of a thread walks mostly the ancestors the last one walked,
        and a body put again under its id is told apart by its bytes."""
        if isinstance(data, memoryview):
            data = bytes(data)
        known = self._delta_bodies.get(key)
        if known is not None and known[2] == kind and known[3] == data:
            return known
        body = self._loads(kind, data)
        values = frozenset(body.get("channel_values") or ())
        versions = body.get("channel_versions") or {}
        walked = (values, versions, kind, data)
        cost = BODY_OVERHEAD + len(data or b"") + VERSION_COST * (len(versions) + len(values))
        self._delta_bodies.put(((key, walked, cost),))
        return walked

    def _seed_page(
        self,
        sql: CheckpointStatements,
        thread_hash: str,
        ns_hash: str,
        page: list[_Walked],
        walk: _Walk,
    ) -> Step[None]:
        """Walk one page of ancestors (nearest first) for the channels still `active`: the
        value rows their versions name and the page's writes in one statement, then each
        channel's chain up to the first ancestor that holds its value, all added to `walk`."""
        active, chains, found = walk.active, walk.chains, walk.found
        keys: dict[tuple[str, str], None] = {}
        for _, inline, versions, _, _ in page:
            for channel, channel_hash in active.items():
                if channel not in inline and channel in versions:
                    keys[(channel_hash, _text(versions[channel]))] = None
        ids = [walked[0] for walked in page]
        kept = self._values.found((thread_hash, ns_hash, c, v) for c, v in keys)
        rows, writes = yield from self._range_rows(
            sql,
            thread_hash,
            ns_hash,
            [k for k in keys if (thread_hash, ns_hash, *k) not in kept],
            min(ids),
            max(ids),
        )
        rows.update((key, (kind, data, None)) for key, (kind, data) in kept.items())
        for checkpoint_id, inline, versions, kind, data in page:
            if not active:
                break
            for channel, channel_hash in list(active.items()):
                chains[channel].append(checkpoint_id)
                if channel in inline:
                    # Decoded again: the value goes to the caller, who may change it.
                    found[channel] = (True, self._loads(kind, data)["channel_values"][channel])
                elif channel in versions:
                    key = (thread_hash, ns_hash, channel_hash, _text(versions[channel]))
                    if key in rows:
                        found[channel] = (False, key)
                    else:
                        continue
                else:
                    continue
                del active[channel]
        walk.rows_read.update(rows)
        walk.writes_of.update(writes)

    def _seeds(
        self,
        sql: CheckpointStatements,
        thread_hash: str,
        ns_hash: str,
        found: dict[str, _Seed],
        rows_read: Rows,
    ) -> Step[dict[str, Any]]:
        """The seeds' values, decoded (an append joined to its base first)."""
        stored = {key: rows_read[key] for inline, key in found.values() if not inline}
        whole = (yield from self._whole(sql, stored)) if stored else {}
        seeds: dict[str, Any] = {}
        for channel, (inline, value) in found.items():
            if inline:
                seeds[channel] = value
            elif value in whole:
                kind, data = whole[value]
                if data is not None:
                    seeds[channel] = self.serde.loads_typed((_text(kind), data))
        return seeds

    def _channel_writes(
        self, chains: dict[str, list[Any]], writes_of: dict[Any, list[Sequence[Any]]]
    ) -> dict[str, list[PendingWrite]]:
        """Each channel's writes along its chain, oldest checkpoint first, each checkpoint's
        in `pending_writes` order."""
        out: dict[str, list[PendingWrite]] = {}
        loads_typed = self.serde.loads_typed
        for channel, chain in chains.items():
            collected: list[PendingWrite] = []
            for checkpoint_id in reversed(chain):
                rows = writes_of.get(checkpoint_id)
                if not rows:
                    continue
                for task_id, written, _, _, kind, value in sorted(rows, key=_write_order):
                    if _text(written) != channel:
                        continue
                    if isinstance(value, memoryview):
                        value = bytes(value)
                    collected.append((_text(task_id), channel, loads_typed((_text(kind), value))))
            out[channel] = collected
        return out
