"""tenants kept apart: cost entry ids per tenant, budget reservations per tenant

Revision ID: 0003_tenant_keys
Revises: 0002
Create Date: 2026-12-01 19:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0003_tenant_keys"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ident() -> sa.types.TypeEngine[str]:
    return (
        sa.String(length=255)
        .with_variant(
            mysql.VARCHAR(charset="utf8mb4", collation="utf8mb4_bin", length=255), "mariadb"
        )
        .with_variant(
            mysql.VARCHAR(charset="utf8mb4", collation="utf8mb4_bin", length=255), "mysql"
        )
    )


def upgrade() -> None:
    # An entry id is unique within its tenant: another tenant's entry under the same id is
    # another entry (it used to be dropped as a replay).
    with op.batch_alter_table("agboss_cost_entries", schema=None) as batch_op:
        batch_op.drop_constraint("pk_agboss_cost_entries", type_="primary")
        batch_op.create_primary_key("pk_agboss_cost_entries", ["entry_id", "tenant_id"])
    # A reservation belongs to its tenant ('' for one made without a tenant): two tenants'
    # executions of one id no longer share a budget.
    with op.batch_alter_table("agboss_cost_reservations", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("tenant_id", _ident(), nullable=False, server_default=sa.text("''"))
        )
        batch_op.drop_constraint("pk_agboss_cost_reservations", type_="primary")
        batch_op.create_primary_key("pk_agboss_cost_reservations", ["scope", "key", "tenant_id"])


def downgrade() -> None:
    # Reservations made per tenant fold back into one row per (scope, key).
    op.execute("DELETE FROM agboss_cost_reservations WHERE tenant_id <> ''")
    with op.batch_alter_table("agboss_cost_reservations", schema=None) as batch_op:
        batch_op.drop_constraint("pk_agboss_cost_reservations", type_="primary")
        batch_op.create_primary_key("pk_agboss_cost_reservations", ["scope", "key"])
        batch_op.drop_column("tenant_id")
    with op.batch_alter_table("agboss_cost_entries", schema=None) as batch_op:
        batch_op.drop_constraint("pk_agboss_cost_entries", type_="primary")
        batch_op.create_primary_key("pk_agboss_cost_entries", ["entry_id"])
