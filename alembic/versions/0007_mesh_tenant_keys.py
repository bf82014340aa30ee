"""tenants kept apart: mesh request idempotency keys per tenant

Revision ID: 0007_mesh_tenant_keys
Revises: 0006_galera
Create Date: 2026-12-01 22:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from agboss_sql.sql._column_types import Ident, Json

revision: str = "0007_mesh_tenant_keys"
down_revision: str | Sequence[str] | None = "0006_galera"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
}


def _requests(*primary_key: str) -> sa.Table:
    """The mesh requests table keyed by `primary_key` (SQLite rebuilds it from this, so the
    change also runs offline)."""
    return sa.Table(
        "agboss_mesh_requests",
        sa.MetaData(naming_convention=NAMING),
        sa.Column("idempotency_key", Ident(), nullable=False),
        sa.Column("tenant_id", Ident(), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("received_at", sa.BigInteger(), nullable=False),
        sa.Column("completed", sa.Boolean(), nullable=False),
        sa.Column("response", Json(), nullable=True),
        sa.PrimaryKeyConstraint(*primary_key, name="pk_agboss_mesh_requests"),
    )


def upgrade() -> None:
    # An idempotency key is unique within its tenant: another tenant's request under the same
    # key is another request (it used to be refused as a conflict). Every row is kept.
    with op.batch_alter_table(
        "agboss_mesh_requests", copy_from=_requests("idempotency_key")
    ) as batch_op:
        batch_op.drop_constraint("pk_agboss_mesh_requests", type_="primary")
        batch_op.create_primary_key("pk_agboss_mesh_requests", ["idempotency_key", "tenant_id"])


def downgrade() -> None:
    # Two tenants' requests under one key cannot both stay: the later tenants' are dropped.
    op.execute(
        "DELETE FROM agboss_mesh_requests WHERE EXISTS (SELECT 1 FROM agboss_mesh_requests AS"
        " first WHERE first.idempotency_key = agboss_mesh_requests.idempotency_key AND"
        " first.tenant_id < agboss_mesh_requests.tenant_id)"
    )
    with op.batch_alter_table(
        "agboss_mesh_requests", copy_from=_requests("idempotency_key", "tenant_id")
    ) as batch_op:
        batch_op.drop_constraint("pk_agboss_mesh_requests", type_="primary")
        batch_op.create_primary_key("pk_agboss_mesh_requests", ["idempotency_key"])
