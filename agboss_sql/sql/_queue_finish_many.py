"""The child queue's batch finish: `finish_many` of the SQL child queue.

A worker that finished several children commits them in one transaction: one commit, and
one change of each parent's count of unfinished children per batch instead of one per
child. Each child is still decided on its own row, locked, as `finish` decides it: finished
only when running at its entry's attempt (a superseded attempt changes nothing), a retry of
an attempt's committed finish answered from what that finish stored, and each finished
child stores the count it saw, as if the batch's finishes ran one after another in the
order given. So exactly one finisher of a parent's last children sees none left, whether
they finished in one batch, in several, or one by one.

Locks are taken as every transaction of the queue takes them, from the deepest level up:
the batch's children (by row id, in one statement), then their parents' counts (sorted by
tenant and parent), then the waiting parents made claimable again. Two batches therefore
lock in one order; a batch beside single finishes holds no count while it waits for a child.

Statements per batch of `k` children of `p` parents (BEGIN/COMMIT not counted; `w` parents
woken, i.e. whose count reached 0):

| | PostgreSQL (arrays, `unnest`) | SQLite | MySQL/MariaDB |
|---|---|---|---|
| lock the children | 1 | ⌈k/128⌉ | ⌈k/128⌉ |
| the counts, and the children finished | 1 (`WITH` the counts' sorted locking read and their update, the children's update; +1 read when an entry's parent has no finish here) | 2 (`UPDATE … FROM json_each(…)`: the counts, then the children) | 3 (the counts' locking read, their update and the children's update, each joined to a `JSON_TABLE` of the batch) |
| waiting parents made claimable | 1 when w > 0 (+1 notify when one woke) | 1 when w > 0 | 1 when w > 0 |

A batch of 10 children (of one parent or of ten) is 2 statements and one commit on
PostgreSQL, where 10 `finish` calls are 30 statements and 10 commits; the parents' counts
stay locked for the commit only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from agboss_sql.contracts.errors import CorruptStoredRowError
from agboss_sql.contracts.rules import checked_child_finishes
from agboss_sql.contracts.types import ChildFinish, ChildStatus, FinishResult
from agboss_sql.sql._base import dumps
from agboss_sql.sql._child_parents import ParentCountStatements
from agboss_sql.sql.connection import Exec, SqlBuilder, Step
from agboss_sql.sql.schema import child_executions, child_parents

if TYPE_CHECKING:
    from agboss_sql.sql.connection import SqlConnection

C = child_executions
P = child_parents

QUEUED = ChildStatus.QUEUED.value
RUNNING = ChildStatus.RUNNING.value
WAITING = ChildStatus.WAITING.value
FINISHED = ChildStatus.FINISHED.value

_MAX_IDS = 128
"""The most child ids one locking read names (SQLite, MySQL/MariaDB)."""

_document = json.JSONEncoder(check_circular=False, separators=(",", ":")).encode
"""The JSON text of a batch's rows (lists of ids, texts and ints: no cycle to look for), by
one encoder made once rather than one `json.dumps` builds per call (three per batch)."""

_ID_NAMES = tuple(f"id_{i}" for i in range(_MAX_IDS))
"""The parameter names of a locking read's ids, in order (`lock_ids`)."""

_IDENT = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
"""A `JSON_TABLE` column compared with an identifier column: its type and collation, so
the join looks the row up by its key (another collation would scan, and lock, the table)."""


def _json_table(name: str, *columns: str) -> str:
    """`JSON_TABLE` of the JSON array of arrays `:name`, each inner array a row of `columns`
    (`"name TYPE"`, in order), as `j` (MySQL 8, MariaDB 10.6+)."""
    listed = ", ".join(f"{c} PATH '$[{i}]'" for i, c in enumerate(columns))
    return f"JSON_TABLE(:{name}, '$[*]' COLUMNS({listed})) AS j"


_LOCKED = (
    C.c.id,
    C.c.child_execution_id,
    C.c.status,
    C.c.finished_attempt,
    C.c.finish_remaining,
    C.c.attempt,
    C.c.tenant_id,
    C.c.parent_execution_id,
)


def _padded(count: int) -> int:
    size = 1
    while size < count:
        size *= 2
    return size


class FinishManyStatements:
    """The batch finish's statements for one dialect: a fixed few whatever the batch's size
    (up to 128 children): with arrays on PostgreSQL, JSON documents on SQLite (`json_each`)
    and on MySQL/MariaDB (`JSON_TABLE`), after the children's locking read."""

    take_counts: Any
    finish_children: Any
    wake_waiting_parents: Any

    def __init__(self, b: SqlBuilder) -> None:
        self.ops = b.ops
        self.arrays = b.ops.NAME == "postgresql"
        self.documents = b.ops.NAME == "sqlite"
        self.json_tables = b.ops.NAME == "mysql"
        self._locks: dict[int, Any] = {}
        now = sa.bindparam("now", type_=sa.BigInteger)
        if self.documents:
            self._build_documents(now)
        if self.json_tables:
            self._build_json_tables()
        if not self.arrays:
            return
        text_array = postgresql.ARRAY(sa.Text())
        ids = sa.bindparam("ids", type_=text_array)
        self.lock_children = self.ops.for_update(
            sa.select(*_LOCKED).where(C.c.child_execution_id == sa.any_(ids)).order_by(C.c.id)
        )
        # The counts of the parents whose children finish, locked in one order (a
        # materialised, sorted locking read), each lowered by its finishes: one statement
        # answering each count as it was before.
        parents = (
            sa.func.unnest(
                sa.bindparam("tenants", type_=text_array),
                sa.bindparam("parents", type_=text_array),
            )
            .table_valued("t", "p")
            .render_derived()
        )
        of_batch = sa.tuple_(P.c.tenant_id, P.c.parent_execution_id).in_(
            sa.select(parents.c.t, parents.c.p)
        )
        locked = (
            self.ops.for_update(
                sa.select(P.c.tenant_id, P.c.parent_execution_id)
                .where(of_batch)
                .order_by(P.c.tenant_id, P.c.parent_execution_id)
            )
            .cte("locked")
            .prefix_with("MATERIALIZED", dialect="postgresql")
        )
        taken = (
            sa.func.unnest(
                sa.bindparam("tenants", type_=text_array),
                sa.bindparam("parents", type_=text_array),
                sa.bindparam("ns", type_=postgresql.ARRAY(sa.BigInteger())),
            )
            .table_valued("t", "p", "n")
            .render_derived()
        )
        # The counts of parents none of whose children finish here (every entry refused).
        self.read_counts = sa.select(P.c.tenant_id, P.c.parent_execution_id, P.c.unfinished).where(
            of_batch
        )
        # The counts lowered and the children finished in one statement: each child stores
        # its parent's count before the batch less its rank `k` among the parent's children
        # finishing here (1 for the first), so the count's lock is held for the commit only.
        counted = (
            sa.update(P)
            .where(
                P.c.tenant_id == locked.c.tenant_id,
                P.c.parent_execution_id == locked.c.parent_execution_id,
                P.c.tenant_id == taken.c.t,
                P.c.parent_execution_id == taken.c.p,
            )
            .values(unfinished=P.c.unfinished - taken.c.n)
            .returning(
                P.c.tenant_id.label("t"),
                P.c.parent_execution_id.label("p"),
                (P.c.unfinished + taken.c.n).label("before"),
            )
            .cte("counted")
        )
        ended = (
            sa.func.unnest(
                sa.bindparam("rows", type_=postgresql.ARRAY(sa.BigInteger())),
                sa.bindparam("outcomes", type_=text_array),
                sa.bindparam("attempts", type_=postgresql.ARRAY(sa.Integer())),
                sa.bindparam("ranks", type_=postgresql.ARRAY(sa.Integer())),
                sa.bindparam("of_tenants", type_=text_array),
                sa.bindparam("of_parents", type_=text_array),
            )
            .table_valued("r", "o", "a", "k", "t", "p")
            .render_derived()
        )
        self.count_and_finish = (
            sa.update(C)
            .where(C.c.id == ended.c.r, counted.c.t == ended.c.t, counted.c.p == ended.c.p)
            .values(
                status=sa.bindparam("finished"),
                outcome=ended.c.o,
                finished_at=now,
                finished_attempt=ended.c.a,
                finish_remaining=counted.c.before - ended.c.k,
            )
            .returning(counted.c.t, counted.c.p, counted.c.before)
        )
        woken = (
            sa.func.unnest(
                sa.bindparam("tenants", type_=text_array),
                sa.bindparam("parents", type_=text_array),
            )
            .table_valued("t", "p")
            .render_derived()
        )
        self.wake_waiting_parents = (
            sa.update(C)
            .where(
                C.c.tenant_id == woken.c.t,
                C.c.child_execution_id == woken.c.p,
                C.c.status == sa.bindparam("waiting"),
            )
            .values(status=sa.bindparam("queued"))
        )

    def _build_documents(self, now: Any) -> None:
        """SQLite: the counts, the children and the wakes of a batch each as one `UPDATE …
        FROM` a JSON document of its rows (`json_each`), not one statement per row."""

        def rows(name: str, *fields: str) -> Any:
            each = sa.func.json_each(sa.bindparam(name, type_=sa.Text())).table_valued("value")
            return sa.select(
                *(
                    sa.func.json_extract(each.c.value, f"$[{i}]").label(field)
                    for i, field in enumerate(fields)
                )
            ).subquery(name)

        taken = rows("counts", "t", "p", "n")
        self.take_counts = (
            sa.update(P)
            .where(P.c.tenant_id == taken.c.t, P.c.parent_execution_id == taken.c.p)
            .values(unfinished=P.c.unfinished - taken.c.n)
            .returning(P.c.tenant_id, P.c.parent_execution_id, P.c.unfinished)
        )
        ended = rows("ended", "r", "o", "a", "n")
        self.finish_children = (
            sa.update(C)
            .where(C.c.id == ended.c.r)
            .values(
                status=sa.bindparam("finished"),
                outcome=ended.c.o,
                finished_at=now,
                finished_attempt=ended.c.a,
                finish_remaining=ended.c.n,
            )
        )
        woken = rows("emptied", "t", "p")
        self.wake_waiting_parents = (
            sa.update(C)
            .where(
                C.c.tenant_id == woken.c.t,
                C.c.child_execution_id == woken.c.p,
                C.c.status == sa.bindparam("waiting"),
            )
            .values(status=sa.bindparam("queued"))
        )

    def _build_json_tables(self) -> None:
        """MySQL/MariaDB: the counts' locking read and update, the children's update and the
        wakes, each one statement joined to a `JSON_TABLE` of the batch's rows, not one
        statement per parent and per child."""
        counts = _json_table("counts", f"t {_IDENT}", f"p {_IDENT}", "n BIGINT")
        on_count = "p.tenant_id = j.t AND p.parent_execution_id = j.p"
        # STRAIGHT_JOIN: the rows are read, and so locked, in the document's order (sorted
        # by tenant and parent, the order every transaction of the queue locks counts in).
        self.lock_counts = sa.text(
            f"SELECT p.tenant_id, p.parent_execution_id, p.unfinished FROM {counts} "
            f"STRAIGHT_JOIN {P.name} AS p ON {on_count} FOR UPDATE"
        )
        self.take_counts = sa.text(
            f"UPDATE {P.name} AS p JOIN {counts} ON {on_count} "
            "SET p.unfinished = p.unfinished - j.n WHERE j.n > 0"
        )
        ended = _json_table(
            "ended",
            "r BIGINT",
            "o LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
            "a INT",
            "n INT",
        )
        self.finish_children = sa.text(
            f"UPDATE {C.name} AS c JOIN {ended} ON c.id = j.r "
            "SET c.status = :finished, c.outcome = j.o, c.finished_at = :now, "
            "c.finished_attempt = j.a, c.finish_remaining = j.n"
        )
        emptied = _json_table("emptied", f"t {_IDENT}", f"p {_IDENT}")
        self.wake_waiting_parents = sa.text(
            f"UPDATE {C.name} AS c JOIN {emptied} "
            "ON c.tenant_id = j.t AND c.child_execution_id = j.p "
            "SET c.status = :queued WHERE c.status = :waiting"
        )

    def lock_ids(self, size: int) -> Any:
        """The locking read of the rows of `size` children (padded `IN` list), by row id."""
        found = self._locks.get(size)
        if found is None:
            ids: list[Any] = [sa.bindparam(f"id_{i}") for i in range(size)]
            found = self._locks[size] = self.ops.for_update(
                sa.select(*_LOCKED).where(C.c.child_execution_id.in_(ids)).order_by(C.c.id)
            )
        return found


class FinishManyMethods:
    """`finish_many` of the SQL child queue (a base of `SqlChildExecutionQueueRepository`)."""

    if TYPE_CHECKING:
        connection: SqlConnection
        _sql: Any  # the queue's statements: `.finish_many`, `.parents`, `.batch`, ...

        @property
        def clock(self) -> Any: ...

    async def finish_many(self, finishes: Sequence[ChildFinish]) -> Sequence[FinishResult]:
        """In one transaction: lock the batch's children, then their parents' counts; finish
        each child running at its entry's attempt with its outcome, take the batch's
        finished children off each parent's count in one change, and store with each child
        the count it saw (as finishes one after another in the order given would). A
        superseded entry changes nothing (`finished=False`, its parent's count at its
        turn); a retry of an attempt's committed finish answers what it answered. The
        parents whose count reached 0 and that wait for their children are queued again."""
        batch = checked_child_finishes(finishes)
        if not batch:
            return []
        entries = [(f.child_execution_id, f.attempt, dumps(f.outcome)) for f in batch]
        now = self.clock.now()
        return await self.connection.run(lambda: self._finish_many(entries, now))

    def _finish_many(
        self, entries: list[tuple[str, int, str]], now: int
    ) -> Step[list[FinishResult]]:
        sql: FinishManyStatements = self._sql.finish_many
        parents: ParentCountStatements = self._sql.parents
        # 1. The children's rows, locked.
        ids = sorted(child_id for child_id, _, _ in entries)
        rows: dict[str, Any] = {}
        if sql.arrays:
            for row in (yield Exec(sql.lock_children, {"ids": ids})).rows:
                rows[row[1]] = row
        else:
            for at in range(0, len(ids), _MAX_IDS):
                part = ids[at : at + _MAX_IDS]
                size = _padded(len(part))
                padded = part + [part[-1]] * (size - len(part))
                params = dict(zip(_ID_NAMES[:size], padded, strict=True))
                for row in (yield Exec(sql.lock_ids(size), params)).rows:
                    rows[row[1]] = row
        # 2. Each entry decided on its row: answered (a retry), finishing, or refused.
        answers: list[FinishResult | None] = []
        finishing: list[tuple[int, Any, int, str]] = []  # (entry index, row, attempt, outcome)
        taken: dict[tuple[str, str], int] = {}
        of_parent: dict[int, tuple[str, str]] = {}
        for index, (child_id, attempt, outcome) in enumerate(entries):
            row = rows.get(child_id)
            if row is None:
                answers.append(FinishResult(False, 0))
                continue
            _id, _c, status, finished_attempt, answered, current, tenant_id, parent_id = row
            if (
                status == FINISHED
                and finished_attempt is not None
                and int(finished_attempt) == attempt
                and answered is not None
            ):
                # This attempt's finish already committed (its reply was lost).
                answers.append(FinishResult(True, int(answered)))
                continue
            parent = (tenant_id, parent_id)
            of_parent[index] = parent
            answers.append(None)
            if status == RUNNING and int(current) == attempt:
                finishing.append((index, row, attempt, outcome))
                taken[parent] = taken.get(parent, 0) + 1
            else:
                taken.setdefault(parent, 0)
        if not of_parent:
            return [a for a in answers if a is not None]
        # 3. The parents' counts, locked in one order, and the batch's finishes taken off
        # (on PostgreSQL with the finished children stored, in one statement).
        if sql.arrays:
            before = yield from self._count_and_finish(sql, finishing, taken, now)
        else:
            before = yield from self._take_counts(sql, parents, taken)
        # 4. Each entry's count at its turn; the finished children stored with theirs.
        seen: dict[tuple[str, str], int] = {}
        finished_rows: dict[int, tuple[Any, int, str]] = {
            index: (row, attempt, outcome) for index, row, attempt, outcome in finishing
        }
        stored: list[tuple[int, str, int, int]] = []  # (row id, outcome, attempt, remaining)
        for index, parent in of_parent.items():
            done = finished_rows.get(index)
            if done is None:
                answers[index] = FinishResult(False, before[parent] - seen.get(parent, 0))
                continue
            seen[parent] = seen.get(parent, 0) + 1
            remaining = before[parent] - seen[parent]
            row, attempt, outcome = done
            stored.append((int(row[0]), outcome, attempt, remaining))
            answers[index] = FinishResult(True, remaining)
        if stored and not sql.arrays:
            yield from self._store_finishes(sql, stored, now)
        emptied = sorted(p for p, n in taken.items() if n and before[p] - n == 0)
        if emptied:
            yield from self._wake_waiting(sql, emptied)
        return [a for a in answers if a is not None]

    def _count_and_finish(
        self,
        sql: FinishManyStatements,
        finishing: list[tuple[int, Any, int, str]],
        taken: dict[tuple[str, str], int],
        now: int,
    ) -> Step[dict[tuple[str, str], int]]:
        """PostgreSQL: lower the counts of the parents with finishes (locked in one order)
        and finish their children, in one statement; read the counts of the others. The
        counts before the batch."""
        before: dict[tuple[str, str], int] = {}
        order = sorted(taken)
        changed = [p for p in order if taken[p]]
        if finishing:
            ranks: dict[tuple[str, str], int] = {}
            rows, outcomes, attempts, ranked, tenants, parents = [], [], [], [], [], []
            for _index, row, attempt, outcome in finishing:
                parent = (row[6], row[7])
                ranks[parent] = ranks.get(parent, 0) + 1
                rows.append(int(row[0]))
                outcomes.append(outcome)
                attempts.append(attempt)
                ranked.append(ranks[parent])
                tenants.append(parent[0])
                parents.append(parent[1])
            params = {
                "tenants": [t for t, _ in changed],
                "parents": [p for _, p in changed],
                "ns": [taken[p] for p in changed],
                "rows": rows,
                "outcomes": outcomes,
                "attempts": attempts,
                "ranks": ranked,
                "of_tenants": tenants,
                "of_parents": parents,
                "finished": FINISHED,
                "now": now,
            }
            result = yield Exec(sql.count_and_finish, params)
            for tenant_id, parent_id, was in result.rows:
                before[(tenant_id, parent_id)] = int(was)
            for parent in changed:
                if parent not in before:
                    raise _missing(parent)  # nothing of the batch stays: the step rolls back
            if len(result.rows) != len(finishing):
                raise CorruptStoredRowError(
                    f"{len(result.rows)} of {len(finishing)} children locked by a batch "
                    "finish were finished"
                )
        unchanged = [p for p in order if not taken[p]]
        if unchanged:
            params = {"tenants": [t for t, _ in unchanged], "parents": [p for _, p in unchanged]}
            for tenant_id, parent_id, was in (yield Exec(sql.read_counts, params)).rows:
                before[(tenant_id, parent_id)] = int(was)
        for parent in order:
            before.setdefault(parent, 0)
        return before

    def _take_counts(
        self,
        sql: FinishManyStatements,
        parents: ParentCountStatements,
        taken: dict[tuple[str, str], int],
    ) -> Step[dict[tuple[str, str], int]]:
        """Lock the counts of the batch's parents (sorted), take each one's finishes off;
        the counts before the batch. A parent with finishes must have a count."""
        order = sorted(taken)
        before: dict[tuple[str, str], int] = {}
        if sql.json_tables:
            counts = {"counts": _document([[t, p, taken[(t, p)]] for t, p in order])}
            for tenant_id, parent_id, was in (yield Exec(sql.lock_counts, counts)).rows:
                before[(tenant_id, parent_id)] = int(was)
            for parent in order:
                if taken[parent] and parent not in before:
                    raise _missing(parent)  # nothing of the batch stays: the step rolls back
            if any(taken.values()):
                yield Exec(sql.take_counts, counts)
            return {parent: before.get(parent, 0) for parent in order}
        changed = [[t, p, taken[(t, p)]] for t, p in order if taken[(t, p)]]
        if changed:
            result = yield Exec(sql.take_counts, {"counts": _document(changed)})
            for tenant_id, parent_id, left in result.rows:
                before[(tenant_id, parent_id)] = int(left) + taken[(tenant_id, parent_id)]
        for parent in order:
            if parent in before:
                continue
            if taken[parent]:
                raise _missing(parent)
            of = {"tenant_id": parent[0], "parent_execution_id": parent[1]}
            before[parent] = yield from parents.unfinished(of)
        return before

    def _store_finishes(
        self, sql: FinishManyStatements, stored: list[tuple[int, str, int, int]], now: int
    ) -> Step[None]:
        ended = {"ended": _document(stored), "finished": FINISHED, "now": now}
        yield Exec(sql.finish_children, ended)

    def _wake_waiting(
        self, sql: FinishManyStatements, emptied: list[tuple[str, str]]
    ) -> Step[None]:
        """The emptied parents that wait for their children: claimable again."""
        woke = 0
        if sql.arrays:
            params = {
                "tenants": [t for t, _ in emptied],
                "parents": [p for _, p in emptied],
                "queued": QUEUED,
                "waiting": WAITING,
            }
            woke = (yield Exec(sql.wake_waiting_parents, params)).rowcount
        else:
            params = {"emptied": _document(emptied), "queued": QUEUED, "waiting": WAITING}
            woke = (yield Exec(sql.wake_waiting_parents, params)).rowcount
        if woke and self._sql.batch.notify is not None:
            yield Exec(self._sql.batch.notify, {})  # a parent is claimable again


def _missing(parent: tuple[str, str]) -> CorruptStoredRowError:
    return CorruptStoredRowError(
        f"no count of unfinished children for parent {parent[1]!r:.200} of tenant "
        f"{parent[0]!r:.200} though a child of it is running: children queued by a release "
        "before migration 0010 while it ran? (agboss-sql migrate)"
    )


__all__ = ["FinishManyMethods", "FinishManyStatements"]
