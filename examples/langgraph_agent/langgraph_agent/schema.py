"""The agent's own table: the charges its `charge` tool makes, in the fence's transaction.
No unique key on the thread: a charge made twice would show as two rows."""

from __future__ import annotations

import sqlalchemy as sa

from agboss_sql.sql.migrate import sync_url

metadata = sa.MetaData()

charges = sa.Table(
    "agent_charges",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("thread_id", sa.String(100), nullable=False),
    sa.Column("cents", sa.BigInteger, nullable=False),
    sa.Column("charged_by", sa.String(100), nullable=False),
)


def create_tables(url: str) -> None:
    """Create the agent's table on `url` (if it is missing)."""
    engine = sa.create_engine(sync_url(url))
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()


if __name__ == "__main__":
    import sys

    create_tables(sys.argv[1])
    print("agent tables ready")
