"""counters every concurrent decider writes: fenced writes on the lease row, finishes of a
parent's children on its first child, slot takes on the rate limit key's row

Revision ID: 0006_galera
Revises: 0004_saver_keys
Create Date: 2026-12-01 19:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_galera"
down_revision: str | Sequence[str] | None = "0004_saver_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agboss_execution_leases", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("fence_writes", sa.BigInteger(), server_default="0", nullable=False)
        )
    with op.batch_alter_table("agboss_child_executions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("sibling_finishes", sa.BigInteger(), server_default="0", nullable=False)
        )
    with op.batch_alter_table("agboss_rate_limit_keys", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("slot_takes", sa.BigInteger(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("agboss_rate_limit_keys", schema=None) as batch_op:
        batch_op.drop_column("slot_takes")
    with op.batch_alter_table("agboss_child_executions", schema=None) as batch_op:
        batch_op.drop_column("sibling_finishes")
    with op.batch_alter_table("agboss_execution_leases", schema=None) as batch_op:
        batch_op.drop_column("fence_writes")
