"""`Sql*` stores written once on SQLAlchemy Core, for SQLite, PostgreSQL and MySQL/MariaDB.

Each store's `backend` is its connection's dialect (`"sqlite"`, `"postgresql"`,
`"mysql"`), or `"<dialect>:<database>"` for `SqlConnection(url, database=...)`.
`SqlCheckpointSaver` needs the `langgraph` extra and is imported on first use.
"""

from __future__ import annotations

import warnings
from typing import Any

from agboss_sql.sql._effect_connection import EffectTransactionEndedError
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.costs import SqlCostLedgerRepository
from agboss_sql.sql.effects import SqlFencedEffectRepository
from agboss_sql.sql.events import SqlExecutionLeaseEventRepository
from agboss_sql.sql.history import SqlExecutionHistoryRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.mesh import SqlMeshRequestRepository
from agboss_sql.sql.outbound import SqlOutboundCallRepository
from agboss_sql.sql.pauses import SqlPausedExecutionRepository
from agboss_sql.sql.queue import SqlChildExecutionQueueRepository
from agboss_sql.sql.rate_limits import SqlRateLimitRepository
from agboss_sql.sql.records import SqlExecutionRecordRepository
from agboss_sql.sql.timeouts import Timeouts
from agboss_sql.sql.trees import SqlExecutionTreeRepository


def sql_stores(*, checkpoint_saver: bool = True) -> list[type[Any]]:
    """Every `Sql*` store class, one per contract, for `Application(providers=...)`; with
    the `langgraph` extra installed (and `checkpoint_saver`), the checkpoint saver too."""
    classes: list[type[Any]] = [
        SqlExecutionLeaseRepository,
        SqlExecutionLeaseEventRepository,
        SqlFencedEffectRepository,
        SqlOutboundCallRepository,
        SqlChildExecutionQueueRepository,
        SqlRateLimitRepository,
        SqlExecutionRecordRepository,
        SqlExecutionTreeRepository,
        SqlMeshRequestRepository,
        SqlPausedExecutionRepository,
        SqlCostLedgerRepository,
        SqlExecutionHistoryRepository,
    ]
    if checkpoint_saver:
        try:
            from agboss_sql.sql.checkpoint import SqlCheckpointSaver
        except ImportError:  # the langgraph extra is not installed
            pass
        else:
            classes.append(SqlCheckpointSaver)
    return classes


def sql_store_classes(*, checkpoint_saver: bool = True) -> list[type[Any]]:
    """Deprecated: the old name of `sql_stores`, which it returns."""
    warnings.warn(
        "sql_store_classes() is deprecated: use sql_stores()", DeprecationWarning, stacklevel=2
    )
    return sql_stores(checkpoint_saver=checkpoint_saver)


def __getattr__(name: str) -> Any:
    if name == "SqlCheckpointSaver":
        from agboss_sql.sql.checkpoint import SqlCheckpointSaver

        return SqlCheckpointSaver
    raise AttributeError(name)


__all__ = [
    "EffectTransactionEndedError",
    "SqlCheckpointSaver",
    "SqlChildExecutionQueueRepository",
    "SqlConnection",
    "SqlCostLedgerRepository",
    "SqlExecutionHistoryRepository",
    "SqlExecutionLeaseEventRepository",
    "SqlExecutionLeaseRepository",
    "SqlExecutionRecordRepository",
    "SqlExecutionTreeRepository",
    "SqlFencedEffectRepository",
    "SqlMeshRequestRepository",
    "SqlOutboundCallRepository",
    "SqlPausedExecutionRepository",
    "SqlRateLimitRepository",
    "Timeouts",
    "sql_stores",
]
