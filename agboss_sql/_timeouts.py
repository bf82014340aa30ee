"""`Timeouts`: the bound of every wait a `SqlConnection` makes (public as `agboss_sql.sql.Timeouts`).

No store call waits forever. Each wait below ends in a `StoreTimeoutError` naming it
(`what`) and its bound (`bound_ms`), unless the wait came after COMMIT (or an autocommit
write) was sent, where the outcome is unknown and the error is a
`CommitOutcomeUnknownError`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The bounds, in milliseconds, of a connection's waits.

    - `connect_ms`: opening a server connection (TCP and handshake).
    - `statement_ms`: one statement of a store's step, measured on the client as well as
      set on the server (PostgreSQL `statement_timeout`, MariaDB `max_statement_time`):
      a server that stops answering (a black-holed connection) ends the wait too.
    - `lock_ms`: waiting for a row lock (PostgreSQL `lock_timeout`, MySQL/MariaDB
      `innodb_lock_wait_timeout`, rounded up to whole seconds) or, on SQLite, for the
      database's write lock. A lock wait that ends is not retried.
    - `pool_ms`: waiting for a pooled connection when all are busy; behind a transaction
      pooler (`?agboss_pooling=transaction`), also the pooler's wait for one of its server
      connections, at a transaction's first round trip.
    - `retry_ms`: the total time a step may spend being retried after transient conflicts
      (deadlock, serialization failure) before the last conflict is raised.

    The defaults suit leases of 10 s and more: a holder learns of a lost database well
    before its lease runs out.
    """

    connect_ms: int = 5_000
    statement_ms: int = 30_000
    lock_ms: int = 5_000
    pool_ms: int = 5_000
    retry_ms: int = 10_000

    def __post_init__(self) -> None:
        for name in ("connect_ms", "statement_ms", "lock_ms", "pool_ms", "retry_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"Timeouts.{name} must be a positive number of ms, got {value!r}")
