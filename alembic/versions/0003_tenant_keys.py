"""tenants kept apart: cost entry ids per tenant, budget reservations per tenant

Revision ID: 0003_tenant_keys
Revises: 0002
Create Date: 2026-12-01 19:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from agboss_sql.sql._column_types import Ident

revision: str = "0003_tenant_keys"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
}


def _entries(*primary_key: str) -> sa.Table:
    """The cost entries table keyed by `primary_key` (SQLite rebuilds it from this, so the
    change also runs offline)."""
    return sa.Table(
        "agboss_cost_entries",
        sa.MetaData(naming_convention=NAMING),
        sa.Column("entry_id", Ident(), nullable=False),
        sa.Column("tenant_id", Ident(), nullable=False),
        sa.Column("execution_id", Ident(), nullable=False),
        sa.Column("application", Ident(), nullable=False),
        sa.Column("tokens_in", sa.BigInteger(), nullable=False),
        sa.Column("tokens_out", sa.BigInteger(), nullable=False),
        sa.Column("cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(*primary_key, name="pk_agboss_cost_entries"),
        sa.Index("ix_agboss_cost_entries_application_at", "application", "at"),
        sa.Index("ix_agboss_cost_entries_execution_id_at", "execution_id", "at"),
        sa.Index("ix_agboss_cost_entries_tenant_id_at", "tenant_id", "at"),
    )


def _reservations(with_tenant: bool) -> sa.Table:
    """The budget reservations table, with or without its tenant column."""
    columns: list[sa.Column[object]] = [
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("key", Ident(), nullable=False),
        sa.Column("reserved_micros", sa.BigInteger(), nullable=False),
    ]
    key = ["scope", "key"]
    if with_tenant:
        columns.append(
            sa.Column("tenant_id", Ident(), nullable=False, server_default=sa.text("''"))
        )
        key.append("tenant_id")
    return sa.Table(
        "agboss_cost_reservations",
        sa.MetaData(naming_convention=NAMING),
        *columns,
        sa.PrimaryKeyConstraint(*key, name="pk_agboss_cost_reservations"),
    )


def upgrade() -> None:
    # An entry id is unique within its tenant: another tenant's entry under the same id is
    # another entry (it used to be dropped as a replay).
    with op.batch_alter_table("agboss_cost_entries", copy_from=_entries("entry_id")) as batch_op:
        batch_op.drop_constraint("pk_agboss_cost_entries", type_="primary")
        batch_op.create_primary_key("pk_agboss_cost_entries", ["entry_id", "tenant_id"])
    # A reservation belongs to its tenant ('' for one made without a tenant): two tenants'
    # executions of one id no longer share a budget.
    with op.batch_alter_table(
        "agboss_cost_reservations", copy_from=_reservations(False)
    ) as batch_op:
        batch_op.add_column(
            sa.Column("tenant_id", Ident(), nullable=False, server_default=sa.text("''"))
        )
        batch_op.drop_constraint("pk_agboss_cost_reservations", type_="primary")
        batch_op.create_primary_key("pk_agboss_cost_reservations", ["scope", "key", "tenant_id"])


def downgrade() -> None:
    # Reservations made per tenant fold back into one row per (scope, key): they are dropped.
    op.execute("DELETE FROM agboss_cost_reservations WHERE tenant_id <> ''")
    with op.batch_alter_table(
        "agboss_cost_reservations", copy_from=_reservations(True)
    ) as batch_op:
        batch_op.drop_constraint("pk_agboss_cost_reservations", type_="primary")
        batch_op.create_primary_key("pk_agboss_cost_reservations", ["scope", "key"])
        batch_op.drop_column("tenant_id")
    # Two tenants' entries under one id cannot both stay: the later ones are dropped.
    op.execute(
        "DELETE FROM agboss_cost_entries WHERE EXISTS (SELECT 1 FROM agboss_cost_entries AS"
        " first WHERE first.entry_id = agboss_cost_entries.entry_id AND first.tenant_id <"
        " agboss_cost_entries.tenant_id)"
    )
    with op.batch_alter_table(
        "agboss_cost_entries", copy_from=_entries("entry_id", "tenant_id")
    ) as batch_op:
        batch_op.drop_constraint("pk_agboss_cost_entries", type_="primary")
        batch_op.create_primary_key("pk_agboss_cost_entries", ["entry_id"])
