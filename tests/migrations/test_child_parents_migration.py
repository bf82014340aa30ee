"""Revision 0010_child_parents keeps each parent's count of unfinished children on a row of
its own: a queue migrated with children in flight (some finished, some running, queued or
waiting for children of their own, two tenants with equal parent ids) gets every parent's
count, and finishing the rest wakes each parent exactly once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from migration_support import connected, table_names
from support.capabilities import embedded_url, require

from agboss_sql.contracts import ApplicationContext, FinishResult
from agboss_sql.contracts.clocks import VirtualClock
from agboss_sql.contracts.errors import StoreTimeoutError
from agboss_sql.contracts.types import ChildStatus
from agboss_sql.sql import migrate
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.queue import SqlChildExecutionQueueRepository

pytestmark = pytest.mark.database

BEFORE = "0009_appended_values"

# (tenant, parent, child, depth, status, attempt): tenant "b" has a parent of the same id
# as tenant "a"'s; a-4 waits for children of its own; every child of "done" finished.
IN_FLIGHT = [
    ("a", "p", "a-1", 1, "finished", 1),
    ("a", "p", "a-2", 1, "running", 1),
    ("a", "p", "a-3", 1, "queued", 0),
    ("a", "p", "a-4", 1, "waiting", 1),
    ("a", "a-4", "a-4/x", 2, "running", 2),
    ("a", "a-4", "a-4/y", 2, "finished", 1),
    ("b", "p", "b-1", 1, "finished", 1),
    ("b", "p", "b-2", 1, "running", 1),
    ("a", "done", "d-1", 1, "finished", 1),
]


def _write_children(url: str) -> None:
    """The children as the queue stored them before the revision (finished ones with what
    their finish answered)."""
    rows: list[dict[str, Any]] = []
    for i, (tenant, parent, child, depth, status, attempt) in enumerate(IN_FLIGHT):
        finished = status == "finished"
        rows.append(
            {
                "tenant_id": tenant,
                "root_execution_id": "root",
                "parent_execution_id": parent,
                "child_execution_id": child,
                "depth": depth,
                "status": status,
                "attempt": attempt,
                "claimed_by": None if attempt == 0 else "old-worker",
                "queued_at": 1_000 + i,
                "finished_attempt": attempt if finished else None,
                "finish_remaining": 1 if finished else None,
                "outcome": '"done"' if finished else None,
            }
        )
    columns = ", ".join(rows[0])
    values = ", ".join(f":{name}" for name in rows[0])
    with connected(url) as connection, connection.begin():
        connection.execute(
            sa.text(f"INSERT INTO agboss_child_executions ({columns}) VALUES ({values})"), rows
        )


def _counts(url: str) -> dict[tuple[str, str], int]:
    with connected(url) as connection:
        rows = connection.execute(
            sa.text("SELECT tenant_id, parent_execution_id, unfinished FROM agboss_child_parents")
        )
        return {(tenant, parent): int(unfinished) for tenant, parent, unfinished in rows}


def test_a_queue_migrated_with_children_in_flight_wakes_each_parent_once(
    empty_url: str,
) -> None:
    migrate.upgrade(empty_url, BEFORE)
    _write_children(empty_url)

    migrate.upgrade(empty_url)

    assert _counts(empty_url) == {("a", "p"): 3, ("a", "a-4"): 1, ("b", "p"): 1, ("a", "done"): 0}

    async def finish_the_rest() -> list[tuple[str, FinishResult]]:
        connection = SqlConnection(empty_url)
        queue = SqlChildExecutionQueueRepository(
            connection, VirtualClock(10_000), ApplicationContext("new-worker")
        )
        finished: list[tuple[str, FinishResult]] = []
        try:
            for child, attempt in (("a-4/x", 2), ("a-2", 1), ("b-2", 1)):
                finished.append((child, await queue.finish(child, "new", attempt=attempt)))
            # The last finish of a-4's children made it claimable again, beside a-3.
            while (claimed := await queue.claim("new-worker")) is not None:
                result = await queue.finish(
                    claimed.child_execution_id, "new", attempt=claimed.attempt
                )
                finished.append((claimed.child_execution_id, result))
            # An old finished child's late finish changes nothing and counts what is left.
            assert await queue.finish("a-1", "late") == FinishResult(False, 0)
            listed = {c.child_execution_id: c for c in await queue.children("a", "p")}
            assert all(c.status is ChildStatus.FINISHED for c in listed.values())
            assert listed["a-1"].outcome == "done"
            owed = {c.child_execution_id for c in await queue.unwoken(10)}
        finally:
            await connection.close()
        last = {child for child, result in finished if result.remaining == 0}
        assert owed == last
        return finished

    finished = asyncio.run(finish_the_rest())
    assert all(result.finished for _, result in finished)
    assert sorted(child for child, _ in finished) == ["a-2", "a-3", "a-4", "a-4/x", "b-2"]
    woke = [child for child, result in finished if result.remaining == 0]
    # One wake per parent with children in flight: a-4 (by a-4/x), tenant a's p, tenant b's p.
    assert len(woke) == 3
    assert "a-4/x" in woke and "b-2" in woke
    assert {"a-3", "a-4"} & set(woke)
    assert _counts(empty_url) == {("a", "p"): 0, ("a", "a-4"): 0, ("b", "p"): 0, ("a", "done"): 0}


def test_the_downgrade_drops_the_counts_and_the_upgrade_counts_again(empty_url: str) -> None:
    migrate.upgrade(empty_url, BEFORE)
    _write_children(empty_url)
    migrate.upgrade(empty_url)
    migrate.downgrade(empty_url, BEFORE)
    assert "agboss_child_parents" not in table_names(empty_url)
    migrate.upgrade(empty_url)
    assert _counts(empty_url)[("a", "p")] == 3


def _as_a_stopped_upgrade_leaves_it(url: str, *, emptied: bool) -> None:
    """The state an upgrade stopped at the fill leaves on MySQL/MariaDB (DDL commits as it
    runs; the fill waited past `lock_ms` on a child's row): the table created, the revision
    still 0009. Made so on every database: upgraded, the counts (`emptied`) deleted, the
    revision set back."""
    migrate.upgrade(url, "0010_child_parents")
    if emptied:
        with connected(url) as connection, connection.begin():
            connection.execute(sa.text("DELETE FROM agboss_child_parents"))
    migrate.stamp(url, BEFORE, force=True)


def test_an_upgrade_stopped_at_the_fill_is_finished_by_the_next(empty_url: str) -> None:
    migrate.upgrade(empty_url, BEFORE)
    _write_children(empty_url)
    _as_a_stopped_upgrade_leaves_it(empty_url, emptied=True)
    assert _counts(empty_url) == {}

    done = migrate.upgrade(empty_url)

    assert (done.before, done.after) == (BEFORE, migrate.head())
    assert _counts(empty_url) == {("a", "p"): 3, ("a", "a-4"): 1, ("b", "p"): 1, ("a", "done"): 0}


def test_a_counts_table_with_rows_at_0009_is_refused(empty_url: str) -> None:
    migrate.upgrade(empty_url, BEFORE)
    _write_children(empty_url)
    _as_a_stopped_upgrade_leaves_it(empty_url, emptied=False)

    with pytest.raises(RuntimeError, match="already exists with rows"):
        migrate.upgrade(empty_url)

    assert migrate.current(empty_url) == BEFORE
    assert _counts(empty_url) == {("a", "p"): 3, ("a", "a-4"): 1, ("b", "p"): 1, ("a", "done"): 0}


def test_a_fill_held_up_by_a_workers_row_lock_stops_and_the_next_upgrade_completes_it(
    empty_url: str,
) -> None:
    """The real stop: a worker's transaction holds a child's row locked. Where the fill's
    read waits for it (MySQL/MariaDB: `INSERT … SELECT` locks what it reads), the upgrade
    stops at `lock_ms` with the table made and empty; where it does not (PostgreSQL reads a
    snapshot), it runs through. Either way, once the worker's transaction ends, an upgrade
    leaves every count right."""
    require(not embedded_url(empty_url), "row locks a reader could wait on (SQLite has one writer)")
    migrate.upgrade(empty_url, BEFORE)
    _write_children(empty_url)
    with connected(empty_url) as worker:
        worker.execute(
            sa.text(
                "UPDATE agboss_child_executions SET attempt = attempt "
                "WHERE child_execution_id = 'a-2'"
            )
        )
        try:
            migrate.upgrade(empty_url, lock_ms=1_000)
        except StoreTimeoutError as stopped:
            assert stopped.what == "lock"
            assert migrate.current(empty_url) == BEFORE
            assert "agboss_child_parents" in table_names(empty_url)
            assert _counts(empty_url) == {}
        worker.rollback()
    migrate.upgrade(empty_url, lock_ms=1_000)
    assert migrate.current(empty_url) == migrate.head()
    assert _counts(empty_url) == {("a", "p"): 3, ("a", "a-4"): 1, ("b", "p"): 1, ("a", "done"): 0}
