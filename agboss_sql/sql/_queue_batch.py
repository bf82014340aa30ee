"""The child queue's batches: `claim_many` and `enqueue_many` of the SQL child queue.

A batch claim takes up to `n` queued children in the order `claim` takes them and marks each
running at its own next attempt: where the dialect has `UPDATE … RETURNING` (PostgreSQL,
SQLite) one statement, `WITH picked AS MATERIALIZED (SELECT id … ORDER BY … LIMIT :n FOR
UPDATE SKIP LOCKED) UPDATE … WHERE id IN (SELECT id FROM picked) RETURNING …` (the pick
run once; SQLite drops the lock clause: one statement is atomic there);
elsewhere (MySQL/MariaDB) one transaction, `SELECT … LIMIT :n FOR UPDATE SKIP LOCKED`, then
one `UPDATE … WHERE id IN (…)` of the rows locked.

A batch enqueue is one transaction: the children not queued yet are inserted (`INSERT …
VALUES (…), (…) ON CONFLICT DO NOTHING RETURNING child_execution_id` where an insert of a
duplicate skips it silently; on MySQL/MariaDB a locking read of the batch's ids first, whose
locks (gap locks included) keep a concurrent enqueue of the same ids out until this one
ends, then a plain insert of the absent ones), then each parent's count raised by the number
of its children inserted (one upsert per parent, parents in sorted order: two batches lock
the counts in one order). On PostgreSQL the batch goes as one JSON document of its rows:
one `INSERT … SELECT … FROM json_array_elements(…) WITH ORDINALITY … ON CONFLICT DO
NOTHING RETURNING`, then one upsert of every parent's count from a second document, whatever
the batch's size. Multi-row statements are built for a few sizes only (powers of
two up to `_MAX_ROWS`), so a batch of any size is sent as a handful of compiled statements.

Statements per batch (BEGIN/COMMIT not counted), `p` parents, `k` children:

| operation | PostgreSQL, SQLite | MySQL/MariaDB |
|---|---|---|
| `claim_many` (`k` claimed) | 1 | 1 + ⌈k/128⌉ in a transaction (1 when none is queued) |
| `enqueue_many` | PostgreSQL 2 (+1 notify); SQLite ⌈k/128⌉ + (binary digits of k mod 128) inserts + p | as SQLite + ⌈k/128⌉ locking reads |

On PostgreSQL a batch enqueue, like `enqueue` and a finish that makes a waiting parent
claimable again, sends `pg_notify` in its transaction (`Capabilities.notifications`): the
notification goes out when the transaction commits, to the claimers listening
(`_queue_wakeups`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from agboss_sql.contracts.errors import CorruptStoredRowError, StoreTimeoutError
from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import checked_count, checked_queued_children
from agboss_sql.contracts.types import ChildStatus, ClaimedChild, QueuedChild
from agboss_sql.sql._base import dumps, loads
from agboss_sql.sql._child_parents import ParentCountStatements
from agboss_sql.sql._queue_rows import CLAIMED, claimed_child, claimed_of, columns
from agboss_sql.sql.connection import Exec, SqlBuilder, Step
from agboss_sql.sql.schema import child_executions, child_parents

if TYPE_CHECKING:
    from agboss_sql.sql.connection import SqlConnection

C = child_executions
P = child_parents

QUEUED = ChildStatus.QUEUED.value
RUNNING = ChildStatus.RUNNING.value

WAKE_CHANNEL = "agboss_children"
"""The notification channel of the child queue (PostgreSQL)."""

_MAX_ROWS = 128
"""The most rows one batch statement names; a larger batch is sent in several."""

_DUPLICATE_RERUNS = 3
"""How many times a batch enqueue whose insert met an id queued meanwhile runs again."""

_MAX_CLAIM_SPREAD = 32
"""How many rows past the head of the queue a batch claim run again after a certification
conflict may start (Galera), as `claim` does."""

_CHILD_FIELDS = (
    "tenant_id",
    "root_execution_id",
    "parent_execution_id",
    "child_execution_id",
    "depth",
    "payload",
)


_SHORT = {
    "tenant_id": "t",
    "root_execution_id": "r",
    "parent_execution_id": "p",
    "child_execution_id": "c",
    "depth": "d",
    "payload": "j",
}
"""The insert's parameter name of each field (followed by the row's index)."""


def chunks(count: int) -> list[int]:
    """The sizes `count` rows are sent in: `_MAX_ROWS` at a time, the rest as powers of two
    (its binary digits), largest first; so statements exist for a few sizes only."""
    sizes = [_MAX_ROWS] * (count // _MAX_ROWS)
    rest = count % _MAX_ROWS
    bit = _MAX_ROWS // 2
    while rest:
        if rest >= bit:
            sizes.append(bit)
            rest -= bit
        bit //= 2
    return sizes


def _claim_order(row: Any) -> tuple[Any, ...]:
    """A batch claim's row's place in claim order (deepest first, then oldest, then in
    queue order): its depth, then its `queued_at` and id, the two columns after `CLAIMED`."""
    return (-row[4], row[8], row[9])


def _pieces(count: int) -> list[int]:
    """The sizes an `IN` list of `count` values is sent in: `_MAX_ROWS` at a time."""
    return [min(_MAX_ROWS, count - at) for at in range(0, count, _MAX_ROWS)]


def _padded(count: int) -> int:
    """The smallest power of two `>= count` (at most `_MAX_ROWS`): an `IN` list of `count`
    values is sent with the last one repeated up to it."""
    size = 1
    while size < count:
        size *= 2
    return size


class BatchStatements:
    """The batch statements of the child queue for one dialect (built once per dialect; the
    multi-row ones for each size when first needed)."""

    def __init__(self, b: SqlBuilder) -> None:
        ops = b.ops
        self.ops = ops
        self.update_returning = b.capabilities.update_returning
        # An insert that skips a duplicate silently and answers the rows it inserted; else
        # (MySQL/MariaDB) a locking read of the ids first, and a plain insert.
        self.insert_returning = (
            b.capabilities.insert_returning and not b.capabilities.insert_if_absent_raises
        )
        self.claim_values = {
            "status": sa.bindparam("running"),
            "claimed_by": sa.bindparam("instance_id"),
            "attempt": C.c.attempt + 1,
            "claimed_at": sa.bindparam("now", type_=sa.BigInteger),
        }
        self._inserts: dict[int, Any] = {}
        # PostgreSQL: the whole batch as arrays, one insert and one count upsert whatever
        # its size (psycopg parses the text of a statement of over 50 parameters at every
        # send; a multi-row insert of 128 rows has 768).
        self.arrays = b.ops.NAME == "postgresql"
        if self.arrays:
            self._build_array_enqueue()
        self._locks: dict[int, Any] = {}
        self._claims: dict[int, Any] = {}
        self.notify: Any = (
            sa.select(sa.func.pg_notify(sa.literal(WAKE_CHANNEL), sa.literal("")))
            if b.capabilities.notifications
            else None
        )
        order = (C.c.depth.desc(), C.c.queued_at, C.c.id)
        limit = sa.bindparam("n", type_=sa.Integer)
        # The rows picked, materialised once: PostgreSQL may run a subquery of `IN` again
        # for each row it compares (a nested loop), and a locking subquery run again skips
        # the rows it locked itself and picks more than `n`.
        picked = (
            ops.skip_locked(
                sa.select(C.c.id)
                .where(C.c.status == sa.bindparam("queued"))
                .order_by(*order)
                .limit(limit)
            )
            .cte("picked")
            .prefix_with("MATERIALIZED", dialect="postgresql")
        )
        self.claim = (
            sa.update(C)
            .where(C.c.id.in_(sa.select(picked.c.id)), C.c.status == sa.bindparam("queued"))
            .values(self.claim_values)
            .returning(*columns(CLAIMED), C.c.queued_at, C.c.id)
        )
        next_rows = (
            sa.select(C.c.id, *columns(CLAIMED))
            .where(C.c.status == sa.bindparam("queued"))
            .order_by(*order)
            .limit(limit)
        )
        self.lock_next = ops.skip_locked(next_rows)
        self.lock_next_after = ops.skip_locked(
            next_rows.offset(sa.bindparam("skip", type_=sa.Integer))
        )

    def _build_array_enqueue(self) -> None:
        # The batch as one JSON document, `[[tenant, root, parent, child, depth, payload],
        # …]`: one parameter, encoded by the json module's C encoder and parsed by the
        # server (psycopg dumps a list parameter element by element in Python).
        rows = (
            sa.func.json_array_elements(
                sa.cast(sa.bindparam("rows", type_=sa.Text()), postgresql.JSON())
            )
            .table_valued("e", with_ordinality="o")
            .render_derived()
        )

        def field(i: int) -> Any:
            return rows.c.e.op("->>")(sa.literal_column(str(i)))

        inserted = sa.select(
            *(field(i) for i in range(4)),
            sa.cast(field(4), sa.Integer),
            field(5),
            sa.bindparam("queued"),
            sa.literal(0, sa.Integer),
            sa.bindparam("now", type_=sa.BigInteger),
        ).order_by(rows.c.o)  # ids in the batch's order: claimed in it
        self.insert_array = (
            postgresql.insert(C)
            .from_select([*_CHILD_FIELDS, "status", "attempt", "queued_at"], inserted)
            .on_conflict_do_nothing(index_elements=["child_execution_id"])
            .returning(C.c.child_execution_id)
        )
        counts = (
            sa.func.json_array_elements(
                sa.cast(sa.bindparam("counts", type_=sa.Text()), postgresql.JSON())
            )
            .table_valued("e")
            .render_derived()
        )

        def count(i: int) -> Any:
            return counts.c.e.op("->>")(sa.literal_column(str(i)))

        # The parents in sorted order: two batches lock their counts in one order.
        upsert = postgresql.insert(P).from_select(
            ["tenant_id", "parent_execution_id", "unfinished", "waits"],
            sa.select(
                count(0), count(1), sa.cast(count(2), sa.BigInteger), sa.literal(0, sa.BigInteger)
            ).order_by(count(0), count(1)),
        )
        self.count_array = upsert.on_conflict_do_update(
            index_elements=["tenant_id", "parent_execution_id"],
            set_={"unfinished": P.c.unfinished + upsert.excluded.unfinished},
        )

    def insert(self, size: int) -> Any:
        """The insert of `size` children, skipping ids already queued (answering the ids
        inserted) or, without that, a plain insert."""
        found = self._inserts.get(size)
        if found is None:
            now = sa.bindparam("now", type_=sa.BigInteger)
            # Short parameter names: the driver parses a statement's text at every send
            # (psycopg caches none with over 50 parameters); the shorter, the cheaper.
            rows = [
                {
                    "tenant_id": sa.bindparam(f"t{i}"),
                    "root_execution_id": sa.bindparam(f"r{i}"),
                    "parent_execution_id": sa.bindparam(f"p{i}"),
                    "child_execution_id": sa.bindparam(f"c{i}"),
                    "depth": sa.bindparam(f"d{i}", type_=sa.Integer),
                    "payload": sa.bindparam(f"j{i}"),
                    "status": sa.bindparam("queued"),
                    "attempt": sa.literal(0, sa.Integer),
                    "queued_at": now,
                }
                for i in range(size)
            ]
            statement = self.ops.insert(C).values(rows)
            if self.insert_returning:
                statement = self.ops.skip_duplicates(statement, ["child_execution_id"]).returning(
                    C.c.child_execution_id
                )
            found = self._inserts[size] = statement
        return found

    def lock_ids(self, size: int) -> Any:
        """The locking read of which of `size` child ids are queued already."""
        found = self._locks.get(size)
        if found is None:
            ids: list[Any] = [sa.bindparam(f"id_{i}") for i in range(size)]
            found = self._locks[size] = self.ops.for_update(
                sa.select(C.c.child_execution_id).where(C.c.child_execution_id.in_(ids))
            )
        return found

    def claim_locked(self, size: int) -> Any:
        """The update of `size` locked rows (by their ids) to running."""
        found = self._claims.get(size)
        if found is None:
            ids = [sa.bindparam(f"id_{i}", type_=sa.BigInteger) for i in range(size)]
            found = self._claims[size] = (
                sa.update(C)
                .where(C.c.id.in_(ids), C.c.status == sa.bindparam("queued"))
                .values(self.claim_values)
            )
        return found


class BatchQueueMethods:
    """`enqueue_many` and `claim_many` of the SQL child queue (a base of
    `SqlChildExecutionQueueRepository`)."""

    if TYPE_CHECKING:
        connection: SqlConnection
        _sql: Any  # the queue's statements: `.batch` (BatchStatements), `.parents`

        @property
        def clock(self) -> Any: ...

    async def enqueue_many(self, children: Sequence[QueuedChild]) -> Sequence[str]:
        """In one transaction: insert each child not queued yet (status queued, attempt 0,
        queued at the application clock's now) and raise each parent's count of unfinished
        children by the number of its children inserted; answer their ids in the order
        given. Ids already queued are skipped; one id twice in the batch is a `ValueError`
        (nothing sent)."""
        batch = checked_queued_children(children)
        if not batch:
            return []
        rows = [
            {**{f: getattr(c, f) for f in _CHILD_FIELDS}, "payload": dumps(c.payload)}
            for c in batch
        ]
        now = self.clock.now()
        connection = self.connection
        for again in range(_DUPLICATE_RERUNS, -1, -1):
            try:
                inserted = await connection.run(lambda: self._enqueue_many(rows, now))
                break
            except Exception as exc:
                # MySQL/MariaDB: an id queued on another node of a cluster after this
                # transaction's locking read (row locks are node-local) fails the insert;
                # nothing applied, the next run reads it and skips it.
                if not (
                    again
                    and connection.capabilities.insert_if_absent_raises
                    and connection.ops.is_unique_violation(exc)
                ):
                    raise
        return [row["child_execution_id"] for row in rows if row["child_execution_id"] in inserted]

    def _enqueue_many(self, rows: list[dict[str, Any]], now: int) -> Step[set[str]]:
        sql: BatchStatements = self._sql.batch
        parents: ParentCountStatements = self._sql.parents
        if sql.arrays:
            return (yield from self._enqueue_arrays(rows, now))
        fresh = rows
        if not sql.insert_returning:
            # Lock the batch's ids (a duplicate found is skipped; an absent one stays absent
            # until this transaction ends), then insert the others.
            known: set[str] = set()
            at = 0
            for size in _pieces(len(rows)):
                ids = [row["child_execution_id"] for row in rows[at : at + size]]
                at += size
                padded = _padded(size)
                params = {f"id_{i}": ids[min(i, size - 1)] for i in range(padded)}
                result = yield Exec(sql.lock_ids(padded), params)
                known.update(str(row[0]) for row in result.rows)
            fresh = [row for row in rows if row["child_execution_id"] not in known]
        inserted: set[str] = set()
        at = 0
        for size in chunks(len(fresh)):
            part = fresh[at : at + size]
            at += size
            values: dict[str, Any] = {"queued": QUEUED, "now": now}
            for i, row in enumerate(part):
                for name, value in row.items():
                    values[f"{_SHORT[name]}{i}"] = value
            result = yield Exec(sql.insert(size), values)
            if sql.insert_returning:
                inserted.update(str(row[0]) for row in result.rows)
            else:
                inserted.update(row["child_execution_id"] for row in part)
        counts: dict[tuple[str, str], int] = {}
        for row in fresh:
            if row["child_execution_id"] in inserted:
                parent = (row["tenant_id"], row["parent_execution_id"])
                counts[parent] = counts.get(parent, 0) + 1
        for (tenant_id, parent_id), n in sorted(counts.items()):
            yield Exec(
                parents.count_children,
                {"tenant_id": tenant_id, "parent_execution_id": parent_id, "n": n},
            )
        if inserted and sql.notify is not None:
            yield Exec(sql.notify, {})
        return inserted

    def _enqueue_arrays(self, rows: list[dict[str, Any]], now: int) -> Step[set[str]]:
        """PostgreSQL: the batch's children in one insert of arrays, their parents' counts
        in one upsert of arrays."""
        sql: BatchStatements = self._sql.batch
        document = json.dumps(
            [[row[name] for name in _CHILD_FIELDS] for row in rows], ensure_ascii=False
        )
        values: dict[str, Any] = {"queued": QUEUED, "now": now, "rows": document}
        result = yield Exec(sql.insert_array, values)
        inserted = {str(row[0]) for row in result.rows}
        counts: dict[tuple[str, str], int] = {}
        for row in rows:
            if row["child_execution_id"] in inserted:
                parent = (row["tenant_id"], row["parent_execution_id"])
                counts[parent] = counts.get(parent, 0) + 1
        if counts:
            order = sorted(counts)
            document = json.dumps([[t, p, counts[(t, p)]] for t, p in order], ensure_ascii=False)
            yield Exec(sql.count_array, {"counts": document})
        if inserted and sql.notify is not None:
            yield Exec(sql.notify, {})
        return inserted

    async def claim_many(self, instance_id: str, n: int) -> Sequence[ClaimedChild]:
        """Take up to `n` queued children (deepest first, then oldest, then in queue order)
        and mark each running for `instance_id` at its own `attempt + 1`, in one atomic
        step; answered in that order, fewer when fewer are free. Two claimers never get one
        child."""
        checked_identifier("instance_id", instance_id)
        checked_count("n", n)
        if n == 0:
            return []
        params: dict[str, Any] = {
            "queued": QUEUED,
            "running": RUNNING,
            "instance_id": instance_id,
            "now": self.clock.now(),
        }
        sql: BatchStatements = self._sql.batch
        if sql.update_returning:
            params["n"] = n
            rows = (await self.connection.execute(sql.claim, params)).rows
            rows.sort(key=_claim_order)  # RETURNING answers in no particular order
            return [claimed_of(row) for row in rows]
        attempts = itertools.count()
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.connection.timeouts.retry_ms / 1000
        while True:
            try:
                return await self.connection.run(
                    lambda: self._claim_many_locked(params, n, next(attempts))
                )
            except StoreTimeoutError as exc:
                # As `claim`: on a cluster that certifies write sets, claimers on other
                # nodes keep taking the rows this one picked; go on for `retry_ms`.
                if not (
                    exc.what == "retry"
                    and self.connection.capabilities.certified_writes
                    and loop.time() < give_up_at
                ):
                    raise

    def _claim_many_locked(
        self, params: dict[str, Any], n: int, attempt: int
    ) -> Step[list[ClaimedChild]]:
        sql: BatchStatements = self._sql.batch
        rows: list[Any] = []
        if attempt and self.connection.capabilities.certified_writes:
            skip = random.randrange(min(4 * attempt, _MAX_CLAIM_SPREAD) + 1)
            if skip:
                rows = (yield Exec(sql.lock_next_after, {**params, "n": n, "skip": skip})).rows
        if not rows:
            rows = (yield Exec(sql.lock_next, {**params, "n": n})).rows
        if not rows:
            return []
        at = 0
        for size in _pieces(len(rows)):
            ids = [row[0] for row in rows[at : at + size]]
            at += size
            padded = _padded(size)
            id_params = {f"id_{i}": ids[min(i, size - 1)] for i in range(padded)}
            moved = yield Exec(sql.claim_locked(padded), {**params, **id_params})
            if moved.rowcount != size:
                # Not reachable while the rows are locked by this transaction.
                raise CorruptStoredRowError(
                    f"{moved.rowcount} of {size} queued children locked by this claim moved"
                )
        # The rows as read (id first), before the update: the attempt is the one before.
        instance_id = params["instance_id"]
        return [
            claimed_child(
                row[1],
                row[2],
                row[3],
                row[4],
                int(row[5]),
                loads(row[6]),
                int(row[7]) + 1,
                instance_id,
            )
            for row in rows
        ]


__all__ = ["WAKE_CHANNEL", "BatchQueueMethods", "BatchStatements", "chunks"]
