"""The saver's statements, built once per dialect and kind of store time: the writes
(`_write_statements`) and, here, the reads, the listing, and the deletes and copies.

What differs per database comes from the dialect (`connection.dialect`) and its
`Capabilities`: where data-modifying statements fold into `WITH` (`dml_in_with`), a
write is one statement; elsewhere it is one transaction of several.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from agboss_sql.sql.checkpoint._layout import (
    BLOB_KEY,
    BLOB_ROW,
    CHECKPOINT_KEY,
    CHECKPOINT_ROW,
    LISTED,
    WRITE_ROW,
    _bind,
)
from agboss_sql.sql.checkpoint._write_statements import WriteStatements
from agboss_sql.sql.connection import SqlBuilder
from agboss_sql.sql.schema import checkpoint_blobs, checkpoint_writes, checkpoints

_ONE = sa.literal_column("1", sa.Integer)
"""`LIMIT 1` as a literal, not a bound parameter. PostgreSQL's generic plan of a prepared
statement whose limit is a parameter counts on a tenth of the rows, so it never looked cheaper
than a custom plan, and every execution of the latest checkpoint's read was planned again
(pg_prepared_statements: 0 generic plans of 37 executions on a sync connection)."""


class CheckpointStatements(WriteStatements):
    """The saver's statements for one dialect and one kind of store time. Statements whose
    shape depends on a count (rows of a multi-row insert or look-up, metadata filters) are
    built on first use and kept, one per count."""

    def __init__(self, b: SqlBuilder) -> None:
        super().__init__(b)
        self.json_exact: bool = b.capabilities.json_key_exact

        # The checkpoint with its pending writes, in one statement. The latest is the row off
        # the key's end (`ORDER BY … DESC LIMIT 1`, not `max()`, which PostgreSQL aggregated
        # over the thread's whole history when its statistics still counted a few rows for
        # the thread). PostgreSQL probes it once, in a `WITH` that the checkpoint row and
        # its writes both read (a scalar subquery in each probed the key twice more: 391 ->
        # 330 us a read); MariaDB materialises that `WITH` as a temporary table, which took
        # its read from 525 to 1,033 us, so elsewhere each reads the latest id as a scalar
        # (`Capabilities.shared_with`).
        self._with_cte = b.capabilities.shared_with
        # SQLite and PostgreSQL name a page's value keys in one JSON text
        # (`page_values_json`); where its rows' value type is (`json_typed`).
        self.keys_as_json = b.ops.NAME in ("sqlite", "postgresql")
        self._typed_rows = b.ops.NAME == "postgresql"
        self.json_typed = 6 if self._typed_rows else 4
        self._latest = self._latest_id()
        self.read_latest = self._latest_with_writes()
        self.read_by_id = self._with_writes(_bind("checkpoint_id", checkpoints.c.checkpoint_id))

        self.select_blob_keys = self._thread_blob_keys()
        self.lock_thread = self._lock_thread()
        # Whole-thread deletes and copies: one statement where writes fold into `WITH`.
        self.delete_thread = self._thread_statements(
            lambda table: sa.delete(table).where(
                table.c.thread_hash == _bind("thread_hash", table.c.thread_hash)
            )
        )
        self.copy_thread = self._thread_statements(self._copy)
        self.prune_checkpoints, self.prune_writes, self.orphan_head = self._prunes()

    # --- the statements built once ---------------------------------------------------------

    @staticmethod
    def _latest_id() -> Any:
        """The id of a thread namespace's latest checkpoint, as a scalar."""
        return (
            sa.select(checkpoints.c.checkpoint_id)
            .where(
                checkpoints.c.thread_hash == _bind("thread_hash", checkpoints.c.thread_hash),
                checkpoints.c.ns_hash == _bind("ns_hash", checkpoints.c.ns_hash),
            )
            .order_by(checkpoints.c.checkpoint_id.desc())
            .limit(_ONE)
            .scalar_subquery()
        )

    @staticmethod
    def _thread_blob_keys() -> Any:
        """The keys of every value of a thread, with their bases."""
        return sa.select(
            checkpoint_blobs.c.ns_hash,
            checkpoint_blobs.c.channel_hash,
            checkpoint_blobs.c.version,
            checkpoint_blobs.c.base_version,
        ).where(
            checkpoint_blobs.c.thread_hash == _bind("thread_hash", checkpoint_blobs.c.thread_hash)
        )

    def _lock_thread(self) -> Any:
        """Lock every checkpoint of a thread, newest first per namespace (a prune's first)."""
        return self.ops.for_update(
            sa.select(checkpoints.c.ns_hash, checkpoints.c.checkpoint_id)
            .where(checkpoints.c.thread_hash == _bind("thread_hash", checkpoints.c.thread_hash))
            .order_by(checkpoints.c.ns_hash, checkpoints.c.checkpoint_id.desc())
        )

    @staticmethod
    def _prunes() -> tuple[Any, Any, Any]:
        """A prune's statements per namespace: delete the checkpoints older than the head and
        their pending writes, and clear the head's parent link."""
        thread = _bind("thread_hash", checkpoints.c.thread_hash)
        ns_hash = _bind("ns_hash", checkpoints.c.ns_hash)
        checkpoints_before = sa.delete(checkpoints).where(
            checkpoints.c.thread_hash == thread,
            checkpoints.c.ns_hash == ns_hash,
            checkpoints.c.checkpoint_id < _bind("checkpoint_id", checkpoints.c.checkpoint_id),
        )
        writes_before = sa.delete(checkpoint_writes).where(
            checkpoint_writes.c.thread_hash
            == _bind("thread_hash", checkpoint_writes.c.thread_hash),
            checkpoint_writes.c.ns_hash == _bind("ns_hash", checkpoint_writes.c.ns_hash),
            checkpoint_writes.c.checkpoint_id
            < _bind("checkpoint_id", checkpoint_writes.c.checkpoint_id),
        )
        orphan_head = (
            sa.update(checkpoints)
            .where(
                checkpoints.c.thread_hash == thread,
                checkpoints.c.ns_hash == ns_hash,
                checkpoints.c.checkpoint_id == _bind("checkpoint_id", checkpoints.c.checkpoint_id),
            )
            .values(parent_checkpoint_id=None)
        )
        return checkpoints_before, writes_before, orphan_head

    # --- statement builders ------------------------------------------------------------

    def _with_writes(self, checkpoint_id: Any, latest: Any = None) -> Any:
        """The checkpoint `checkpoint_id` names and its pending writes; with `latest` (a
        `WITH` of the latest checkpoint row), that row and the writes of its id."""
        thread = _bind("thread_hash", checkpoints.c.thread_hash)
        ns_hash = _bind("ns_hash", checkpoints.c.ns_hash)
        source = checkpoints if latest is None else latest
        checkpoint = sa.select(
            sa.literal_column(str(CHECKPOINT_ROW), sa.Integer).label("kind"),
            source.c.checkpoint_id.label("a"),
            source.c.parent_checkpoint_id.label("b"),
            source.c.metadata.label("c"),
            sa.cast(sa.null(), sa.Integer).label("n"),
            source.c.checkpoint_type.label("t"),
            source.c.checkpoint.label("data"),
        )
        if latest is None:
            checkpoint = checkpoint.where(
                checkpoints.c.thread_hash == thread,
                checkpoints.c.ns_hash == ns_hash,
                checkpoints.c.checkpoint_id == checkpoint_id,
            )
        writes = sa.select(
            sa.literal_column(str(WRITE_ROW), sa.Integer),
            checkpoint_writes.c.task_id,
            checkpoint_writes.c.channel,
            checkpoint_writes.c.task_path,
            checkpoint_writes.c.idx,
            checkpoint_writes.c.value_type,
            checkpoint_writes.c.value,
        ).where(
            checkpoint_writes.c.thread_hash == thread,
            checkpoint_writes.c.ns_hash == ns_hash,
            checkpoint_writes.c.checkpoint_id == checkpoint_id,
        )
        return sa.union_all(checkpoint, writes)

    def _latest_with_writes(self) -> Any:
        if not self._with_cte:
            return self._with_writes(self._latest)
        latest = (
            sa.select(
                checkpoints.c.checkpoint_id,
                checkpoints.c.parent_checkpoint_id,
                checkpoints.c.metadata,
                checkpoints.c.checkpoint_type,
                checkpoints.c.checkpoint,
            )
            .where(
                checkpoints.c.thread_hash == _bind("thread_hash", checkpoints.c.thread_hash),
                checkpoints.c.ns_hash == _bind("ns_hash", checkpoints.c.ns_hash),
            )
            .order_by(checkpoints.c.checkpoint_id.desc())
            .limit(_ONE)
            .cte("agboss_latest")
        )
        # The writes take the id as a scalar from the `WITH`, not a join: the whole key is
        # then one index probe, where a join was planned, on stale statistics, as a scan of
        # every write the thread's history holds.
        return self._with_writes(sa.select(latest.c.checkpoint_id).scalar_subquery(), latest)

    def read(self, *, by_id: bool, blobs: int) -> Any:
        """The checkpoint (`checkpoint_id`, or the namespace's latest) with its pending writes
        and the values of `blobs` (channel hash, version) keys (`k<i>_channel_hash`,
        `k<i>_version`) of its thread namespace, in one statement: the saver names the values
        it expects the checkpoint to read, and reads any others after."""
        if not blobs:
            return self.read_by_id if by_id else self.read_latest
        return self.cached(("read", by_id, blobs), lambda: self._read(by_id, blobs))

    def _read(self, by_id: bool, count: int) -> Any:
        b = checkpoint_blobs
        thread = _bind("thread_hash", b.c.thread_hash)
        ns_hash = _bind("ns_hash", b.c.ns_hash)
        lookups = [
            sa.select(
                sa.literal_column(str(BLOB_ROW), sa.Integer),
                b.c.channel_hash,
                b.c.version,
                sa.type_coerce(b.c.base_version, sa.Text),
                sa.cast(sa.null(), sa.Integer),
                b.c.value_type,
                b.c.value,
            ).where(
                b.c.thread_hash == thread,
                b.c.ns_hash == ns_hash,
                b.c.channel_hash == _bind(f"k{i}_channel_hash", b.c.channel_hash),
                b.c.version == _bind(f"k{i}_version", b.c.version),
            )
            for i in range(count)
        ]
        read = (
            self._with_writes(_bind("checkpoint_id", checkpoints.c.checkpoint_id))
            if by_id
            else self._latest_with_writes()
        )
        return sa.union_all(*read.selects, *lookups)

    def values_and_writes(self, blobs: int, writes: int) -> Any:
        """The values of `blobs` keys (`b<i>_<column>` of `BLOB_KEY`) and the pending writes
        of `writes` checkpoints (`w<i>_<column>` of `CHECKPOINT_KEY`), in one statement: rows
        of (kind, key..., value_type, value), `BLOB_ROW` or `WRITE_ROW`."""
        return self.cached(
            ("values+writes", blobs, writes), lambda: self._values_and_writes(blobs, writes)
        )

    def _values_and_writes(self, blobs: int, writes: int) -> Any:
        b, w = checkpoint_blobs, checkpoint_writes
        lookups = [
            sa.select(*_VALUE_ROW).where(*(b.c[c] == _bind(f"b{i}_{c}", b.c[c]) for c in BLOB_KEY))
            for i in range(blobs)
        ]
        lookups += [
            sa.select(*_WRITE_ROW).where(
                *(w.c[c] == _bind(f"w{i}_{c}", w.c[c]) for c in CHECKPOINT_KEY)
            )
            for i in range(writes)
        ]
        return lookups[0] if len(lookups) == 1 else sa.union_all(*lookups)

    def page_values(self, blobs: int) -> Any:
        """The values of one thread namespace (`w_thread_hash`, `w_ns_hash`) under `blobs`
        (channel hash, version) keys (`c<i>`, `v<i>`; `blobs` one of `PAGE_BLOBS`, a key
        repeated to fill it), and the pending writes of its checkpoints whose ids are in a
        range (`w_lo`, `w_hi`: a page of a listing, whose ids are contiguous), in one
        statement of a few fixed shapes: rows as `values_and_writes` answers them. The keys
        are one row-value `IN` (a probe of the primary key each), not a `UNION ALL` of
        look-ups, which PostgreSQL took milliseconds to plan at a hundred keys."""
        return self.cached(("page values", blobs), lambda: self._page_values(blobs))

    def _page_values(self, blobs: int) -> Any:
        b, w = checkpoint_blobs, checkpoint_writes
        writes = sa.select(*_WRITE_ROW).where(
            w.c.thread_hash == _bind("w_thread_hash", w.c.thread_hash),
            w.c.ns_hash == _bind("w_ns_hash", w.c.ns_hash),
            w.c.checkpoint_id >= _bind("w_lo", w.c.checkpoint_id),
            w.c.checkpoint_id <= _bind("w_hi", w.c.checkpoint_id),
        )
        if not blobs:
            return writes
        values = sa.select(*_VALUE_ROW).where(
            b.c.thread_hash == _bind("w_thread_hash", b.c.thread_hash),
            b.c.ns_hash == _bind("w_ns_hash", b.c.ns_hash),
        )
        pairs = [
            (_bind(f"c{i}", b.c.channel_hash), _bind(f"v{i}", b.c.version)) for i in range(blobs)
        ]
        if self._with_cte:
            # PostgreSQL filters a row-value `IN` over a scan of the namespace's rows; joined
            # to the keys as a `VALUES` list, each key is a probe of the primary key.
            keys = sa.values(
                sa.column("c", b.c.channel_hash.type),
                sa.column("v", b.c.version.type),
                name="agboss_keys",
            ).data(pairs)
            values = values.join_from(
                b, keys, sa.and_(b.c.channel_hash == keys.c.c, b.c.version == keys.c.v)
            )
        else:
            values = values.where(
                sa.tuple_(b.c.channel_hash, b.c.version).in_([sa.tuple_(*p) for p in pairs])
            )
        return sa.union_all(values, writes)

    @property
    def page_values_json(self) -> str:
        """SQLite and PostgreSQL: `page_values` with the keys in one parameter, `keys`, a
        JSON array of the channel hash (64 characters) followed by the version of each key,
        so one text serves every page whatever its count of keys (nothing padded, two
        parameters bound where `page_values` binds 256), each key a probe of the primary key
        (SQLite scanned the namespace's value rows for a row-value `IN`). Rows: `BLOB_ROW`
        (channel hash, version, base version, [on PostgreSQL `NULL`, `NULL`,] value type,
        value: the type at `json_typed`) and `WRITE_ROW` (checkpoint id, task id, channel,
        task path, index, value type, value); neither repeats the thread and namespace
        hashes. PostgreSQL took the keys as two arrays before: psycopg dumps an array
        element by element in Python, 0.5 ms for a page's two arrays of 97 keys, where the
        JSON text takes 0.03 ms to make. There each key is a `LATERAL` look-up with `LIMIT
        1`, which PostgreSQL cannot pull up into a join: joined, it hashed a scan of every
        value row the namespace holds (3,000: 2.5 ms, against 0.7)."""
        return _PAGE_VALUES_JSON_PG if self._typed_rows else _PAGE_VALUES_JSON

    def _thread_statements(self, build: Any) -> list[Any]:
        """The statements of a whole-thread change, in the order a `put` takes its locks
        (values before checkpoints); on a dialect that folds writes into `WITH`, one."""
        writes, blobs, rows = build(checkpoint_writes), build(checkpoint_blobs), build(checkpoints)
        if self.fold:
            return [rows.add_cte(writes.cte("agboss_writes"), blobs.cte("agboss_blobs"))]
        return [writes, blobs, rows]

    def _copy(self, table: sa.Table) -> Any:
        columns = [column.name for column in table.c]
        replaced = {
            "thread_hash": _bind("target_hash", table.c.thread_hash),
            "thread_id": sa.bindparam("target", type_=sa.Text()),
        }
        source = sa.select(*(replaced.get(name, table.c[name]) for name in columns)).where(
            table.c.thread_hash == _bind("source_hash", table.c.thread_hash)
        )
        keys = [column.name for column in table.primary_key.columns]
        return self.ops.skip_duplicates(self.ops.insert(table).from_select(columns, source), keys)

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

    def listing(self, shape: ListShape) -> Any:
        """The checkpoints `list` reads for one combination of criteria, newest first."""
        return self.cached(("list", shape), lambda: self._listing(shape))

    def _listing(self, shape: ListShape) -> Any:
        statement = sa.select(*(checkpoints.c[c] for c in LISTED))
        if shape.thread:
            statement = statement.where(
                checkpoints.c.thread_hash == _bind("thread_hash", checkpoints.c.thread_hash)
            )
        if shape.namespace:
            statement = statement.where(
                checkpoints.c.ns_hash == _bind("ns_hash", checkpoints.c.ns_hash)
            )
        if shape.checkpoint_id:
            statement = statement.where(
                checkpoints.c.checkpoint_id == _bind("checkpoint_id", checkpoints.c.checkpoint_id)
            )
        if shape.before:
            statement = statement.where(
                checkpoints.c.checkpoint_id < _bind("before", checkpoints.c.checkpoint_id)
            )
        for index in range(shape.filters):
            statement = statement.where(self.ops.json_key_equals(checkpoints.c.metadata, index))
        statement = statement.order_by(checkpoints.c.checkpoint_id.desc())
        if shape.limit:
            statement = statement.limit(sa.bindparam("limit", type_=sa.Integer))
        return statement

    def run_checkpoints(self, count: int) -> Any:
        """Lock the checkpoints of any of `count` runs (`k<i>_run_hash`)."""
        return self.cached(
            ("runs", count),
            lambda: self.ops.for_update(
                sa.select(
                    checkpoints.c.thread_hash, checkpoints.c.ns_hash, checkpoints.c.checkpoint_id
                ).where(
                    checkpoints.c.run_hash.in_(
                        [_bind(f"k{i}_run_hash", checkpoints.c.run_hash) for i in range(count)]
                    )
                )
            ),
        )

    def ancestors(self) -> Any:
        """The checkpoints of a thread namespace (`thread_hash`, `ns_hash`) whose ids are at
        most `upto`, newest first, at most `limit`: rows of (checkpoint id, parent id, body
        type, body). One range of the primary key, where a walk of the parent links in SQL
        (a recursive `WITH`) took a probe per step: 1.2 ms for 147 steps on PostgreSQL. Ids
        order a thread only within one process, so the caller follows the parent links
        itself and looks up a parent outside the range it read."""
        return self.cached(("ancestors",), self._ancestors)

    @staticmethod
    def _ancestors() -> Any:
        c = checkpoints
        return (
            sa.select(
                c.c.checkpoint_id, c.c.parent_checkpoint_id, c.c.checkpoint_type, c.c.checkpoint
            )
            .where(
                c.c.thread_hash == _bind("thread_hash", c.c.thread_hash),
                c.c.ns_hash == _bind("ns_hash", c.c.ns_hash),
                c.c.checkpoint_id <= _bind("upto", c.c.checkpoint_id),
            )
            .order_by(c.c.checkpoint_id.desc())
            .limit(sa.bindparam("limit", type_=sa.Integer))
        )

    def namespace_bodies(self) -> Any:
        """The bodies of every checkpoint of one thread namespace (which versions they read),
        read with a shared lock: what is decided from them holds until the commit."""
        return self.cached(
            ("bodies",),
            lambda: self.ops.for_share(
                sa.select(checkpoints.c.checkpoint_type, checkpoints.c.checkpoint).where(
                    checkpoints.c.thread_hash == _bind("thread_hash", checkpoints.c.thread_hash),
                    checkpoints.c.ns_hash == _bind("ns_hash", checkpoints.c.ns_hash),
                )
            ),
        )

    def namespace_blob_keys(self) -> Any:
        """The blob versions stored for one thread namespace."""
        return self.cached(
            ("blob-keys",),
            lambda: sa.select(
                checkpoint_blobs.c.channel_hash,
                checkpoint_blobs.c.version,
                checkpoint_blobs.c.base_version,
            ).where(
                checkpoint_blobs.c.thread_hash
                == _bind("thread_hash", checkpoint_blobs.c.thread_hash),
                checkpoint_blobs.c.ns_hash == _bind("ns_hash", checkpoint_blobs.c.ns_hash),
            ),
        )


# The columns of a value row and of a pending write as `values_and_writes` and `page_values`
# answer them, aligned for their `UNION ALL`: (kind, thread hash, namespace hash, key,
# version or task id, base version or channel, -, or task path, - or index, type, value).
_VALUE_ROW = (
    sa.literal_column(str(BLOB_ROW), sa.Integer),
    checkpoint_blobs.c.thread_hash,
    checkpoint_blobs.c.ns_hash,
    checkpoint_blobs.c.channel_hash,
    checkpoint_blobs.c.version,
    sa.type_coerce(checkpoint_blobs.c.base_version, sa.Text),
    sa.cast(sa.null(), sa.Text),
    sa.cast(sa.null(), sa.Integer),
    checkpoint_blobs.c.value_type,
    checkpoint_blobs.c.value,
)
_WRITE_ROW = (
    sa.literal_column(str(WRITE_ROW), sa.Integer),
    checkpoint_writes.c.thread_hash,
    checkpoint_writes.c.ns_hash,
    checkpoint_writes.c.checkpoint_id,
    checkpoint_writes.c.task_id,
    checkpoint_writes.c.channel,
    checkpoint_writes.c.task_path,
    checkpoint_writes.c.idx,
    checkpoint_writes.c.value_type,
    checkpoint_writes.c.value,
)


def _page_writes(param: str) -> str:
    """The pending writes of a page's range of ids, which both keyed page texts end with;
    `param` is the driver's placeholder for a name (`:{}` or `%({})s`)."""
    thread, ns, lo, hi = (param.format(n) for n in ("w_thread_hash", "w_ns_hash", "w_lo", "w_hi"))
    return (
        f" UNION ALL SELECT {WRITE_ROW}, w.checkpoint_id, w.task_id, w.channel, w.task_path, "
        "w.idx, w.value_type, w.value FROM agboss_checkpoint_writes AS w "
        f"WHERE w.thread_hash = {thread} AND w.ns_hash = {ns} "
        f"AND w.checkpoint_id >= {lo} AND w.checkpoint_id <= {hi}"
    )


_PAGE_VALUES_JSON = (
    f"SELECT {BLOB_ROW}, b.channel_hash, b.version, b.base_version, b.value_type, b.value, "
    "NULL, NULL FROM json_each(:keys) AS k CROSS JOIN agboss_checkpoint_blobs AS b "
    "WHERE b.thread_hash = :w_thread_hash AND b.ns_hash = :w_ns_hash "
    "AND b.channel_hash = substr(k.value, 1, 64) AND b.version = substr(k.value, 65)"
) + _page_writes(":{}")

_PAGE_VALUES_JSON_PG = (
    f"SELECT {BLOB_ROW}, b.channel_hash, b.version, b.base_version, CAST(NULL AS text), "
    "CAST(NULL AS integer), b.value_type, b.value "
    "FROM json_array_elements_text(CAST(%(keys)s AS json)) AS k (v) CROSS JOIN LATERAL ("
    "SELECT channel_hash, version, base_version, value_type, value "
    "FROM agboss_checkpoint_blobs WHERE thread_hash = %(w_thread_hash)s "
    "AND ns_hash = %(w_ns_hash)s AND channel_hash = substr(k.v, 1, 64) "
    "AND version = substr(k.v, 65) LIMIT 1) AS b"
) + _page_writes("%({})s")


@dataclass(frozen=True, slots=True)
class ListShape:
    """Which criteria a `list` page has: one statement per combination (`listing`)."""

    thread: bool
    namespace: bool
    checkpoint_id: bool
    before: bool
    limit: bool
    filters: int
