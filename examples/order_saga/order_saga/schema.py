"""The shop's own tables: written by the workflows' effects, in the fence's transaction."""

from __future__ import annotations

import sqlalchemy as sa

from agboss_sql.sql.migrate import sync_url

metadata = sa.MetaData()

payments = sa.Table(
    "shop_payments",
    metadata,
    sa.Column("order_id", sa.String(100), primary_key=True),
    sa.Column("cents", sa.BigInteger, nullable=False),
    sa.Column("charged_by", sa.String(100), nullable=False),
)
refunds = sa.Table(
    "shop_refunds",
    metadata,
    sa.Column("order_id", sa.String(100), primary_key=True),
    sa.Column("cents", sa.BigInteger, nullable=False),
)
shipments = sa.Table(
    "shop_shipments",
    metadata,
    sa.Column("order_id", sa.String(100), primary_key=True),
    sa.Column("item", sa.String(100), primary_key=True),
    sa.Column("shipped_by", sa.String(100), nullable=False),
)


def create_tables(url: str) -> None:
    """Create the shop's tables on `url` (those that are missing)."""
    engine = sa.create_engine(sync_url(url))
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()


if __name__ == "__main__":
    import sys

    create_tables(sys.argv[1])
    print("shop tables ready")
