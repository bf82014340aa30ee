"""fenced effects' and outbound calls' identities wide enough for every key the limits allow

A fenced effect's row keeps its key's identity whole (`identity`, `key_identity`: a JSON
text of the key's scope, the step's idempotency key and the effect's name), where each
character of the idempotency key may take six (a control character's escape). MySQL and
MariaDB kept it in a `TEXT` column of 65,535 bytes, so an idempotency key of a few
thousand characters was refused there with a raw "data too long" and accepted elsewhere.
The columns become `MEDIUMTEXT` (16 MiB) there, so every idempotency key of up to
`MAX_IDEMPOTENCY_KEY_LENGTH` characters (16,383) is kept on every database; the other
databases' text columns have no such bound and are untouched. No row is rewritten but by
the server's own `ALTER TABLE` copy. The downgrade gives the columns back their `TEXT`
type, and refuses (before any step) while a row's identity is longer than `TEXT` holds.

Revision ID: 0011_wide_identities
Revises: 0010_child_parents
Create Date: 2026-12-05 00:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0011_wide_identities"
down_revision: str | Sequence[str] | None = "0010_child_parents"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    ("agboss_fenced_effect_results", "identity"),
    ("agboss_outbound_calls", "key_identity"),
)
TEXT_BYTES = 65_535


def _mysql() -> bool:
    return op.get_context().dialect.name in ("mysql", "mariadb")


def _modify(column_type: str) -> None:
    for table, column in COLUMNS:
        op.execute(f"ALTER TABLE {table} MODIFY COLUMN {column} {column_type} NOT NULL")


def upgrade() -> None:
    if _mysql():
        _modify("MEDIUMTEXT")


def downgrade_refusal(bind: sa.Connection) -> str | None:
    """Why a downgrade below this revision must not run on `bind`'s database, or `None`:
    an identity longer than a `TEXT` column holds would be refused (or cut) by the server.
    The migration runner asks it before the first step of a downgrade."""
    if bind.dialect.name not in ("mysql", "mariadb"):
        return None
    for table, column in COLUMNS:
        found = bind.execute(
            sa.text(f"SELECT 1 FROM {table} WHERE LENGTH({column}) > {TEXT_BYTES} LIMIT 1")
        ).first()
        if found is not None:
            return (
                f"{table}.{column} holds identities over {TEXT_BYTES} bytes: downgrading "
                "below 0011 would lose them; delete those effects' rows first"
            )
    return None


def downgrade() -> None:
    if not _mysql():
        return
    if context.is_offline_mode():
        op.execute(f"-- 0011 downgrade: first make sure no identity is over {TEXT_BYTES} bytes")
    else:
        refusal = downgrade_refusal(op.get_bind())
        if refusal is not None:
            raise RuntimeError(refusal)
    _modify("TEXT")
