"""Prometheus metrics of a worker (`agboss-sql worker --metrics-port PORT`), from what its
`Engine` already says and what the database already holds: the engine has no metrics code.

- Every engine event (`on_event`: `step`, `effect`, `refused`, `retry`, `handover`,
  `tree-run`, `tree-end`, `child-run`, ...) is counted as it is emitted; the latencies
  are read off the events that carry one (`ms` on `step` and `effect`).
- Every lease move this instance makes (`observe_lease_moves`: takes, takeovers,
  renewals, losses and why, releases, finishes) is counted as it is made.
- Every few seconds one task reads the child queue with `SELECT`s only
  (`agboss_sql.sql.inspect.queue_view`: depth by state, the oldest waiting child, wakes
  owed, trees by status), on a connection of its own. The step slots and leases held are
  read from `engine.snapshot()` every second, on the event loop.

Metric names and labels are listed in `METRICS` and in docs/metrics.md. `prometheus_client`
is the optional `metrics` extra: `WorkerMetrics` raises `MetricsUnavailableError` naming it
when it is not installed. Each `WorkerMetrics` has a registry of its own (`registry`), so
two engines in one process never share a counter.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from agboss_sql.contracts.errors import AgbossError
from agboss_sql.contracts.types import ExecutionLease, LeaseEventKind
from agboss_sql.runtime._log import observe_lease_moves
from agboss_sql.runtime.engine import Engine

logger = logging.getLogger("agboss_sql.runtime")

POLL_S = 5.0
"""How often the database is read for the queue (seconds)."""

SNAPSHOT_S = 1.0
"""How often the engine's slots and leases are read (seconds; no database involved)."""

METRICS = {
    "agboss_events_total": "counter{kind}: every engine event, by kind",
    "agboss_steps_total": "counter{kind,replayed}: steps and effects answered (replayed: from the store)",
    "agboss_step_seconds": "histogram{kind}: a step's or effect's time, slot wait and store write included",
    "agboss_refused_writes_total": "counter: this instance's writes the store refused (a zombie's, after a takeover)",
    "agboss_store_errors_total": "counter{code}: store calls that failed and were retried, and the metrics' own reads that failed",
    "agboss_handovers_total": "counter{error}: runs this instance stopped because another owns them now",
    "agboss_tree_runs_total": "counter: runs of a tree's root taken up here (a start, a resume, a takeover)",
    "agboss_tree_ends_total": "counter{status}: trees this instance ended",
    "agboss_child_claims_total": "counter: children claimed and run here",
    "agboss_lease_moves_total": "counter{kind}: lease moves this instance made (acquired, taken-over, renewed, lost, released, yielded, reclaimed, finished)",
    "agboss_lease_takeovers_total": "counter: leases this instance took over from another holder",
    "agboss_self_fenced_total": "counter{reason}: leases this instance stopped trusting (lost), by why",
    "agboss_queue_depth": "gauge{state}: children queued, running, waiting, finished",
    "agboss_queue_oldest_waiting_seconds": "gauge: how long the oldest claimable child has waited (0: none)",
    "agboss_wakes_owed": "gauge: parents whose last child finished and nobody woke yet",
    "agboss_trees": "gauge{status}: trees (root records) by status",
    "agboss_step_slots": "gauge{state}: this instance's step slots: busy, waiting, max",
    "agboss_leases_held": "gauge: leases this instance holds now",
    "agboss_children_running": "gauge: children running here now",
}
"""Every metric a worker exposes, with its type, labels and meaning (docs/metrics.md)."""

_CODE = re.compile(r"\[([a-z][a-z0-9_-]*(?:\.[a-z0-9_-]+)+)\]")

_LOST_REASONS = (
    ("refused by the store", "refused-write"),
    ("renewal was refused", "renewal-refused"),
    ("renewal failed", "renewal-failed"),
    ("trust window", "trust-window"),
    ("store refused the", "move-refused"),
    ("could not be reclaimed", "reclaim-refused"),
)


class MetricsUnavailableError(AgbossError):
    """The worker's metrics need `prometheus_client`: install the `metrics` extra
    (`pip install 'agboss-sql[metrics]'`)."""

    code = "metrics.unavailable"


def error_code(error: str | None) -> str:
    """The `AgbossError` code in an error's text (`[store.unavailable] ...`), else
    `other`."""
    found = _CODE.search(error or "")
    return found.group(1) if found else "other"


def lost_reason(reason: str | None) -> str:
    """Why a lease was lost, as a bounded label (`refused-write`, `renewal-refused`,
    `renewal-failed`, `trust-window`, `move-refused`, `reclaim-refused`, `other`)."""
    for words, label in _LOST_REASONS:
        if words in (reason or ""):
            return label
    return "other"


class WorkerMetrics:
    """The metrics of one engine (see the module). Make it before `engine.open()`: it
    chains itself to the engine's `emit`, which the engine hands its parts when it opens.
    Then `await start(port)` serves them over HTTP (`/metrics`) and starts reading the
    database; `await stop()` stops both."""

    def __init__(
        self,
        engine: Engine,
        *,
        url: str | None = None,
        poll_s: float = POLL_S,
        snapshot_s: float = SNAPSHOT_S,
    ) -> None:
        try:
            import prometheus_client as prom
        except ImportError as missing:
            raise MetricsUnavailableError(
                "the worker's metrics need prometheus_client, which is not installed: "
                "`pip install 'agboss-sql[metrics]'` (`pip install '.[metrics]'` in a checkout)"
            ) from missing
        self.engine = engine
        self.url = url if url is not None else engine.url
        self.poll_s = poll_s
        self.snapshot_s = snapshot_s
        self.registry = prom.CollectorRegistry()
        self._prom = prom
        self._define(prom)
        self._emit = engine.emit
        engine.emit = self._chained
        self._tasks: list[asyncio.Task[None]] = []
        self._server: Any = None
        self._thread: Any = None
        self.port: int | None = None
        self._unobserve = observe_lease_moves(self._lease_move)

    def _define(self, prom: Any) -> None:
        def counter(name: str, *labels: str) -> Any:
            return prom.Counter(
                name.removesuffix("_total"), METRICS[name], labels, registry=self.registry
            )

        def gauge(name: str, *labels: str) -> Any:
            return prom.Gauge(name, METRICS[name], labels, registry=self.registry)

        def histogram(name: str, *labels: str) -> Any:
            return prom.Histogram(name, METRICS[name], labels, registry=self.registry)

        self.events = counter("agboss_events_total", "kind")
        self.steps = counter("agboss_steps_total", "kind", "replayed")
        self.step_seconds = histogram("agboss_step_seconds", "kind")
        self.refused = counter("agboss_refused_writes_total")
        self.store_errors = counter("agboss_store_errors_total", "code")
        self.handovers = counter("agboss_handovers_total", "error")
        self.tree_runs = counter("agboss_tree_runs_total")
        self.tree_ends = counter("agboss_tree_ends_total", "status")
        self.claims = counter("agboss_child_claims_total")
        self.lease_moves = counter("agboss_lease_moves_total", "kind")
        self.takeovers = counter("agboss_lease_takeovers_total")
        self.self_fenced = counter("agboss_self_fenced_total", "reason")
        self.queue_depth = gauge("agboss_queue_depth", "state")
        self.oldest_waiting = gauge("agboss_queue_oldest_waiting_seconds")
        self.wakes_owed = gauge("agboss_wakes_owed")
        self.trees = gauge("agboss_trees", "status")
        self.slots = gauge("agboss_step_slots", "state")
        self.leases_held = gauge("agboss_leases_held")
        self.children_running = gauge("agboss_children_running")

    # -- events ------------------------------------------------------------------------

    def _chained(self, event: dict[str, Any]) -> None:
        try:
            self.consume(event)
        except Exception:  # metrics never fail the engine
            logger.warning("could not count the event %r", event.get("kind"), exc_info=True)
        self._emit(event)

    def consume(self, event: dict[str, Any]) -> None:
        """Count one engine event (what `on_event` receives)."""
        kind = str(event.get("kind"))
        self.events.labels(kind).inc()
        if kind in ("step", "effect"):
            self.steps.labels(kind, "true" if event.get("replayed") else "false").inc()
            if isinstance(event.get("ms"), int | float):
                self.step_seconds.labels(kind).observe(event["ms"] / 1000)
        elif kind == "refused":
            self.refused.inc()
        elif kind == "retry":
            self.store_errors.labels(error_code(event.get("error"))).inc()
        elif kind == "handover":
            self.handovers.labels(str(event.get("error"))).inc()
        elif kind == "tree-run":
            self.tree_runs.inc()
        elif kind == "tree-end":
            self.tree_ends.labels(str(event.get("status"))).inc()
        elif kind == "child-run":
            self.claims.inc()

    def _lease_move(self, lease: ExecutionLease, kind: LeaseEventKind, reason: str | None) -> None:
        if lease.holder_instance_id != self.engine.instance_id:
            return  # another engine's, in this process
        self.lease_moves.labels(kind.value).inc()
        if kind is LeaseEventKind.TAKEN_OVER:
            self.takeovers.inc()
        elif kind is LeaseEventKind.LOST:
            self.self_fenced.labels(lost_reason(reason)).inc()

    # -- what is read ------------------------------------------------------------------

    def read_snapshot(self) -> None:
        """Set the slot and lease gauges from `engine.snapshot()` (call on its loop)."""
        snapshot = self.engine.snapshot()
        for state, key in (("busy", "busy"), ("waiting", "waiting"), ("max", "max")):
            self.slots.labels(state).set(snapshot.get(key, 0))
        self.leases_held.set(snapshot.get("leases", 0))
        self.children_running.set(snapshot.get("children", 0))

    async def read_database(self, connection: Any) -> None:
        """One read of the child queue (`SELECT`s only)."""
        from agboss_sql.sql.inspect import queue_view

        queue = await queue_view(connection)
        for state, count in queue.depth.items():
            self.queue_depth.labels(state).set(count)
        self.oldest_waiting.set((queue.oldest_queued_ms or 0) / 1000)
        self.wakes_owed.set(queue.wakes_owed)
        for status in ("queued", "running", "paused", "succeeded", "failed", "cancelled"):
            self.trees.labels(status).set(queue.trees.get(status, 0))

    async def _poll_database(self) -> None:
        from agboss_sql.sql.connection import SqlConnection
        from agboss_sql.sql.migrate import resolve_url

        connection = SqlConnection(resolve_url(self.url), pool_size=1)
        try:
            while True:
                try:
                    await self.read_database(connection)
                except Exception as error:
                    self.store_errors.labels(error_code(str(error))).inc()
                    logger.warning("the metrics could not read the database: %s", error)
                await asyncio.sleep(self.poll_s)
        finally:
            await connection.close()

    async def _poll_snapshot(self) -> None:
        while True:
            try:
                self.read_snapshot()
            except Exception:
                logger.warning("could not read the engine's snapshot", exc_info=True)
            await asyncio.sleep(self.snapshot_s)

    # -- serving -----------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The metrics now, in Prometheus's text format (what `/metrics` answers)."""
        return bytes(self._prom.generate_latest(self.registry))

    async def start(self, port: int | None = None, *, address: str = "0.0.0.0") -> int | None:
        """Start reading the database and the engine's snapshot; with `port`, serve the
        metrics over HTTP on `address:port` (0: any free port). Answers the port served
        on (`None` without one)."""
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._poll_database()),
            loop.create_task(self._poll_snapshot()),
        ]
        if port is not None:
            self._server, self._thread = self._prom.start_http_server(
                port, addr=address, registry=self.registry
            )
            self.port = int(self._server.server_port)
            self.engine.emit({"kind": "metrics", "address": address, "port": self.port})
        return self.port

    async def stop(self) -> None:
        """Stop counting lease moves, reading, and serving."""
        self._unobserve()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except BaseException as error:
                if not isinstance(error, asyncio.CancelledError):
                    logger.warning("a metrics task ended with %r", error)
        self._tasks = []
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


__all__ = [
    "METRICS",
    "POLL_S",
    "SNAPSHOT_S",
    "MetricsUnavailableError",
    "WorkerMetrics",
    "error_code",
    "lost_reason",
]
