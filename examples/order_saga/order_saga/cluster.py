"""The order saga as a workload of `agboss-sql cluster` (the lab's chaos and audit run on
it as on the demo tree):

    agboss-sql cluster --url URL --workload order_saga.cluster:workload

Every fifth order waits for an approval (answered by two other workers at once); the
audit reads the stores' rows, and this workload adds its own rule: each order has one
payment row, and a refund exactly when the order ended cancelled.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from agboss_sql.lab.faults.audit import StoreHistory, Violation
from agboss_sql.lab.workload import ClusterConfig, ClusterRun, ClusterWorkload
from agboss_sql.sql.migrate import sync_url
from order_saga.schema import create_tables, payments, refunds, shipments


def _runs(config: ClusterConfig, run_id: str) -> list[ClusterRun]:
    # The tables are the shop's: the cluster creates only its own.
    create_tables(config.url)
    runs = []
    for index in range(config.trees):
        order_id = f"o{run_id}-{index:02d}"
        order = {
            "id": order_id,
            "cents": 100 * (index + 1),
            "items": [f"item{n}" for n in range(config.fan_out)],
            "needs_approval": config.pause_every > 0 and index % config.pause_every == 0,
        }
        runs.append(ClusterRun("order", order, order_id))
    return runs


def _progress(connection: sa.Connection, runs: list[ClusterRun]) -> float:
    """Items shipped, of all the orders' items (the chaos is timed by it)."""
    ids = [run.id for run in runs]
    shipped = connection.execute(
        sa.select(sa.func.count()).where(shipments.c.order_id.in_(ids))
    ).scalar_one()
    return float(shipped) / max(1, sum(len(run.input["items"]) for run in runs))


def _audit(history: StoreHistory, runs: list[ClusterRun], url: str) -> list[Violation]:
    ids = [run.id for run in runs]
    status = {str(r["execution_id"]): str(r["status"]) for r in history.records}
    engine = sa.create_engine(sync_url(url))
    try:
        with engine.connect() as connection:
            paid = {
                r[0]
                for r in connection.execute(
                    sa.select(payments.c.order_id).where(payments.c.order_id.in_(ids))
                )
            }
            refunded = {
                r[0]
                for r in connection.execute(
                    sa.select(refunds.c.order_id).where(refunds.c.order_id.in_(ids))
                )
            }
            shipped = connection.execute(
                sa.select(shipments.c.order_id, sa.func.count())
                .where(shipments.c.order_id.in_(ids))
                .group_by(shipments.c.order_id)
            ).all()
    finally:
        engine.dispose()
    found = []
    items = {run.id: len(run.input["items"]) for run in runs}
    for order_id in ids:
        if status.get(order_id) == "succeeded" and (order_id not in paid or order_id in refunded):
            found.append(
                Violation(
                    "order",
                    f"{order_id} succeeded: paid {order_id in paid}, refunded {order_id in refunded}",
                )
            )
        if status.get(order_id) == "cancelled" and (order_id in paid) != (order_id in refunded):
            found.append(
                Violation(
                    "order",
                    f"{order_id} cancelled: paid {order_id in paid}, refunded {order_id in refunded}",
                )
            )
    for order_id, count in shipped:
        if count > items[order_id]:
            found.append(
                Violation("order", f"{order_id}: {count} shipments for {items[order_id]} items")
            )
    return found


class _Audit:
    """The order rule, reading the shop's tables on the cluster's database."""

    def __init__(self) -> None:
        self.url: str | None = None

    def __call__(self, history: StoreHistory, runs: list[ClusterRun]) -> list[Violation]:
        assert self.url is not None
        return _audit(history, runs, self.url)


_audit_on = _Audit()


def _runs_remembering_url(config: ClusterConfig, run_id: str) -> list[ClusterRun]:
    _audit_on.url = config.url
    return _runs(config, run_id)


workload: Any = ClusterWorkload(
    name="order-saga",
    app="order_saga.app:app",
    runs=_runs_remembering_url,
    progress=_progress,
    audit=_audit_on,
)
"""`agboss-sql cluster --workload order_saga.cluster:workload`."""
