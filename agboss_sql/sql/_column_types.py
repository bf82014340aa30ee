"""The key column types of the schema, shared by `schema` and every Alembic migration.

A migration creates its columns with these, so what a type renders is part of what every
past migration creates: a type that must render differently is a new function here, never
a change to one of these (the migration tests compare the migrated schema with `schema`).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mysql


def Ident(length: int = 255) -> sa.types.TypeEngine[str]:
    """A bounded identifier compared by its exact characters on every database."""
    return sa.String(length).with_variant(
        mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )


def Json() -> sa.types.TypeEngine[str]:
    """JSON text of any size."""
    return sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def WideText() -> sa.types.TypeEngine[str]:
    """A text longer than MySQL's `TEXT` holds (65,535 bytes): `MEDIUMTEXT` there (16 MiB),
    a plain text elsewhere (revision 0011_wide_identities)."""
    return sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")


def Blob() -> sa.types.TypeEngine[bytes]:
    """Binary data of any size."""
    return sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
