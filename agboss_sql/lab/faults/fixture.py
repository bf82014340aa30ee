"""The store set a pod runs on, built by an importable factory `(url, pod) -> PodStores`.

`sql_store_set` is the project's own: every `Sql*` store the workload needs, each wrapped
by `with_hold_points`, on one `SqlConnection` per pod. A third party gives its own
factory path to `fault_suite(stores=...)`; the pods import and call it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agboss_sql.contracts.clocks import Clock, StoreClock
from agboss_sql.contracts.errors import StoreUnavailableError
from agboss_sql.contracts.stores import (
    ChildExecutionQueueRepository,
    ExecutionLeaseEventRepository,
    ExecutionLeaseRepository,
    ExecutionRecordRepository,
    ExecutionTreeRepository,
    FencedEffectRepository,
    OutboundCallRepository,
    PausedExecutionRepository,
)
from agboss_sql.contracts.types import ApplicationContext
from agboss_sql.lab.faults.holds import with_hold_points
from agboss_sql.sql.timeouts import Timeouts


@dataclass(frozen=True)
class PodIdentity:
    """Who a pod is: its instance id, its (scaled) clock, the store's time it decides by,
    and its application context."""

    instance_id: str
    clock: Clock
    store_clock: StoreClock
    application: ApplicationContext


@dataclass
class PodStores:
    """The stores a pod's workload runs on. `business_row(tx, row)` writes one business row
    in a fenced effect's transaction. `outage(on)` makes every later statement of this pod
    fail (a store outage inside the pod) until called with False; `None` when the set
    cannot inject one. `close()` ends the pod's connections."""

    leases: ExecutionLeaseRepository
    events: ExecutionLeaseEventRepository
    effects: FencedEffectRepository[Any]
    outbound: OutboundCallRepository
    queue: ChildExecutionQueueRepository
    records: ExecutionRecordRepository
    tree: ExecutionTreeRepository
    pauses: PausedExecutionRepository
    business_row: Callable[[Any, str], Awaitable[None]]
    close: Callable[[], Awaitable[None]]
    outage: Callable[[bool], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class InjectedOutageError(StoreUnavailableError):
    """The store is unreachable from this pod (an outage injected by the fault suite)."""


def sql_store_classes() -> dict[str, type[Any]]:
    """The project's SQL store classes the fixture uses, by contract key, each wrapped by
    `with_hold_points` (a broken twin replaces one of them)."""
    from agboss_sql.sql import (
        SqlChildExecutionQueueRepository,
        SqlExecutionLeaseEventRepository,
        SqlExecutionLeaseRepository,
        SqlExecutionRecordRepository,
        SqlExecutionTreeRepository,
        SqlFencedEffectRepository,
        SqlOutboundCallRepository,
        SqlPausedExecutionRepository,
    )

    return {
        "execution_lease": SqlExecutionLeaseRepository,
        "execution_lease_event": SqlExecutionLeaseEventRepository,
        "fenced_effect": SqlFencedEffectRepository,
        "outbound_call": SqlOutboundCallRepository,
        "child_queue": SqlChildExecutionQueueRepository,
        "execution_record": SqlExecutionRecordRepository,
        "execution_tree": SqlExecutionTreeRepository,
        "paused_execution": SqlPausedExecutionRepository,
    }


POD_TIMEOUTS = Timeouts(
    connect_ms=3_000, statement_ms=4_000, lock_ms=3_000, pool_ms=3_000, retry_ms=4_000
)
"""The pods' bounds: every wait ends well inside the audit's operation bound (15 s), and a
session frozen inside a transaction loses its locks after 4 s (idle in transaction)."""


def build_sql_store_set(
    url: str, pod: PodIdentity, classes: dict[str, type[Any]] | None = None
) -> PodStores:
    """`sql_store_set` with some classes replaced (`classes` by contract key)."""
    from agboss_sql.lab.database import insert_business_row
    from agboss_sql.sql import SqlConnection

    chosen = {**sql_store_classes(), **(classes or {})}
    held = {key: with_hold_points(cls) for key, cls in chosen.items()}
    connection = SqlConnection(url, timeouts=POD_TIMEOUTS)
    outage_on = [False]

    def refuse(sql: str, params: Any) -> None:
        if outage_on[0] and sql.strip().upper() != "ROLLBACK":
            raise InjectedOutageError(f"injected outage: {sql.split()[0] if sql else ''} refused")

    connection.add_statement_listener(refuse)

    def outage(on: bool) -> None:
        outage_on[0] = on

    app = pod.application
    return PodStores(
        leases=held["execution_lease"](connection, pod.store_clock, app),
        events=held["execution_lease_event"](connection, pod.store_clock, app),
        effects=held["fenced_effect"](connection, pod.store_clock, app),
        outbound=held["outbound_call"](connection, pod.store_clock, app),
        queue=held["child_queue"](connection, pod.clock, app),
        records=held["execution_record"](connection, pod.clock, app),
        tree=held["execution_tree"](connection, pod.clock, app),
        pauses=held["paused_execution"](connection, pod.clock, app),
        business_row=insert_business_row,
        close=connection.close,
        outage=outage,
        extra={"connection": connection},
    )


def sql_store_set(url: str, pod: PodIdentity) -> PodStores:
    """The project's SQL stores for one pod (the default `stores=` of `fault_suite`)."""
    return build_sql_store_set(url, pod)


__all__ = [
    "InjectedOutageError",
    "PodIdentity",
    "PodStores",
    "build_sql_store_set",
    "sql_store_classes",
    "sql_store_set",
]
