"""The saver's statements, built once per dialect and kind of store time.

What differs per database comes from the dialect (`connection.dialect`) and its
`Capabilities`: where data-modifying statements fold into `WITH` (`dml_in_with`), a
write is one statement; elsewhere it is one transaction of several.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa

from agboss_sql.sql._fence import FenceStatements
from agboss_sql.sql.connection import SqlBuilder
from agboss_sql.sql.schema import checkpoint_blobs, checkpoint_writes, checkpoints
from agboss_sql.sql.schema import execution_leases as L
from agboss_sql.sql.statements import Script

T = TypeVar("T")

MAX_ROWS = 32
"""Rows per multi-row statement (inserts and keyed look-ups); more take several."""

LIST_PAGE = 100
"""Checkpoints read per statement while listing one namespace of a thread."""

MAX_CHECKPOINT_ID = 64
"""Characters of a checkpoint id (the width of its columns)."""
MAX_VERSION = 128
"""Characters of a channel version (the width of its column)."""

CHECKPOINT_KEY = ("thread_hash", "ns_hash", "checkpoint_id")
BLOB_KEY = ("thread_hash", "ns_hash", "channel_hash", "version")
WRITE_KEY = ("thread_hash", "ns_hash", "checkpoint_id", "task_hash", "idx")
BLOB_VALUES = ("channel_hash", "version", "value_type", "value", "base_version")
CHECKPOINT_VALUES = (
    "thread_id",
    "checkpoint_ns",
    "parent_checkpoint_id",
    "run_hash",
    "checkpoint_type",
    "checkpoint",
    "metadata",
)
LISTED = (
    "thread_id",
    "checkpoint_ns",
    "ns_hash",
    "checkpoint_id",
    "parent_checkpoint_id",
    "checkpoint_type",
    "checkpoint",
    "metadata",
    "thread_hash",
)

# Rows of the checkpoint-with-writes read: the checkpoint, its pending writes, then the
# values it was expected to read (`read`).
CHECKPOINT_ROW = 0
WRITE_ROW = 1
BLOB_ROW = 2

MAX_LOOKUPS = 64
"""Keyed look-ups per statement where values and pending writes are read together (a page of
`list`): at most four parameters each."""


def _bind(name: str, column: sa.Column[Any]) -> sa.BindParameter[Any]:
    return sa.bindparam(name, type_=column.type)


def _bound(table: sa.Table, columns: Sequence[str], prefix: str) -> dict[str, Any]:
    return {column: _bind(f"{prefix}{column}", table.c[column]) for column in columns}


def chunks(items: Sequence[T], size: int = MAX_ROWS) -> Iterator[Sequence[T]]:
    """`items` in runs of at most `size`, one per multi-row statement."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


class CheckpointStatements:
    """The saver's statements for one dialect and one kind of store time. Statements whose
    shape depends on a count (rows of a multi-row insert or look-up, metadata filters) are
    built on first use and kept, one per count."""

    def __init__(self, b: SqlBuilder) -> None:
        self.ops = b.ops
        self.fold: bool = b.capabilities.dml_in_with
        self.scripts: bool = b.capabilities.scripts
        self.json_exact: bool = b.capabilities.json_key_exact
        self._cache: dict[tuple[Any, ...], Any] = {}

        # The fence the fenced-effect store makes first (`_fence`): it raises the scope's
        # high-water mark to the token while the lease is held at that token and live by the
        # store's time; one row matched means held. It is the first statement of a fenced
        # write, so the lease row is locked before anything else is written.
        self.fences = FenceStatements(b)
        self.fence = self.fences.fence
        if self.fold:
            self._fenced: Any = self._fence_held()

        # The checkpoint with its pending writes, in one statement. The latest is the row off
        # the key's end (`ORDER BY … DESC LIMIT 1`, not `max()`, which PostgreSQL aggregated
        # over the thread's whole history when its statistics still counted a few rows for
        # the thread). PostgreSQL probes it once, in a `WITH` that the checkpoint row and
        # its writes both read (a scalar subquery in each probed the key twice more: 391 ->
        # 330 us a read); MariaDB materialises that `WITH` as a temporary table, which took
        # its read from 525 to 1,033 us, so elsewhere each reads the latest id as a scalar
        # (`Capabilities.shared_with`).
        self._with_cte = b.capabilities.shared_with
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

    def _fence_held(self) -> Any:
        """Folding dialects: the fence as a `WITH` part, true when it held."""
        fence = self.fence.returning(L.c.lease_epoch).cte("agboss_fence")
        return sa.exists(sa.select(fence.c.lease_epoch))

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
            .limit(1)
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
            .limit(1)
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
        text_null = sa.cast(sa.null(), sa.Text)
        lookups = [
            sa.select(
                sa.literal_column(str(BLOB_ROW), sa.Integer),
                b.c.thread_hash,
                b.c.ns_hash,
                b.c.channel_hash,
                b.c.version,
                sa.type_coerce(b.c.base_version, sa.Text),
                text_null,
                sa.cast(sa.null(), sa.Integer),
                b.c.value_type,
                b.c.value,
            ).where(*(b.c[c] == _bind(f"b{i}_{c}", b.c[c]) for c in BLOB_KEY))
            for i in range(blobs)
        ]
        lookups += [
            sa.select(
                sa.literal_column(str(WRITE_ROW), sa.Integer),
                w.c.thread_hash,
                w.c.ns_hash,
                w.c.checkpoint_id,
                w.c.task_id,
                w.c.channel,
                w.c.task_path,
                w.c.idx,
                w.c.value_type,
                w.c.value,
            ).where(*(w.c[c] == _bind(f"w{i}_{c}", w.c[c]) for c in CHECKPOINT_KEY))
            for i in range(writes)
        ]
        return lookups[0] if len(lookups) == 1 else sa.union_all(*lookups)

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

    def cached(self, key: tuple[Any, ...], build: Any) -> Any:
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = build()
        return found

    def _bases(self, count: int, lock: bool = True) -> Any:
        """The rows of `count` base values (`a<i>_channel_hash`, `a<i>_version`) of the put's
        thread namespace that are stored whole (an append is no base: one stored under a
        version this saver wrote whole, by another saver first, must not become one), with
        a shared lock (`lock`): a delete of one waits for the put's commit."""
        b = checkpoint_blobs
        locking = self.ops.for_share if lock else (lambda select: select)
        return locking(
            sa.select(b.c.version).where(
                b.c.thread_hash == _bind("p_thread_hash", b.c.thread_hash),
                b.c.ns_hash == _bind("p_ns_hash", b.c.ns_hash),
                b.c.base_version.is_(None),
                sa.or_(
                    *(
                        sa.and_(
                            b.c.channel_hash == _bind(f"a{i}_channel_hash", b.c.channel_hash),
                            b.c.version == _bind(f"a{i}_version", b.c.version),
                        )
                        for i in range(count)
                    )
                ),
            )
        )

    def lock_bases(self, count: int) -> Any:
        """Lock the rows of `count` base values a put's appends name (see `_bases`): the
        put writes only if every one is there."""
        return self.cached(("lock bases", count), lambda: self._bases(count))

    def _guard(self, fenced: bool, bases: int) -> Any:
        """Folding dialects: the condition a guarded put writes under, one object per kind
        so the blobs and the checkpoint share its `WITH` parts: the fence held (`fenced`),
        and every one of `bases` base values there (and locked until the commit)."""

        def build() -> Any:
            conditions = [self._fenced] if fenced else []
            if bases:
                held = self._bases(bases, lock=False).cte("agboss_bases")
                count = sa.select(sa.func.count()).select_from(held).scalar_subquery()
                conditions.append(count == bases)
            return sa.and_(*conditions)

        return self.cached(("guard", fenced, bases), build)

    def blob_insert(self, count: int, *, fenced: bool, bases: int = 0) -> Any:
        """Insert `count` blobs of one thread namespace, skipping versions already stored;
        `fenced`, `bases` (folding dialects only): a `WITH` part written only under the
        guard (`_guard`)."""
        return self.cached(
            ("blobs", count, fenced, bases), lambda: self._blob_insert(count, fenced, bases)
        )

    def _blob_insert(self, count: int, fenced: bool, bases: int = 0) -> Any:
        shared = _bound(checkpoint_blobs, ("thread_hash", "ns_hash"), "p_")
        rows = [{**shared, **_bound(checkpoint_blobs, BLOB_VALUES, f"b{i}_")} for i in range(count)]
        statement = self.ops.insert(checkpoint_blobs)
        if fenced or bases:
            table = sa.values(
                *(sa.column(c, checkpoint_blobs.c[c].type) for c in BLOB_VALUES), name="rows"
            )
            table = table.data([tuple(row[c] for c in BLOB_VALUES) for row in rows])
            selected = sa.select(
                shared["thread_hash"], shared["ns_hash"], *(table.c[c] for c in BLOB_VALUES)
            ).where(self._guard(fenced, bases))
            statement = statement.from_select(["thread_hash", "ns_hash", *BLOB_VALUES], selected)
        else:
            statement = statement.values(rows)
        return self.ops.skip_duplicates(statement, BLOB_KEY)

    def checkpoint_upsert(self, *, fenced: bool, bases: int = 0) -> Any:
        """Insert a checkpoint or replace its body and metadata (LangGraph may save one id
        again); `fenced`, `bases` (folding dialects only): written only under the guard
        (`_guard`), and returning the key then."""
        return self.cached(
            ("checkpoint", fenced, bases), lambda: self._checkpoint_upsert(fenced, bases)
        )

    def _checkpoint_upsert(self, fenced: bool, bases: int = 0, script: bool = False) -> Any:
        """`script`: guarded by `_bases_there` (a script's check), and returning nothing."""
        row = _bound(checkpoints, (*CHECKPOINT_KEY, *CHECKPOINT_VALUES), "p_")
        statement = self.ops.insert(checkpoints)
        guarded = (fenced or bool(bases)) and not script
        if fenced or bases or script:
            condition = self._bases_there(bases) if script else self._guard(fenced, bases)
            statement = statement.from_select(list(row), sa.select(*row.values()).where(condition))
        else:
            statement = statement.values(row)
        statement = self.ops.replace_duplicates(
            statement, CHECKPOINT_KEY, ("run_hash", "checkpoint_type", "checkpoint", "metadata")
        )
        return statement.returning(checkpoints.c.checkpoint_id) if guarded else statement

    def put(self, blob_count: int, *, fenced: bool, bases: int = 0) -> Any:
        """Folding dialects: the blobs (at most `MAX_ROWS`) and the checkpoint in one statement,
        fenced or not, naming `bases` base values or none; a guarded put (fenced, or with
        bases) returns the checkpoint's key if it wrote."""
        return self.cached(
            ("put", blob_count, fenced, bases), lambda: self._put(blob_count, fenced, bases)
        )

    def _put(self, blob_count: int, fenced: bool, bases: int) -> Any:
        statement = self.checkpoint_upsert(fenced=fenced, bases=bases)
        if blob_count:
            blobs = self._blob_insert(blob_count, fenced, bases).cte("agboss_new_blobs")
            statement = statement.add_cte(blobs)
        return statement

    def put_script(self, blob_count: int, bases: int = 0) -> Script:
        """Dialects that take scripts: the blobs (1 to `MAX_ROWS`) and the checkpoint, one
        transaction in one text. With `bases` (the base values the appends among the blobs
        name): both are written only if every base is there, each locked (shared) by the
        first statement that reads it until the commit, and the script's rows are one, the
        number of bases there: fewer than `bases` means nothing was written."""
        script: Script = self.cached(
            ("put script", blob_count, bases),
            lambda: (
                Script(
                    self._script_blob_insert(blob_count, bases),
                    self._checkpoint_upsert(False, bases, script=True),
                    sa.select(sa.func.count()).select_from(self._bases(bases).subquery("held")),
                )
                if bases
                else Script(
                    self.blob_insert(blob_count, fenced=False),
                    self.checkpoint_upsert(fenced=False),
                )
            ),
        )
        return script

    def _bases_there(self, bases: int) -> Any:
        """Scripts: every one of `bases` base values there, locked (shared) as read."""
        held = self._bases(bases).subquery("held")
        return sa.select(sa.func.count()).select_from(held).scalar_subquery() == bases

    def _script_blob_insert(self, count: int, bases: int) -> Any:
        shared = _bound(checkpoint_blobs, ("thread_hash", "ns_hash"), "p_")
        rows = [_bound(checkpoint_blobs, BLOB_VALUES, f"b{i}_") for i in range(count)]
        # The rows as a derived table of labelled selects (MariaDB's VALUES names no columns).
        selects = [sa.select(*(row[c].label(c) for c in BLOB_VALUES)) for row in rows]
        table = (selects[0] if count == 1 else sa.union_all(*selects)).subquery("new_rows")
        selected = sa.select(
            shared["thread_hash"], shared["ns_hash"], *(table.c[c] for c in BLOB_VALUES)
        ).where(self._bases_there(bases))
        statement = self.ops.insert(checkpoint_blobs).from_select(
            ["thread_hash", "ns_hash", *BLOB_VALUES], selected
        )
        return self.ops.skip_duplicates(statement, BLOB_KEY)

    def writes_insert(self, count: int, *, replace: bool, fenced: bool) -> Any:
        """Insert `count` pending writes of one checkpoint and task: skipping keys already
        written, or (`replace`) overwriting them; `fenced` (folding dialects only): written
        only when the fence held, returning a row per write then."""
        return self.cached(
            ("writes", count, replace, fenced), lambda: self._writes(count, replace, fenced)
        )

    def _writes(self, count: int, replace: bool, fenced: bool) -> Any:
        shared = _bound(
            checkpoint_writes,
            ("thread_hash", "ns_hash", "checkpoint_id", "task_hash", "task_id", "task_path"),
            "p_",
        )
        per_row = ("idx", "channel", "value_type", "value")
        rows = [{**shared, **_bound(checkpoint_writes, per_row, f"w{i}_")} for i in range(count)]
        columns = list(rows[0])
        statement = self.ops.insert(checkpoint_writes)
        if fenced:
            table = sa.values(
                *(sa.column(c, checkpoint_writes.c[c].type) for c in per_row), name="rows"
            )
            table = table.data([tuple(row[c] for c in per_row) for row in rows])
            selected = sa.select(
                *(table.c[c] if c in per_row else shared[c] for c in columns)
            ).where(self._fenced)
            statement = statement.from_select(columns, selected)
        else:
            statement = statement.values(rows)
        if replace:
            statement = self.ops.replace_duplicates(
                statement, WRITE_KEY, ("channel", "value_type", "value")
            )
        else:
            statement = self.ops.skip_duplicates(statement, WRITE_KEY)
        return statement.returning(checkpoint_writes.c.idx) if fenced else statement

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


@dataclass(frozen=True, slots=True)
class ListShape:
    """Which criteria a `list` page has: one statement per combination (`listing`)."""

    thread: bool
    namespace: bool
    checkpoint_id: bool
    before: bool
    limit: bool
    filters: int


def keyed_params(
    keys: Sequence[Sequence[Any]], columns: Sequence[str], *, prefix: str = "k"
) -> dict[str, Any]:
    """The parameters of a keyed statement (`keyed`, `keyed_delete`; `values_and_writes` with
    its prefixes) for `keys`."""
    params: dict[str, Any] = {}
    for i, key in enumerate(keys):
        for column, value in zip(columns, key, strict=True):
            params[f"{prefix}{i}_{column}"] = value
    return params
