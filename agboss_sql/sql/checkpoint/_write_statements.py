"""The saver's write statements, built once per dialect and kind of store time: the put
(value rows and the checkpoint, folded into one statement, sent as one script, or several
in a transaction), the check of the bases its appends name, and the pending writes.
`CheckpointStatements` (`_statements`) adds the reads, the listing and the deletes."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from agboss_sql.sql._fence import FenceStatements
from agboss_sql.sql.checkpoint._layout import (
    BLOB_KEY,
    BLOB_VALUES,
    CHECKPOINT_KEY,
    CHECKPOINT_VALUES,
    WRITE_KEY,
    _bind,
    _bound,
)
from agboss_sql.sql.connection import SqlBuilder
from agboss_sql.sql.schema import checkpoint_blobs, checkpoint_writes, checkpoints
from agboss_sql.sql.schema import execution_leases as L
from agboss_sql.sql.statements import Script


class WriteStatements:
    """The saver's write statements for one dialect and one kind of store time. Statements
    whose shape depends on a count (rows of a multi-row insert, bases) are built on first
    use and kept, one per count (`cached`)."""

    def __init__(self, b: SqlBuilder) -> None:
        self.ops = b.ops
        self.fold: bool = b.capabilities.dml_in_with
        self.scripts: bool = b.capabilities.scripts
        self._cache: dict[tuple[Any, ...], Any] = {}

        # The fence the fenced-effect store makes first (`_fence`): it raises the scope's
        # high-water mark to the token while the lease is held at that token and live by the
        # store's time; one row matched means held. It is the first statement of a fenced
        # write, so the lease row is locked before anything else is written.
        self.fences = FenceStatements(b)
        self.fence = self.fences.fence
        if self.fold:
            self._fenced: Any = self._fence_held()

    def _fence_held(self) -> Any:
        """Folding dialects: the fence as a `WITH` part, true when it held."""
        fence = self.fence.returning(L.c.lease_epoch).cte("agboss_fence")
        return sa.exists(sa.select(fence.c.lease_epoch))

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
                # Locked (shared), not just read in the statement's snapshot: a delete of a
                # base still uncommitted when the snapshot was taken would otherwise commit
                # after the put, leaving its append without a base. Locked, the put waits for
                # the delete's commit and READ COMMITTED's re-check passes over the row gone:
                # the count falls short, nothing is written, and the saver stores the value
                # whole.
                held = self._bases(bases).cte("agboss_bases")
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
