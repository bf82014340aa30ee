"""agboss-sql: the durable store layer of a multi-instance agent/workflow runtime.

One owner at a time (leases with fencing tokens) and one effect per key (the
lease check, the high-water mark, the stored result and the business rows in
one atomic step), on SQLite, PostgreSQL and MySQL/MariaDB.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
