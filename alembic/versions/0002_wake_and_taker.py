"""parent wake marker and per-attempt finish answer on children; taker on pauses

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 15:45:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from agboss_sql.sql._column_types import Ident

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agboss_child_executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("finished_attempt", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("finish_remaining", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("wake_claimed_by", Ident(), nullable=True))
        batch_op.add_column(sa.Column("wake_claimed_until", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("parent_woken_at", sa.BigInteger(), nullable=True))
        batch_op.create_index(
            batch_op.f("ix_agboss_child_executions_finish_remaining_parent_woken_at"),
            ["finish_remaining", "parent_woken_at"],
            unique=False,
        )
    with op.batch_alter_table("agboss_paused_executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("taken_by", Ident(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("agboss_paused_executions", schema=None) as batch_op:
        batch_op.drop_column("taken_by")
    with op.batch_alter_table("agboss_child_executions", schema=None) as batch_op:
        batch_op.drop_index(
            batch_op.f("ix_agboss_child_executions_finish_remaining_parent_woken_at")
        )
        batch_op.drop_column("parent_woken_at")
        batch_op.drop_column("wake_claimed_until")
        batch_op.drop_column("wake_claimed_by")
        batch_op.drop_column("finish_remaining")
        batch_op.drop_column("finished_attempt")
