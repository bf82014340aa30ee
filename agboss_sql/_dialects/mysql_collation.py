"""The collation MySQL and MariaDB must give the agboss tables: `utf8mb4_bin`.

A key compares by its exact characters on every database the stores support. On MySQL
and MariaDB that holds only when the text columns are collated `utf8mb4_bin`: under the
server's usual default (`utf8mb4_general_ci`, `utf8mb4_0900_ai_ci`) `'Order-1'` and
`'order-1'` are one key, and a new table made by a later revision takes the database's
default. `collation_of(connection, tables)` reads both from `information_schema` (on the
connection's own database) and says the statements that fix them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import sqlalchemy as sa

REQUIRED = "utf8mb4_bin"
"""The collation of every text column of the agboss tables, and of their database."""


@dataclass(frozen=True, slots=True)
class Collation:
    """What `collation_of` found: the database's name and default collation, and each
    agboss table with text columns of another collation (`table -> their collations`)."""

    database: str
    default: str
    tables: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the database and every agboss table's text column are `REQUIRED`."""
        return self.default == REQUIRED and not self.tables

    def statements(self) -> list[str]:
        """The statements that make the database and its agboss tables `REQUIRED`, in the
        order to run them (each converts a table's text in place: run them while no
        instance writes)."""
        found = []
        if self.default != REQUIRED:
            found.append(
                f"ALTER DATABASE `{self.database}` CHARACTER SET utf8mb4 COLLATE {REQUIRED}"
            )
        return found + [
            f"ALTER TABLE `{table}` CONVERT TO CHARACTER SET utf8mb4 COLLATE {REQUIRED}"
            for table in sorted(self.tables)
        ]

    def problem(self) -> str | None:
        """What is wrong, in one sentence without the fix (`None` when nothing is)."""
        if self.ok:
            return None
        parts = []
        if self.default != REQUIRED:
            parts.append(f"database {self.database} is collated {self.default}")
        if self.tables:
            collations = sorted({c for found in self.tables.values() for c in found})
            parts.append(
                f"{len(self.tables)} agboss table(s) have text columns collated "
                f"{', '.join(collations)} (e.g. {min(self.tables)})"
            )
        return (
            " and ".join(parts) + f", not {REQUIRED}: keys that differ only in case or "
            "accents would be one key"
        )


def collation_of(connection: sa.Connection, tables: Iterable[str]) -> Collation:
    """The default collation of `connection`'s database, and the agboss `tables` (those of
    them that exist) with a text column not collated `REQUIRED`: two reads of
    `information_schema`."""
    names = sorted(set(tables))
    database, default = connection.execute(
        sa.text(
            "SELECT SCHEMA_NAME, DEFAULT_COLLATION_NAME FROM information_schema.SCHEMATA "
            "WHERE SCHEMA_NAME = DATABASE()"
        )
    ).one()
    rows = connection.execute(
        sa.text(
            "SELECT DISTINCT TABLE_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND COLLATION_NAME IS NOT NULL "
            "AND COLLATION_NAME <> :required AND TABLE_NAME IN :names"
        ).bindparams(sa.bindparam("names", expanding=True)),
        {"required": REQUIRED, "names": names},
    ).all()
    found: dict[str, list[str]] = {}
    for table, collation in rows:
        found.setdefault(str(table), []).append(str(collation))
    return Collation(str(database), str(default), {t: sorted(c) for t, c in found.items()})


__all__ = ["REQUIRED", "Collation", "collation_of"]
