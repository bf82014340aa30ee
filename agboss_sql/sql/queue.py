"""`SqlChildExecutionQueueRepository`: children on any instance, claimed and finished once.

A claim picks the next queued child (`ORDER BY depth DESC, queued_at, id`) and marks
it running in one step: where the dialect has `UPDATE … RETURNING` (PostgreSQL,
SQLite) that is one statement, `UPDATE … WHERE id = (SELECT id … LIMIT 1 FOR UPDATE
SKIP LOCKED) RETURNING …` (SQLite drops the lock clause: one statement is atomic there,
the connection serialising writers); elsewhere (MySQL/MariaDB) one transaction,
`SELECT … LIMIT 1 FOR UPDATE SKIP LOCKED`, then the `UPDATE` of that locked row. The
index on `(status, depth DESC, queued_at, id)` lets the locking read stop at the first
unlocked row.

Each parent keeps, on one row of its own (`agboss_child_parents`, `_child_parents`), how
many of its children are not finished: an enqueue adds one, a finish takes one off, in
their transactions. A finish locks its child's row, then that count (`UPDATE … RETURNING`,
or a locking read and the update), so concurrent finishers of one parent's children run one
after the other, each seeing the others' finishes: exactly one sees none left, and a finish
sends the same statements with 3 siblings or 300,000. On a Galera cluster locks hold on
one node only, but every finisher of the parent writes the count's row: of two finishes on
different nodes that did not see each other the later fails certification and runs again,
seeing the other. For the same reason `SKIP LOCKED` passes over only the node's own
locks: a claim run again after a certification conflict starts a few rows past the head
(at random, up to `_MAX_CLAIM_SPREAD`), so claimers on different nodes spread out. The decision is taken from that locking read (on
MySQL/MariaDB REPEATABLE READ a locking read sees the latest committed rows; on
PostgreSQL READ COMMITTED it returns the latest version of any row it had to wait for).

Statements per operation (BEGIN/COMMIT not counted):

| operation | PostgreSQL, SQLite | MySQL/MariaDB |
|---|---|---|
| `enqueue` | 2 in a transaction (1 when refused) | the same |
| `running`, `children` | 1 | 1 |
| `claim` | 1 | 2 in a transaction (1 when the queue is empty) |
| `restart` | 1 | 2 in a transaction (1 when refused) |
| `finish` | 3 in a transaction (1 when a retry, 2 when refused; 4 when none is left: the wake of a waiting parent) | 4 (5 when none is left) |
| `wait_for_children` | 3 in a transaction (2 when it does not wait) | the same (+1 on Galera) |
| `unwoken` | 1 | 1 |
| `claim_wake`, `mark_woken` | 1 (2 when refused: a read tells a retry) | the same |

A child whose own children run waits without its lease: `wait_for_children` locks the
count of its children (as their finishers do), then its row, and moves it `running ->
waiting` while one of them is unfinished; the finish that sees none left moves the waiting
parent back to `queued` in its own transaction, so no wake of a waiting child is ever lost
(every transaction locks a child, then its parent's count, then the parent: no lock
cycle). `claim` and `running` see only `queued` and `running` rows, so neither a claimer
nor the rescue takes a waiting child.

A finish stores what it answered (`finish_remaining`): a retry of the same attempt's
finish, after a lost reply, answers it again. The finish that saw none left owes the
parent's wake: `claim_wake` claims it by compare-and-set (with a claim that runs out on the
application clock, so a claimer that died is replaced), `mark_woken` records it done.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from agboss_sql._dialects import Dialect
from agboss_sql.contracts.errors import DuplicateChildError, StoreTimeoutError
from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import (
    checked_count,
    checked_int32,
    checked_positive_ms,
    checked_queued_child,
)
from agboss_sql.contracts.stores import ChildExecutionQueueRepository
from agboss_sql.contracts.types import (
    ChildExecution,
    ChildStatus,
    ClaimedChild,
    FinishResult,
    JsonValue,
    QueuedChild,
    WaitResult,
)
from agboss_sql.sql._base import ApplicationClockStore, dumps
from agboss_sql.sql._child_parents import ParentCountStatements
from agboss_sql.sql._queue_batch import BatchQueueMethods, BatchStatements
from agboss_sql.sql._queue_finish_many import FinishManyMethods, FinishManyStatements
from agboss_sql.sql._queue_rows import CLAIMED, LISTED, claimed_of, columns, listed_of
from agboss_sql.sql._queue_wakeups import NotifiedWakeups
from agboss_sql.sql.connection import Exec, SqlBuilder, Step
from agboss_sql.sql.schema import child_executions

C = child_executions

QUEUED = ChildStatus.QUEUED.value
RUNNING = ChildStatus.RUNNING.value
WAITING = ChildStatus.WAITING.value
FINISHED = ChildStatus.FINISHED.value

_MAX_CLAIM_SPREAD = 32
"""How many rows past the head of the queue a claim run again after a certification
conflict may start (Galera)."""


class QueueStatements:
    """The child queue's statements for one dialect."""

    def __init__(self, b: SqlBuilder) -> None:
        self.update_returning: bool = b.capabilities.update_returning
        self.parents = ParentCountStatements(b.ops, self.update_returning)
        self.batch = BatchStatements(b)
        self.finish_many = FinishManyStatements(b)
        self._build_enqueue_and_lists(b.ops)
        self._build_claims(b.ops)
        self._build_restarts()
        self._build_finishes(b.ops)
        self._build_waits(b.ops)
        self._build_wakes()

    def _build_enqueue_and_lists(self, ops: Dialect) -> None:
        """Enqueue a child; list the running children and a parent's children."""
        now = sa.bindparam("now", type_=sa.BigInteger)
        self.enqueue = ops.insert_if_absent(C, ["child_execution_id"]).values(
            tenant_id=sa.bindparam("tenant_id"),
            root_execution_id=sa.bindparam("root_execution_id"),
            parent_execution_id=sa.bindparam("parent_execution_id"),
            child_execution_id=sa.bindparam("child_execution_id"),
            depth=sa.bindparam("depth", type_=sa.Integer),
            payload=sa.bindparam("payload"),
            status=sa.bindparam("queued"),
            attempt=sa.literal(0, sa.Integer),
            queued_at=now,
        )

        self.running = (
            sa.select(*columns(LISTED))
            .where(C.c.status == sa.bindparam("running"))
            .order_by(C.c.queued_at, C.c.id)
            .limit(sa.bindparam("limit", type_=sa.Integer))
        )

        self.children = (
            sa.select(*columns(LISTED))
            .where(
                C.c.parent_execution_id == sa.bindparam("parent_execution_id"),
                C.c.tenant_id == sa.bindparam("tenant_id"),
            )
            .order_by(C.c.id)
        )

    def _build_claims(self, ops: Dialect) -> None:
        """Claim the next queued child: one statement, or (without `UPDATE … RETURNING`) a
        locking read and an update."""
        now = sa.bindparam("now", type_=sa.BigInteger)
        next_queued = (
            sa.select(C.c.id)
            .where(C.c.status == sa.bindparam("queued"))
            .order_by(C.c.depth.desc(), C.c.queued_at, C.c.id)
            .limit(1)
        )
        claim_values = {
            "status": sa.bindparam("running"),
            "claimed_by": sa.bindparam("instance_id"),
            "attempt": C.c.attempt + 1,
            "claimed_at": now,
        }
        # One statement: the subquery locks the row it picks, skipping rows other claimers
        # hold (SQLite has no row locks and drops the clause: the statement is atomic).
        self.claim = (
            sa.update(C)
            .where(
                C.c.id == ops.skip_locked(next_queued).scalar_subquery(),
                C.c.status == sa.bindparam("queued"),
            )
            .values(claim_values)
            .returning(*columns(CLAIMED))
        )
        # Without UPDATE … RETURNING: lock the next row, then move it (a transaction).
        next_row = (
            sa.select(C.c.id, *columns(CLAIMED))
            .where(C.c.status == sa.bindparam("queued"))
            .order_by(C.c.depth.desc(), C.c.queued_at, C.c.id)
            .limit(1)
        )
        self.lock_next = ops.skip_locked(next_row)
        # On a cluster that certifies write sets, `SKIP LOCKED` skips only this node's
        # locks: claimers on different nodes pick the same first row and all but one fail
        # certification. A claim run again after such a conflict starts a few rows further
        # (`skip`), so the claimers spread over the head of the queue instead of meeting
        # on its first row at every attempt.
        self.lock_next_after = ops.skip_locked(
            next_row.offset(sa.bindparam("skip", type_=sa.Integer))
        )
        self.claim_locked = (
            sa.update(C)
            .where(C.c.id == sa.bindparam("id"), C.c.status == sa.bindparam("queued"))
            .values(claim_values)
        )

    def _build_restarts(self) -> None:
        """Restart a running child's attempt; read what a claim answered."""
        now = sa.bindparam("now", type_=sa.BigInteger)
        restart = (
            sa.update(C)
            .where(
                C.c.child_execution_id == sa.bindparam("child_execution_id"),
                C.c.status == sa.bindparam("running"),
                C.c.attempt == sa.bindparam("attempt", type_=sa.Integer),
            )
            .values(
                attempt=C.c.attempt + 1,
                claimed_by=sa.bindparam("instance_id"),
                claimed_at=now,
            )
        )
        self.restart_returning = restart.returning(*columns(CLAIMED))
        self.restart = restart
        self.read_claimed = sa.select(*columns(CLAIMED)).where(
            C.c.child_execution_id == sa.bindparam("child_execution_id")
        )

    def _build_finishes(self, ops: Dialect) -> None:
        """Finish a child: its row locked, then finished, and the waiting parent woken."""
        now = sa.bindparam("now", type_=sa.BigInteger)
        self.lock_finishing = ops.for_update(
            sa.select(
                C.c.id,
                C.c.status,
                C.c.finished_attempt,
                C.c.finish_remaining,
                C.c.attempt,
                C.c.tenant_id,
                C.c.parent_execution_id,
            ).where(C.c.child_execution_id == sa.bindparam("child_execution_id"))
        )
        self.finish_locked = (
            sa.update(C)
            .where(C.c.id == sa.bindparam("id"))
            .values(
                status=sa.bindparam("finished"),
                outcome=sa.bindparam("outcome"),
                finished_at=now,
                finished_attempt=sa.bindparam("attempt", type_=sa.Integer),
                finish_remaining=sa.bindparam("remaining", type_=sa.Integer),
            )
        )

        # The finish that saw none left: the parent, when it is a child waiting for its
        # children, is claimable again (in the finish's transaction, after the count's lock:
        # every transaction here locks a child, its parent's count, then the parent).
        self.wake_waiting_parent = (
            sa.update(C)
            .where(
                C.c.child_execution_id == sa.bindparam("parent_execution_id"),
                C.c.tenant_id == sa.bindparam("tenant_id"),
                C.c.status == sa.bindparam("waiting"),
            )
            .values(status=sa.bindparam("queued"))
        )

    def _build_waits(self, ops: Dialect) -> None:
        """A parent waits for its children: their count locked, then its row, then moved."""
        self.lock_me = ops.for_update(
            sa.select(C.c.id, C.c.status, C.c.attempt).where(
                C.c.child_execution_id == sa.bindparam("child_execution_id")
            )
        )
        self.wait_locked = (
            sa.update(C)
            .where(
                C.c.id == sa.bindparam("id"),
                C.c.status == sa.bindparam("running"),
                C.c.attempt == sa.bindparam("attempt", type_=sa.Integer),
            )
            .values(status=sa.bindparam("waiting"))
        )

    def _build_wakes(self) -> None:
        """The wakes a finish owes a parent: listed, claimed, marked done, read."""
        now = sa.bindparam("now", type_=sa.BigInteger)
        the_child = C.c.child_execution_id == sa.bindparam("child_execution_id")
        owes_wake = sa.and_(C.c.finish_remaining == 0, C.c.parent_woken_at.is_(None))
        claim_free = sa.or_(C.c.wake_claimed_until.is_(None), C.c.wake_claimed_until <= now)
        self.unwoken = (
            sa.select(*columns(LISTED))
            .where(owes_wake, claim_free)
            .order_by(C.c.finished_at, C.c.id)
            .limit(sa.bindparam("limit", type_=sa.Integer))
        )
        self.claim_wake = (
            sa.update(C)
            .where(the_child, owes_wake, claim_free)
            .values(
                wake_claimed_by=sa.bindparam("claimer"),
                wake_claimed_until=sa.bindparam("until", type_=sa.BigInteger),
            )
        )
        self.mark_woken = (
            sa.update(C)
            .where(the_child, owes_wake, C.c.wake_claimed_by == sa.bindparam("claimer"))
            .values(parent_woken_at=now)
        )
        self.read_wake = sa.select(
            C.c.finish_remaining, C.c.wake_claimed_by, C.c.parent_woken_at
        ).where(the_child)


_STATUS_PARAMS = {"queued": QUEUED, "running": RUNNING, "finished": FINISHED}
_WAIT_PARAMS = {"queued": QUEUED, "running": RUNNING, "waiting": WAITING}


class SqlChildExecutionQueueRepository(
    ApplicationClockStore[QueueStatements],
    BatchQueueMethods,
    FinishManyMethods,
    ChildExecutionQueueRepository,
):
    """The child queue on SQL, on the application's clock: a child is claimed by one
    claimer, restarted by compare-and-set on its attempt, finished once (by its current
    attempt when one is given), and exactly one finisher of a parent's children sees none
    left."""

    statements = QueueStatements
    finish_many = FinishManyMethods.finish_many  # beside `finish`: see runtime._child_finishes

    async def enqueue(self, child: QueuedChild) -> None:
        """Queue the child (status queued, attempt 0, queued at the application clock's
        now) and add one to its parent's count of unfinished children, in one transaction;
        a child id already queued is `DuplicateChildError` (nothing changed)."""
        checked_queued_child(child)
        params = {
            "tenant_id": child.tenant_id,
            "root_execution_id": child.root_execution_id,
            "parent_execution_id": child.parent_execution_id,
            "child_execution_id": child.child_execution_id,
            "depth": child.depth,
            "payload": dumps(child.payload),
            "queued": QUEUED,
            "now": self.clock.now(),
        }
        try:
            inserted = await self.connection.run(lambda: self._enqueue(params))
        except Exception as exc:
            # MySQL's insert of a duplicate raises (the transaction rolled back).
            connection = self.connection
            if not (
                connection.capabilities.insert_if_absent_raises
                and connection.ops.is_unique_violation(exc)
            ):
                raise
            inserted = False
        if not inserted:
            raise DuplicateChildError(
                f"child {child.child_execution_id!r} is already queued: a child id is unique"
            )

    def _enqueue(self, params: dict[str, Any]) -> Step[bool]:
        if (yield Exec(self._sql.enqueue, params)).rowcount != 1:
            return False
        yield Exec(self._sql.parents.count_child, params)
        if self._sql.batch.notify is not None:
            yield Exec(self._sql.batch.notify, {})  # sent to listeners at the commit
        return True

    def wakeups(self) -> NotifiedWakeups | None:
        """A listener on this database's notifications of children queued (one connection
        of its own, opened at its first wait), where a session can listen; else `None`."""
        return NotifiedWakeups.of(self.connection)

    async def claim(self, instance_id: str) -> ClaimedChild | None:
        """Take the next queued child (deepest first, then oldest, then in queue order) and
        mark it running for `instance_id` at `attempt + 1`, in one atomic step; `None` when
        no queued child is free. Two claimers never get one child."""
        checked_identifier("instance_id", instance_id)
        params = {**_STATUS_PARAMS, "instance_id": instance_id, "now": self.clock.now()}
        if self._sql.update_returning:
            row = (await self.connection.execute(self._sql.claim, params)).first()
            return None if row is None else claimed_of(row)
        attempts = itertools.count()
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.connection.timeouts.retry_ms / 1000
        while True:
            try:
                return await self.connection.run(lambda: self._claim_locked(params, next(attempts)))
            except StoreTimeoutError as exc:
                # On a cluster that certifies write sets claimers on other nodes keep
                # taking the rows this one picked: a claim (nothing of it applied) goes on
                # for the whole `Timeouts.retry_ms`, past the connection's attempt count.
                if not (
                    exc.what == "retry"
                    and self.connection.capabilities.certified_writes
                    and loop.time() < give_up_at
                ):
                    raise

    def _claim_locked(self, params: dict[str, Any], attempt: int) -> Step[ClaimedChild | None]:
        row = None
        if attempt and self.connection.capabilities.certified_writes:
            skip = random.randrange(min(4 * attempt, _MAX_CLAIM_SPREAD) + 1)
            if skip:
                row = (yield Exec(self._sql.lock_next_after, {**params, "skip": skip})).first()
        if row is None:
            row = (yield Exec(self._sql.lock_next, params)).first()
        if row is None:
            return None
        moved = yield Exec(self._sql.claim_locked, {**params, "id": row[0]})
        if moved.rowcount != 1:
            return None  # not reachable while the row is locked by this transaction
        claimed = claimed_of(row[1:])
        return ClaimedChild(
            tenant_id=claimed.tenant_id,
            root_execution_id=claimed.root_execution_id,
            parent_execution_id=claimed.parent_execution_id,
            child_execution_id=claimed.child_execution_id,
            depth=claimed.depth,
            payload=claimed.payload,
            attempt=claimed.attempt + 1,
            claimed_by=params["instance_id"],
        )

    async def running(self, limit: int) -> Sequence[ChildExecution]:
        """Up to `limit` running children, oldest queued first."""
        checked_count("limit", limit)
        if limit == 0:
            return []
        result = await self.connection.execute(
            self._sql.running, {"running": RUNNING, "limit": limit}
        )
        return [listed_of(row) for row in result.rows]

    async def restart(self, child_execution_id: str, attempt: int) -> ClaimedChild | None:
        """For a running child still at `attempt`: this store's instance becomes its claimer
        at `attempt + 1` (compare-and-set). The claimed child, or `None`."""
        checked_identifier("child_execution_id", child_execution_id)
        checked_int32("attempt", attempt)
        params = {
            "child_execution_id": child_execution_id,
            "attempt": attempt,
            "running": RUNNING,
            "instance_id": self.application.instance_id,
            "now": self.clock.now(),
        }
        if self._sql.update_returning:
            row = (await self.connection.execute(self._sql.restart_returning, params)).first()
            return None if row is None else claimed_of(row)
        return await self.connection.run(lambda: self._restart_then_read(params))

    def _restart_then_read(self, params: dict[str, Any]) -> Step[ClaimedChild | None]:
        if (yield Exec(self._sql.restart, params)).rowcount != 1:
            return None
        # The row is locked by the update above: this reads what it wrote.
        row = (yield Exec(self._sql.read_claimed, params)).first()
        return None if row is None else claimed_of(row)

    async def finish(
        self, child_execution_id: str, outcome: JsonValue, *, attempt: int | None = None
    ) -> FinishResult:
        """In one transaction that locks the child's row, then its parent's count of
        unfinished children: move the child running -> finished with `outcome` (only at
        `attempt` when given) and take one off the count, whose rest it answers; the same
        statements whatever the number of siblings. Exactly one finisher of the parent's
        last children sees `remaining == 0`; a refused finish changes nothing and answers
        `finished=False` with the count. Given `attempt`, a retry of that attempt's
        committed finish answers what it answered (`finished=True`, the stored `remaining`)
        and changes nothing."""
        checked_identifier("child_execution_id", child_execution_id)
        if attempt is not None:
            checked_int32("attempt", attempt)
        params = {
            "child_execution_id": child_execution_id,
            "outcome": dumps(outcome),
            "finished": FINISHED,
            "now": self.clock.now(),
        }
        return await self.connection.run(lambda: self._finish(params, attempt))

    def _finish(self, params: dict[str, Any], attempt: int | None) -> Step[FinishResult]:
        me = (yield Exec(self._sql.lock_finishing, params)).first()
        if me is None:
            return FinishResult(False, 0)
        row_id, status, finished_attempt, answered, current_attempt, tenant_id, parent_id = me
        if (
            status == FINISHED
            and attempt is not None
            and finished_attempt is not None
            and int(finished_attempt) == attempt
            and answered is not None
        ):
            # This attempt's finish already committed (its reply was lost): answer the same.
            return FinishResult(True, int(answered))
        parents = self._sql.parents
        parent = {"tenant_id": tenant_id, "parent_execution_id": parent_id}
        if status != RUNNING or (attempt is not None and int(current_attempt) != attempt):
            return FinishResult(False, (yield from parents.unfinished(parent)))
        remaining = yield from parents.take_one_off(parent)
        finish = {**params, "id": row_id, "attempt": attempt, "remaining": remaining}
        yield Exec(self._sql.finish_locked, finish)
        if remaining == 0:
            woke = yield Exec(self._sql.wake_waiting_parent, {**_WAIT_PARAMS, **parent})
            if woke.rowcount == 1 and self._sql.batch.notify is not None:
                yield Exec(self._sql.batch.notify, {})  # the parent is claimable again
        return FinishResult(True, remaining)

    async def wait_for_children(
        self, child_execution_id: str, *, attempt: int
    ) -> WaitResult | None:
        """In one transaction that first locks the count of the child's unfinished children
        (as their finishers do), then the child's row: move the child running -> waiting at
        `attempt` while a child of it is unfinished, or answer `WaitResult(False, 0)` when
        none is (it stays running). A retry of this attempt's wait answers `WaitResult(True,
        …)` while the entry waits or was woken and not claimed since; `None` when the child
        is not running at `attempt`."""
        checked_identifier("child_execution_id", child_execution_id)
        checked_int32("attempt", attempt)
        params = {**_WAIT_PARAMS, "child_execution_id": child_execution_id, "attempt": attempt}
        return await self.connection.run(lambda: self._wait(params))

    def _wait(self, params: dict[str, Any]) -> Step[WaitResult | None]:
        parents = self._sql.parents
        count = (yield Exec(parents.lock_own, params)).first()
        me = (yield Exec(self._sql.lock_me, params)).first()
        attempt = params["attempt"]
        if me is None or int(me[2]) != attempt:
            return None
        remaining = 0 if count is None else int(count[0])
        if me[1] in (WAITING, QUEUED) and attempt > 0:
            return WaitResult(True, remaining)  # this attempt's wait already committed
        if me[1] != RUNNING:
            return None
        if remaining == 0:
            return WaitResult(False, 0)
        yield Exec(self._sql.wait_locked, {**params, "id": me[0]})
        if self.connection.capabilities.certified_writes:
            # A finish of a child on another node that this wait did not see writes the
            # same row, and one of the two runs again.
            yield Exec(parents.count_wait, params)
        return WaitResult(True, remaining)

    async def unwoken(self, limit: int) -> Sequence[ChildExecution]:
        """Up to `limit` finished children whose finish saw none left and whose parent's
        wake is neither done nor under a live claim, oldest finish first (one statement)."""
        checked_count("limit", limit)
        if limit == 0:
            return []
        result = await self.connection.execute(
            self._sql.unwoken, {"limit": limit, "now": self.clock.now()}
        )
        return [listed_of(row) for row in result.rows]

    async def claim_wake(self, child_execution_id: str, claimer: str, claim_ms: int) -> bool:
        """Claim the parent's wake owed by the child for `claimer` until `now + claim_ms`,
        in one conditional update that needs the wake not done and its claim free or run
        out: of concurrent claimers exactly one wins. When the update moved nothing, a read
        of the (then settled) claim tells a retry by the same claimer (True) from a loser."""
        checked_identifier("child_execution_id", child_execution_id)
        checked_identifier("claimer", claimer)
        checked_positive_ms("claim_ms", claim_ms)
        now = self.clock.now()
        params = {
            "child_execution_id": child_execution_id,
            "claimer": claimer,
            "now": now,
            "until": now + claim_ms,
        }
        if (await self.connection.execute(self._sql.claim_wake, params)).rowcount == 1:
            return True
        row = (await self.connection.execute(self._sql.read_wake, params)).first()
        return row is not None and row[0] == 0 and row[2] is None and row[1] == claimer

    async def mark_woken(self, child_execution_id: str, claimer: str) -> bool:
        """Record the parent's wake as done, in one conditional update that needs `claimer`
        to hold the wake's claim; when it moved nothing, True only if the wake is already
        done by `claimer` (a retry)."""
        checked_identifier("child_execution_id", child_execution_id)
        checked_identifier("claimer", claimer)
        params = {
            "child_execution_id": child_execution_id,
            "claimer": claimer,
            "now": self.clock.now(),
        }
        if (await self.connection.execute(self._sql.mark_woken, params)).rowcount == 1:
            return True
        row = (await self.connection.execute(self._sql.read_wake, params)).first()
        return row is not None and row[0] == 0 and row[2] is not None and row[1] == claimer

    async def children(self, tenant_id: str, parent_execution_id: str) -> Sequence[ChildExecution]:
        """The tenant's parent's children, in the order they were queued (one statement on
        tenant and parent)."""
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("parent_execution_id", parent_execution_id)
        result = await self.connection.execute(
            self._sql.children,
            {"tenant_id": tenant_id, "parent_execution_id": parent_execution_id},
        )
        return [listed_of(row) for row in result.rows]


__all__ = ["QueueStatements", "SqlChildExecutionQueueRepository"]
