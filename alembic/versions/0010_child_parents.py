"""the child queue's count of unfinished children per parent

A finish of a child locked every sibling and counted the unfinished ones: its cost grew with
the parent's children, and draining a fan-out with their square. Each (tenant, parent) now
has one row in `agboss_child_parents` holding how many of its children are not finished;
an enqueue adds one, a finish takes one off and answers from it, in their transactions.
The upgrade creates the table and fills it from the children already queued (every parent
with a child gets its row, 0 when all finished), in one statement of the upgrade's
transaction; stop the workers of the queue while it runs (an enqueue or finish of the old
release meanwhile would not be counted). The downgrade drops the table: the old release
counts the children again.

Revision ID: 0010_child_parents
Revises: 0009_appended_values
Create Date: 2026-12-04 21:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from agboss_sql.sql._column_types import Ident

revision: str = "0010_child_parents"
down_revision: str | Sequence[str] | None = "0009_appended_values"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


TABLE = "agboss_child_parents"


def _left_by_a_stopped_upgrade() -> bool:
    """Whether the table is already there, empty: on MySQL/MariaDB, where DDL commits as it
    runs, an upgrade stopped at the fill (a lock wait past `lock_ms` on a child's row)
    leaves the table created and nothing in it. The next upgrade fills it. A table there
    with rows is not this revision's to fill: refused, nothing changed."""
    if op.get_context().as_sql:
        return False  # offline: the SQL of an upgrade from 0009
    bind = op.get_bind()
    if not sa.inspect(bind).has_table(TABLE):
        return False
    if bind.execute(sa.text(f"SELECT 1 FROM {TABLE} LIMIT 1")).first() is not None:
        raise RuntimeError(
            f"{TABLE} already exists with rows while the database is at 0009_appended_values: "
            "it was not made by this revision's upgrade; drop it (the upgrade counts the "
            "children anew) and upgrade again"
        )
    return True


def upgrade() -> None:
    if _left_by_a_stopped_upgrade():
        _fill()
        return
    op.create_table(
        "agboss_child_parents",
        sa.Column("tenant_id", Ident(), nullable=False),
        sa.Column("parent_execution_id", Ident(), nullable=False),
        sa.Column("unfinished", sa.BigInteger(), nullable=False),
        sa.Column("waits", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("tenant_id", "parent_execution_id", name="pk_agboss_child_parents"),
    )
    _fill()


def _fill() -> None:
    op.execute(
        "INSERT INTO agboss_child_parents (tenant_id, parent_execution_id, unfinished, waits) "
        "SELECT tenant_id, parent_execution_id, "
        "SUM(CASE WHEN status = 'finished' THEN 0 ELSE 1 END), 0 "
        "FROM agboss_child_executions GROUP BY tenant_id, parent_execution_id"
    )


def downgrade() -> None:
    op.drop_table("agboss_child_parents")
