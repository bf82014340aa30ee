"""checkpoint saver keys: thread ids, task ids and channel names keyed by their SHA-256

Thread ids, task ids and channel names were key columns of 255 characters compared with
MySQL's padding collation; LangGraph accepts any text (empty, longer, ending in spaces). Each
is now keyed by its SHA-256 hex digest (`thread_hash`, `task_hash`, `channel_hash`), and the
whole text is kept where a read answers it (`agboss_checkpoints.thread_id`,
`agboss_checkpoint_writes.task_id`). Existing rows are kept: their digests are computed in
SQL (SQLite: a function registered on the migration's connection).

Revision ID: 0004_saver_keys
Revises: 0003_tenant_keys
Create Date: 2026-12-01 19:30:00.000000
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

from agboss_sql.sql._column_types import Blob, Ident, Json

revision: str = "0004_saver_keys"
down_revision: str | Sequence[str] | None = "0003_tenant_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _sha256(column: str) -> str:
    """SQL for the SHA-256 hex digest of the UTF-8 text in `column` (as `identity_hash`)."""
    name = op.get_context().dialect.name
    if name == "postgresql":
        return f"encode(sha256(convert_to({column}, 'UTF8')), 'hex')"
    if name in ("mysql", "mariadb"):
        return f"LOWER(SHA2({column}, 256))"
    if not context.is_offline_mode():
        op.get_bind().connection.dbapi_connection.create_function(
            "agboss_sha256",
            1,
            lambda text: hashlib.sha256(text.encode()).hexdigest(),
            deterministic=True,
        )
    return f"agboss_sha256({column})"


def _new_tables() -> dict[str, list[sa.SchemaItem]]:
    """The three tables as this revision leaves them (columns, then constraints)."""
    return {
        "agboss_checkpoints": [
            sa.Column("thread_hash", Ident(64), nullable=False),
            sa.Column("ns_hash", Ident(64), nullable=False),
            sa.Column("checkpoint_id", Ident(64), nullable=False),
            sa.Column("thread_id", sa.Text(), nullable=False),
            sa.Column("checkpoint_ns", sa.Text(), nullable=False),
            sa.Column("parent_checkpoint_id", Ident(64), nullable=True),
            sa.Column("run_hash", Ident(64), nullable=True),
            sa.Column("checkpoint_type", sa.String(length=64), nullable=False),
            sa.Column("checkpoint", Blob(), nullable=False),
            sa.Column("metadata", Json(), nullable=False),
            sa.PrimaryKeyConstraint(
                "thread_hash", "ns_hash", "checkpoint_id", name=op.f("pk_agboss_checkpoints")
            ),
        ],
        "agboss_checkpoint_blobs": [
            sa.Column("thread_hash", Ident(64), nullable=False),
            sa.Column("ns_hash", Ident(64), nullable=False),
            sa.Column("channel_hash", Ident(64), nullable=False),
            sa.Column("version", Ident(128), nullable=False),
            sa.Column("value_type", sa.String(length=64), nullable=False),
            sa.Column("value", Blob(), nullable=True),
            sa.PrimaryKeyConstraint(
                "thread_hash",
                "ns_hash",
                "channel_hash",
                "version",
                name=op.f("pk_agboss_checkpoint_blobs"),
            ),
        ],
        "agboss_checkpoint_writes": [
            sa.Column("thread_hash", Ident(64), nullable=False),
            sa.Column("ns_hash", Ident(64), nullable=False),
            sa.Column("checkpoint_id", Ident(64), nullable=False),
            sa.Column("task_hash", Ident(64), nullable=False),
            sa.Column("idx", sa.Integer(), autoincrement=False, nullable=False),
            sa.Column("task_id", sa.Text(), nullable=False),
            sa.Column("channel", sa.Text(), nullable=False),
            sa.Column("task_path", sa.Text(), nullable=False),
            sa.Column("value_type", sa.String(length=64), nullable=False),
            sa.Column("value", Blob(), nullable=True),
            sa.PrimaryKeyConstraint(
                "thread_hash",
                "ns_hash",
                "checkpoint_id",
                "task_hash",
                "idx",
                name=op.f("pk_agboss_checkpoint_writes"),
            ),
        ],
    }


# What each new column is filled with from the old table's row (the rest: same name).
_FILLED = {
    "agboss_checkpoints": {"thread_hash": _sha256},
    "agboss_checkpoint_blobs": {"thread_hash": _sha256, "channel_hash": _sha256},
    "agboss_checkpoint_writes": {"thread_hash": _sha256, "task_hash": _sha256},
}
_SOURCE = {"thread_hash": "thread_id", "channel_hash": "channel", "task_hash": "task_id"}
_RUN_INDEX = "ix_agboss_checkpoints_run_hash"


def upgrade() -> None:
    # Each table is rebuilt: renamed aside (its index and, on PostgreSQL, its primary key's
    # name freed), created anew, filled from the old rows with their digests, dropped.
    op.drop_index(_RUN_INDEX, table_name="agboss_checkpoints")
    postgresql = op.get_context().dialect.name == "postgresql"
    for table, items in _new_tables().items():
        old = f"{table}_0002"
        op.rename_table(table, old)
        if postgresql:
            op.execute(f"ALTER TABLE {old} RENAME CONSTRAINT pk_{table} TO pk_{old}")
        op.create_table(table, *items)
        columns = [item.name for item in items if isinstance(item, sa.Column)]
        selected = [
            _FILLED[table][name](_SOURCE[name]) if name in _FILLED[table] else name
            for name in columns
        ]
        op.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(selected)} FROM {old}"
        )
        op.drop_table(old)
    op.create_index(_RUN_INDEX, "agboss_checkpoints", ["run_hash"], unique=False)


def downgrade_refusal(bind: sa.Connection) -> str | None:
    """Why a downgrade below this revision must not run on `bind`'s database, or `None`.
    The migration runner asks it before the first step of a downgrade, so a refused
    downgrade changes nothing even where DDL commits on its own (MySQL, MariaDB)."""
    for table in ("agboss_checkpoints", "agboss_checkpoint_blobs", "agboss_checkpoint_writes"):
        if bind.execute(sa.text(f"SELECT 1 FROM {table} LIMIT 1")).first() is not None:
            return (
                f"{table} holds checkpoints: downgrading below 0004_saver_keys would lose "
                "them (values are keyed by their channel's digest); delete the threads first"
            )
    return None


def downgrade() -> None:
    # The value rows no longer hold their channel's name (only its digest): they cannot be
    # carried back. Refuse rather than lose checkpoints.
    if not context.is_offline_mode():
        refusal = downgrade_refusal(op.get_bind())
        if refusal is not None:
            raise RuntimeError(refusal)
    op.drop_index(_RUN_INDEX, table_name="agboss_checkpoints")
    for table in _new_tables():
        op.drop_table(table)
    ident = Ident(255)
    op.create_table(
        "agboss_checkpoint_blobs",
        sa.Column("thread_id", ident, nullable=False),
        sa.Column("ns_hash", Ident(64), nullable=False),
        sa.Column("channel", Ident(255), nullable=False),
        sa.Column("version", Ident(128), nullable=False),
        sa.Column("value_type", sa.String(length=64), nullable=False),
        sa.Column("value", Blob(), nullable=True),
        sa.PrimaryKeyConstraint(
            "thread_id", "ns_hash", "channel", "version", name=op.f("pk_agboss_checkpoint_blobs")
        ),
    )
    op.create_table(
        "agboss_checkpoint_writes",
        sa.Column("thread_id", Ident(255), nullable=False),
        sa.Column("ns_hash", Ident(64), nullable=False),
        sa.Column("checkpoint_id", Ident(64), nullable=False),
        sa.Column("task_id", Ident(255), nullable=False),
        sa.Column("idx", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column("task_path", sa.Text(), nullable=False),
        sa.Column("value_type", sa.String(length=64), nullable=False),
        sa.Column("value", Blob(), nullable=True),
        sa.PrimaryKeyConstraint(
            "thread_id",
            "ns_hash",
            "checkpoint_id",
            "task_id",
            "idx",
            name=op.f("pk_agboss_checkpoint_writes"),
        ),
    )
    op.create_table(
        "agboss_checkpoints",
        sa.Column("thread_id", Ident(255), nullable=False),
        sa.Column("ns_hash", Ident(64), nullable=False),
        sa.Column("checkpoint_id", Ident(64), nullable=False),
        sa.Column("checkpoint_ns", sa.Text(), nullable=False),
        sa.Column("parent_checkpoint_id", Ident(64), nullable=True),
        sa.Column("run_hash", Ident(64), nullable=True),
        sa.Column("checkpoint_type", sa.String(length=64), nullable=False),
        sa.Column("checkpoint", Blob(), nullable=False),
        sa.Column("metadata", Json(), nullable=False),
        sa.PrimaryKeyConstraint(
            "thread_id", "ns_hash", "checkpoint_id", name=op.f("pk_agboss_checkpoints")
        ),
    )
    op.create_index(_RUN_INDEX, "agboss_checkpoints", ["run_hash"], unique=False)
