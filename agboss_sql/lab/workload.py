"""What a cluster run is given: its settings (`ClusterConfig`) and its workload — the app
its workers load and the runs to start (`ClusterWorkload`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from agboss_sql.lab._nodes import node_url, nodes_problem
from agboss_sql.lab.faults.audit import StoreHistory, Violation


@dataclass(frozen=True)
class ClusterConfig:
    """One cluster run. `chaos` turns the cancel, the kill and the freeze on (the cancel
    alone with `cancel=True, chaos=False`)."""

    url: str
    workers: int = 3
    trees: int = 20
    fan_out: int = 2
    depth: int = 2
    pause_every: int = 5
    lease_ms: int = 3_000
    max_concurrent_steps: int = 4
    step_ms: int = 100
    chaos: bool = True
    cancel: bool = True
    timeout_s: float = 240.0
    shutdown_s: float = 15.0
    run_dir: Path | None = None
    migrate: bool = True
    """Migrate the database first (off for a test database made from the schema)."""
    nodes: tuple[str, ...] = ()
    """The nodes of a cluster of MySQL/MariaDB servers (Galera), `url` first: worker `i`
    connects to node `i mod n`, the next nodes as its `failover` alternates (`node_url`).
    Empty: every worker on `url`."""

    def __post_init__(self) -> None:
        for what in ("workers", "trees", "fan_out", "lease_ms", "max_concurrent_steps"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{what} must be a positive int, got {value!r}")
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth!r}")
        if self.nodes:
            problem = nodes_problem(self.nodes)
            if problem is not None:
                raise ValueError(problem)
            if self.nodes[0] != self.url:
                raise ValueError(f"url must be the first node ({self.nodes[0]}), got {self.url}")
        if self.chaos and self.workers < 3:
            raise ValueError("chaos needs at least 3 workers: one killed, one frozen, one sane")


@dataclass(frozen=True)
class ClusterRun:
    """One run the cluster starts: its workflow, input and id."""

    workflow: str
    input: Any
    id: str


@dataclass(frozen=True)
class ClusterWorkload:
    """What the cluster runs: the app the workers load (`module:attr`), the runs to start
    (`runs(config, run_id)`), how far the work is (`progress(history)`, 0 to 1: the chaos
    is timed by it), and the workload's own audit rules, if any."""

    name: str
    app: str
    runs: Callable[[ClusterConfig, str], list[ClusterRun]]
    progress: Callable[[sa.Connection, list[ClusterRun]], float] | None = None
    audit: Callable[[StoreHistory, list[ClusterRun]], list[Violation]] | None = None
    business_table: bool = False
    """The workload writes the lab's business table (created before the run)."""


__all__ = ["ClusterConfig", "ClusterRun", "ClusterWorkload", "node_url", "nodes_problem"]
