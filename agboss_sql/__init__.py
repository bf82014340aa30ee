"""agboss-sql: the durable store layer of a multi-instance agent/workflow runtime.

One owner at a time (leases with fencing tokens) and one effect per key (the
lease check, the high-water mark, the stored result and the business rows in
one atomic step), on SQLite, PostgreSQL and MySQL/MariaDB.

The flat names below are the public API; `agboss_sql.contracts`, `.memory`,
`.sql`, `.application`, `.runtime` and `.testing` hold them by area.
"""

from __future__ import annotations

from typing import Any

from agboss_sql.application import (
    Application,
    ComponentHealth,
    DatabaseUrl,
    HealthStatus,
    ReadinessReport,
    sql_stores,
)
from agboss_sql.contracts import *  # noqa: F403 - the contracts' own __all__ is the list
from agboss_sql.contracts import __all__ as _contracts_all
from agboss_sql.memory import *  # noqa: F403
from agboss_sql.memory import __all__ as _memory_all
from agboss_sql.sql import (
    SqlChildExecutionQueueRepository,
    SqlConnection,
    SqlCostLedgerRepository,
    SqlExecutionHistoryRepository,
    SqlExecutionLeaseEventRepository,
    SqlExecutionLeaseRepository,
    SqlExecutionRecordRepository,
    SqlExecutionTreeRepository,
    SqlFencedEffectRepository,
    SqlMeshRequestRepository,
    SqlOutboundCallRepository,
    SqlPausedExecutionRepository,
    SqlRateLimitRepository,
    Timeouts,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The checkpoint saver needs the `langgraph` extra: imported on first use only.
    if name == "SqlCheckpointSaver":
        from agboss_sql.sql.checkpoint import SqlCheckpointSaver

        return SqlCheckpointSaver
    raise AttributeError(name)


__all__ = [
    "Application",
    "ComponentHealth",
    "DatabaseUrl",
    "HealthStatus",
    "ReadinessReport",
    "__version__",
    "sql_stores",
    "SqlCheckpointSaver",  # noqa: F405 - provided lazily by __getattr__
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
    *_contracts_all,
    *_memory_all,
]
