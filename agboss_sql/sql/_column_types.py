"""The key column types of the schema, shared by `schema` and every Alembic migration.

A migration creates its columns with these, so what a type renders is part of what every
past migration creates: a type that must render differently is a new function here, never
a change to one of these (the migration tests compare the migrated schema with `schema`).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql


def Ident(length: int = 255) -> sa.types.TypeEngine[str]:
    """A bounded identifier compared by its exact characters on every database."""
    return sa.String(length).with_variant(
        mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )


def OrderedIdent(length: int) -> sa.types.TypeEngine[str]:
    """An identifier compared and ordered by its exact characters (code point order) on every
    database, whatever its default collation: `COLLATE "C"` on PostgreSQL, whose default
    collation may order `a1` before `B1` (revision 0012_checkpoint_id_order); MySQL's
    `utf8mb4_bin` (`Ident`) and SQLite's `BINARY` order so already."""
    return Ident(length).with_variant(postgresql.VARCHAR(length, collation="C"), "postgresql")


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
