"""checkpoint values stored as an append to an earlier value of their channel

A channel whose value is a list that only grows (a chat's messages under `add_messages`)
was stored whole at every version: a 100-turn conversation wrote its first message 100
times. A value row may now name, in `base_version`, an earlier full value of the same
channel of its thread namespace whose list it extends, and hold only the elements added
since. Rows written before keep `base_version` NULL and read as before; nothing is
rewritten.

Revision ID: 0009_appended_values
Revises: 0008_lz4_values
Create Date: 2026-12-03 14:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

from agboss_sql.sql._column_types import Ident

revision: str = "0009_appended_values"
down_revision: str | Sequence[str] | None = "0008_lz4_values"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agboss_checkpoint_blobs") as batch:
        batch.add_column(sa.Column("base_version", Ident(128), nullable=True))


def downgrade_refusal(bind: sa.Connection) -> str | None:
    """Why a downgrade below this revision must not run on `bind`'s database, or `None`.
    The migration runner asks it before the first step of a downgrade, so a refused
    downgrade changes nothing even where DDL commits on its own (MySQL, MariaDB)."""
    if (
        bind.execute(
            sa.text("SELECT 1 FROM agboss_checkpoint_blobs WHERE base_version IS NOT NULL LIMIT 1")
        ).first()
        is not None
    ):
        return (
            "agboss_checkpoint_blobs holds appended values (base_version set): downgrading "
            "below 0009 would lose them; delete or rewrite those threads first"
        )
    return None


def downgrade() -> None:
    # An appended value cannot be read without its column: refuse rather than lose it (an
    # offline script cannot ask, and says so).
    if context.is_offline_mode():
        op.execute("-- 0009 downgrade: first make sure no row has base_version set")
    else:
        refusal = downgrade_refusal(op.get_bind())
        if refusal is not None:
            raise RuntimeError(refusal)
    with op.batch_alter_table("agboss_checkpoint_blobs") as batch:
        batch.drop_column("base_version")
