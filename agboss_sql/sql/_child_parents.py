"""The child queue's count of unfinished children per parent (`agboss_child_parents`).

One row per (tenant, parent) that has had a child queued holds how many of its children
are not finished. An enqueue adds one in the transaction that inserts the child; a finish
takes one off in the transaction that finishes the child and answers what is left; a wait
for a child's children reads (and locks) the child's own row here. Every finisher of a
parent's children therefore locks this one row, not the siblings: a finish costs the same
statements whatever the number of siblings, and concurrent finishers of one parent run one
after the other, each seeing the others' finishes, so exactly one sees none left.

Locks are taken from the deepest level up (a child's row, then its parent's count, then
the parent's row), as every transaction of the queue takes them: no lock cycle.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from agboss_sql._dialects import Dialect
from agboss_sql.contracts.errors import CorruptStoredRowError
from agboss_sql.sql.connection import Exec, Step
from agboss_sql.sql.schema import child_executions, child_parents

C = child_executions
P = child_parents


class ParentCountStatements:
    """The statements on a parent's count, for one dialect. Parameters: `tenant_id` and
    `parent_execution_id` name the parent (`lock_own` and `count_wait`: the tenant of the
    child `child_execution_id`, which is the parent)."""

    def __init__(self, ops: Dialect, update_returning: bool) -> None:
        self.update_returning = update_returning
        of_parent = (
            P.c.tenant_id == sa.bindparam("tenant_id"),
            P.c.parent_execution_id == sa.bindparam("parent_execution_id"),
        )
        # One statement that creates the parent's row at 1 or adds one to it, locking it.
        self.count_child = ops.upsert(
            P,
            ["tenant_id", "parent_execution_id"],
            {
                "tenant_id": sa.bindparam("tenant_id"),
                "parent_execution_id": sa.bindparam("parent_execution_id"),
                "unfinished": sa.literal(1, sa.BigInteger),
                "waits": sa.literal(0, sa.BigInteger),
            },
            lambda new: {"unfinished": P.c.unfinished + 1},
        )
        # The same for a batch: `n` children of the parent queued in one transaction.
        self.count_children = ops.upsert(
            P,
            ["tenant_id", "parent_execution_id"],
            {
                "tenant_id": sa.bindparam("tenant_id"),
                "parent_execution_id": sa.bindparam("parent_execution_id"),
                "unfinished": sa.bindparam("n", type_=sa.BigInteger),
                "waits": sa.literal(0, sa.BigInteger),
            },
            lambda new: {"unfinished": P.c.unfinished + new.unfinished},
        )
        self.read = sa.select(P.c.unfinished).where(*of_parent)
        self.lock = ops.for_update(self.read)
        take_one = sa.update(P).where(*of_parent).values(unfinished=P.c.unfinished - 1)
        self.take_one = take_one
        self.take_one_returning = take_one.returning(P.c.unfinished)
        # A batch finish: `n` of the parent's children finished in one transaction.
        take_n = (
            sa.update(P)
            .where(*of_parent)
            .values(unfinished=P.c.unfinished - sa.bindparam("n", type_=sa.BigInteger))
        )
        self.take_n = take_n
        self.take_n_returning = take_n.returning(P.c.unfinished)

        # The count of a child's own children: the tenant by value from the child's row (a
        # plain read of a column that never changes: it locks nothing).
        me = C.alias("me")
        of_child = me.c.child_execution_id == sa.bindparam("child_execution_id")
        of_own = (
            P.c.tenant_id == sa.select(me.c.tenant_id).where(of_child).scalar_subquery(),
            P.c.parent_execution_id == sa.bindparam("child_execution_id"),
        )
        self.lock_own = ops.for_update(sa.select(P.c.unfinished).where(*of_own))
        # On a cluster that certifies write sets row locks hold on one node only: a wait
        # writes the row every finisher of its children writes, so a wait and a finish that
        # did not see each other conflict at certification and the later runs again.
        self.count_wait = sa.update(P).where(*of_own).values(waits=P.c.waits + 1)

    def take_one_off(self, parent: dict[str, Any]) -> Step[int]:
        """Take one off the parent's count (its row locked until the transaction ends) and
        answer what is left: one `UPDATE … RETURNING`, or a locking read and the update."""
        if self.update_returning:
            row = (yield Exec(self.take_one_returning, parent)).first()
            if row is None:
                raise _missing(parent)
            return int(row[0])
        row = (yield Exec(self.lock, parent)).first()
        if row is None:
            raise _missing(parent)
        yield Exec(self.take_one, parent)
        return int(row[0]) - 1

    def unfinished(self, parent: dict[str, Any]) -> Step[int]:
        """The parent's count as last committed (0 when it has none)."""
        row = (yield Exec(self.read, parent)).first()
        return 0 if row is None else int(row[0])


def _missing(parent: dict[str, Any]) -> CorruptStoredRowError:
    return CorruptStoredRowError(
        f"no count of unfinished children for parent {parent['parent_execution_id']!r:.200} "
        f"of tenant {parent['tenant_id']!r:.200} though a child of it is running: children "
        "queued by a release before migration 0010 while it ran? (agboss-sql migrate)"
    )


__all__ = ["ParentCountStatements"]
