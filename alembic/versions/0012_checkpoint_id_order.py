"""checkpoint ids ordered by their exact characters on PostgreSQL

A thread's history is ordered by checkpoint id: its latest checkpoint, a listing's pages
and the range of ids whose pending writes a page reads. The saver computes a page's range
in Python (code point order) and the database compares it in its own: on a PostgreSQL
database whose default collation is not `C` (`en_US.UTF-8`, ICU's `en-US`), ids whose two
orders differ (`B1` and `a1`, say; never the ids LangGraph makes, which are lower-case hex
at fixed places) were listed without their pending writes, and the latest was another one
than on SQLite or MySQL. The three id columns (`agboss_checkpoints.checkpoint_id` and
`parent_checkpoint_id`, `agboss_checkpoint_writes.checkpoint_id`) take `COLLATE "C"`, code
point order, as MySQL's `utf8mb4_bin` and SQLite's `BINARY` order them already; the other
databases are untouched.

No row is rewritten, but the server rebuilds the two tables' primary-key indexes under an
`ACCESS EXCLUSIVE` lock: saver calls wait for it (6.5 s for a million checkpoints and a
million pending writes on a 2-core machine, `agboss-sql upgrade` from 0011). The downgrade
gives the columns back the database's default collation.

Revision ID: 0012_checkpoint_id_order
Revises: 0011_wide_identities
Create Date: 2026-12-07 00:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0012_checkpoint_id_order"
down_revision: str | Sequence[str] | None = "0011_wide_identities"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = {
    "agboss_checkpoints": ("checkpoint_id", "parent_checkpoint_id"),
    "agboss_checkpoint_writes": ("checkpoint_id",),
}


def _collate(collation: str) -> None:
    for table, columns in COLUMNS.items():
        alters = ", ".join(
            f'ALTER COLUMN {column} TYPE VARCHAR(64) COLLATE "{collation}"' for column in columns
        )
        op.execute(f"ALTER TABLE {table} {alters}")


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        _collate("C")


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        _collate("default")
