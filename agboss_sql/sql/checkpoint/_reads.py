"""The saver's reads: `aget_tuple` (a checkpoint with its pending writes and the values it
reads, in one statement when the values it names were expected or kept) and `alist` (pages
of checkpoints, their values and writes read by key)."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
)

from agboss_sql.contracts.rules import checked_int
from agboss_sql.sql.checkpoint._appends import joined
from agboss_sql.sql.checkpoint._core import (
    BlobKeys,
    Database,
    SaverCore,
    ValueKeys,
    _checked_filter,
    _kept,
    _key_hash,
    _text,
    _value_keys,
    _write_order,
)
from agboss_sql.sql.checkpoint._layout import (
    BLOB_KEY,
    BLOB_ROW,
    CHECKPOINT_KEY,
    CHECKPOINT_ROW,
    LIST_PAGE,
    LIST_PAGE_MORE,
    MAX_LOOKUPS,
    MAX_ROWS,
    PAGE_BLOBS,
    WRITE_ROW,
    chunks,
    keyed_params,
)
from agboss_sql.sql.checkpoint._statements import CheckpointStatements, ListShape
from agboss_sql.sql.checkpoint._values import ValueKey, fetched_entries
from agboss_sql.sql.connection import Exec, Step
from agboss_sql.sql.schema import checkpoint_blobs

Found = tuple[
    Sequence[Any],
    dict[str, Any],
    Mapping[tuple[Any, Any, Any, Any], tuple[Any, Any]],
    Sequence[Sequence[Any]],
    ValueKeys,
]
"""A checkpoint as read: its row, decoded body, the values it reads, its pending writes, and
the keys of those values (`_value_keys` of the body as read)."""


class _ListPlan(NamedTuple):
    """A listing's statement set, parameters and criteria (`_list_plan`)."""

    sql: CheckpointStatements
    params: dict[str, Any]
    thread: bool
    namespace: bool
    checkpoint_id: bool
    filters: int
    recheck: list[tuple[Any, Any]]
    limit: int | None
    before: str | None


def _rejected(listed: CheckpointTuple, recheck: list[tuple[Any, Any]]) -> bool:
    """Whether a listed checkpoint's metadata fails a filter the SQL test only narrowed."""
    return any(listed.metadata.get(key) != value for key, value in recheck)


def _json_value(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=False, default=str))


Rows = dict[tuple[Any, Any, Any, Any], tuple[Any, Any, Any]]
"""Value rows as read, by key: (value type, value, base version)."""


class SaverReads(SaverCore):
    """The saver's async reads."""

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint `config` names (its `checkpoint_id`), or the thread namespace's
        latest (a primary-key probe), with its pending writes and parent; `None` if absent."""
        return await self._get_tuple(self._sync.here(), config)

    async def _get_tuple(
        self, connection: Database, config: RunnableConfig
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
        if type(thread_id) is not str:
            thread_id = _text(thread_id)
        if type(ns) is not str:
            ns = _text(ns)
        # `body` was decoded for this tuple alone: its values are filled in where they are.
        values = body.get("channel_values")
        if type(values) is not dict:
            values = dict(values or {})
        if value_keys:
            decode = self._decoded.decode
            serde = self.serde
            for channel, channel_hash, version in value_keys:
                stored = blobs.get((thread_hash, ns_hash, channel_hash, version))
                if stored is not None:
                    kind, data = stored
                    values[channel] = decode(
                        serde, (thread_hash, ns_hash, channel_hash), _text(kind), data
                    )
        body["channel_values"] = values
        pending: list[PendingWrite] = []
        if writes:
            if len(writes) > 1:
                writes = sorted(writes, key=_write_order)
            loads, loads_typed = self._loads, self.serde.loads_typed
            for task_id, channel, _, _, kind, value in writes:
                if type(task_id) is str and type(channel) is str and type(kind) is str:
                    if type(value) is memoryview:
                        value = bytes(value)
                    pending.append((task_id, channel, loads_typed((kind, value))))
                else:
                    pending.append((_text(task_id), _text(channel), loads(kind, value)))
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": checkpoint_id,
                }
            },
            checkpoint=body,  # type: ignore[arg-type]
            metadata=json.loads(metadata if type(metadata) is str else _text(metadata)),
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
        connection: Database,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> AsyncGenerator[CheckpointTuple, None]:
        plan = self._list_plan(connection, config, filter, before, limit)
        if plan is None:
            return
        remaining = limit
        async for found_tuples in self._pages(connection, plan):
            for listed in self._listed(plan, found_tuples):
                yield listed
                if remaining is not None:
                    remaining -= 1
                    if remaining <= 0:
                        return

    def _listed(self, plan: _ListPlan, found_tuples: Sequence[Any]) -> Iterator[CheckpointTuple]:
        """A page's checkpoints, each decoded as it is taken, but those the plan's recheck
        rejects (the sync and async `list` share it)."""
        for found_tuple in found_tuples:
            listed = self._tuple_of(*found_tuple)
            if plan.recheck and _rejected(listed, plan.recheck):
                continue
            yield listed

    def _list_plan(
        self,
        connection: Database,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> _ListPlan | None:
        """What a listing reads (its checks made before any statement); `None`: nothing."""
        sql = self._statements(connection)
        if limit is not None and checked_int("limit", limit) <= 0:
            return None
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
        filters = _checked_filter(
            [(key, _json_value(value)) for key, value in (filter or {}).items()]
        )
        for index, (key, value) in enumerate(filters):
            params.update(sql.ops.json_key_params(index, str(key), value))
        # Objects and arrays are compared again here where the SQL test only narrows.
        recheck = [
            (key, value)
            for key, value in filters
            if isinstance(value, (dict, list)) and not sql.json_exact
        ]
        return _ListPlan(
            sql,
            params,
            thread,
            namespace,
            bool(checkpoint_id),
            len(filters),
            recheck,
            limit,
            _text(before_id) if before_id else None,
        )

    async def _pages(
        self, connection: Database, plan: _ListPlan
    ) -> AsyncGenerator[list[Found], None]:
        """The listing's checkpoints as read, a page at a time (one namespace of one thread
        is read in pages off its key, `LIST_PAGE` then `LIST_PAGE_MORE` each; anything wider
        at once). Their values and pending writes are decoded as each is taken
        (`_tuple_of`)."""
        paged = plan.namespace and not plan.checkpoint_id
        # Without a recheck every checkpoint read is answered: the limit bounds the pages.
        remaining = plan.limit if not plan.recheck else None
        cursor = plan.before
        first = True
        while True:
            page = (LIST_PAGE if first else LIST_PAGE_MORE) if paged else None
            first = False
            if remaining is not None:
                page = remaining if page is None else min(page, remaining)
            shape = ListShape(
                thread=plan.thread,
                namespace=plan.namespace,
                checkpoint_id=plan.checkpoint_id,
                before=cursor is not None,
                limit=page is not None,
                filters=plan.filters,
            )
            page_params = dict(plan.params)
            if cursor is not None:
                page_params["before"] = cursor
            if page is not None:
                page_params["limit"] = page
            page_rows, found_tuples = await connection.run(
                functools.partial(self._page, plan.sql, shape, page_params), transaction=False
            )
            if found_tuples:
                yield found_tuples
            if remaining is not None:
                remaining -= len(found_tuples)
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
        if shape.thread and shape.namespace and not shape.checkpoint_id and not shape.filters:
            # One namespace's page: its ids are contiguous, so its writes are one range.
            return (yield from self._page_by_range(sql, rows, bodies, value_keys))
        if shape.thread and not shape.checkpoint_id and not shape.filters:
            # A whole thread: each of its namespaces is read whole, so each is one range.
            return (yield from self._thread_by_ranges(sql, rows, bodies, value_keys))
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

    def _thread_by_ranges(
        self,
        sql: CheckpointStatements,
        rows: Sequence[Sequence[Any]],
        bodies: Sequence[dict[str, Any]],
        value_keys: Sequence[ValueKeys],
    ) -> Step[tuple[int, list[Found]]]:
        """The values and pending writes of every checkpoint of one thread, as listed (newest
        first, its namespaces mixed): each namespace's by `_page_by_range`, then in the
        listing's order again."""
        by_namespace: dict[Any, list[int]] = {}
        for index, row in enumerate(rows):
            by_namespace.setdefault(row[2], []).append(index)
        if len(by_namespace) == 1:
            return (yield from self._page_by_range(sql, rows, bodies, value_keys))
        found: list[Found | None] = [None] * len(rows)
        for indexes in by_namespace.values():
            _, of_namespace = yield from self._page_by_range(
                sql,
                [rows[i] for i in indexes],
                [bodies[i] for i in indexes],
                [value_keys[i] for i in indexes],
            )
            for index, one in zip(indexes, of_namespace, strict=True):
                found[index] = one
        return len(rows), [one for one in found if one is not None]

    def _page_by_range(
        self,
        sql: CheckpointStatements,
        rows: Sequence[Sequence[Any]],
        bodies: Sequence[dict[str, Any]],
        value_keys: Sequence[ValueKeys],
    ) -> Step[tuple[int, list[Found]]]:
        """The values and pending writes of a page of one thread namespace: the values by
        key, the writes by the page's range of ids, in one statement (`page_values_json` on
        SQLite and PostgreSQL; elsewhere `page_values`, a `PAGE_BLOBS` count of keys, the
        last repeated to fill it, more statements when the page reads more than
        `PAGE_BLOBS[-1]` values)."""
        thread_hash, ns_hash = rows[0][8], rows[0][2]
        ids = [row[3] for row in rows]
        keys = list(dict.fromkeys((c, v) for of_row in value_keys for _, c, v in of_row))
        rows_read, writes = yield from self._range_rows(
            sql, thread_hash, ns_hash, keys, min(ids), max(ids)
        )
        blobs = yield from self._whole(sql, rows_read)
        return len(rows), [
            (row, body, blobs, writes.get(row[3], []), keys_of_row)
            for row, body, keys_of_row in zip(rows, bodies, value_keys, strict=True)
        ]

    def _range_rows(
        self,
        sql: CheckpointStatements,
        thread_hash: str,
        ns_hash: str,
        keys: Sequence[tuple[str, str]],
        lo: Any,
        hi: Any,
    ) -> Step[tuple[Rows, dict[Any, list[Sequence[Any]]]]]:
        """The value rows of one thread namespace under `keys` (channel hash, version), and
        the pending writes of its checkpoints whose ids are in [`lo`, `hi`], by checkpoint
        id, in one statement where the database takes every key at once (`_page_by_range`)."""
        rows_read: Rows = {}
        writes: dict[Any, list[Sequence[Any]]] = {}
        # Every key in one statement: (text, its key params, where a value row's type is).
        at_once: tuple[str, dict[str, Any], int] | None = None
        if sql.keys_as_json:
            keys_json = json.dumps([c + v for c, v in keys])
            # A NUL is the one character the databases' JSON would not hand back as sent.
            if "\\u0000" not in keys_json:
                at_once = (sql.page_values_json, {"keys": keys_json}, sql.json_typed)
        if at_once is not None:
            statement, params, typed = at_once
            params.update(w_thread_hash=thread_hash, w_ns_hash=ns_hash, w_lo=lo, w_hi=hi)
            for found in (yield Exec(statement, params)).rows:
                if found[0] == BLOB_ROW:
                    # (channel hash, version, base, [-, -,] value type, value)
                    key = (thread_hash, ns_hash, found[1], found[2])
                    rows_read[key] = (found[typed], found[typed + 1], found[3])
                else:
                    # (checkpoint id, then the write as `_tuple_of` takes it)
                    writes.setdefault(found[1], []).append(found[2:])
        else:
            first = True
            for chunk in chunks(keys, PAGE_BLOBS[-1]) if keys else [[]]:
                size = next(n for n in PAGE_BLOBS if n >= len(chunk))
                params = {
                    "w_thread_hash": thread_hash,
                    "w_ns_hash": ns_hash,
                    # The writes once, in the first statement: the others' range is empty.
                    "w_lo": lo if first else "~",
                    "w_hi": hi if first else "",
                }
                first = False
                for i in range(size):
                    params[f"c{i}"], params[f"v{i}"] = chunk[min(i, len(chunk) - 1)]
                for kind_of_row, _, _, key, *rest in (
                    yield Exec(sql.page_values(size), params)
                ).rows:
                    if kind_of_row == BLOB_ROW:
                        version, base, _, _, value_type, value = rest
                        rows_read[(thread_hash, ns_hash, key, version)] = (value_type, value, base)
                    else:
                        writes.setdefault(key, []).append(rest)
        return rows_read, writes
