"""`run_scenario` (one scenario, real pods, then the audit) and `fault_suite` (a pytest
class with one test per scenario)."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from agboss_sql.lab.faults.audit import (
    AuditFacts,
    Violation,
    audit,
    never_submitted,
    read_sql_history,
)
from agboss_sql.lab.faults.harness import (
    Cluster,
    UrlForPod,
    WaitTimeout,
)
from agboss_sql.lab.faults.run import FaultSettings, ScenarioRun
from agboss_sql.lab.faults.scenarios import SCENARIOS, SHORT_SET, Scenario

DEFAULT_STORES = "agboss_sql.lab.faults.fixture:sql_store_set"
DUMP_ENV = "AGBOSS_FAULT_DUMP_DIR"


@dataclass
class ScenarioResult:
    """What one run of a scenario found."""

    scenario: str
    violations: list[Violation]
    seconds: float
    time_to_error_ms: list[float]
    untyped_errors: list[str]
    run_dir: Path | None = None
    pids: list[int] = field(default_factory=list)
    """The pods' process ids (every one ended before the result was made)."""
    unsubmitted: list[str] = field(default_factory=list)
    """Trees whose pod the scenario killed or stopped before their submit returned: never
    promised, so neither waited for nor expected (`never_submitted`)."""

    @property
    def passed(self) -> bool:
        return not self.violations


def dialect_of(url: str) -> str:
    """`sqlite`, `postgresql` or `mysql` for a database URL."""
    name = sa.make_url(url).get_backend_name()
    return "mysql" if name in ("mysql", "mariadb") else name


def reset_database(url: str) -> None:
    """The project's schema (and the business table) on `url`, with every row deleted."""
    from agboss_sql.lab.database import business_metadata, create_schema
    from agboss_sql.sql.migrate import sync_url
    from agboss_sql.sql.schema import metadata

    create_schema(url)
    engine = sa.create_engine(sync_url(url))
    try:
        with engine.begin() as connection:
            for meta in (business_metadata, metadata):
                for table in reversed(meta.sorted_tables):
                    connection.execute(sa.delete(table))
    finally:
        engine.dispose()


def _wait_for_trees(cluster: Cluster, url: str, trees: list[str], bound_s: float) -> set[str]:
    """The trees that had not ended when `bound_s` ran out. A tree has ended when a pod
    reported it done or its record is `succeeded` in the database: a pod killed right after
    the COMMIT that completed a tree never reports it, and the database is what the audit
    trusts."""
    from agboss_sql.sql.migrate import sync_url

    deadline = time.monotonic() + bound_s
    missing = set(trees)
    engine = sa.create_engine(sync_url(url))
    try:
        while missing:
            slice_s = min(1.0, max(0.0, deadline - time.monotonic()))
            missing = cluster.wait_all(
                lambda e: e.get("tree") if e.get("kind") == "tree-done" else None,
                missing,
                slice_s,
                "every tree to end",
            )
            if missing:
                missing -= _records_of(engine, missing, status="succeeded")
            if time.monotonic() >= deadline:
                break
    finally:
        engine.dispose()
    return missing


def _records_of(engine: sa.Engine, trees: Iterable[str], status: str | None = None) -> set[str]:
    """Those of `trees` that have an execution record (in `status`, if given)."""
    from agboss_sql.sql.schema import execution_records

    query = sa.select(execution_records.c.execution_id).where(
        execution_records.c.execution_id.in_(sorted(trees))
    )
    if status is not None:
        query = query.where(execution_records.c.status == status)
    with engine.connect() as connection:
        return {row[0] for row in connection.execute(query)}


def _recorded(url: str, trees: list[str]) -> set[str]:
    """Those of `trees` that have an execution record."""
    from agboss_sql.sql.migrate import sync_url

    engine = sa.create_engine(sync_url(url))
    try:
        return _records_of(engine, trees)
    finally:
        engine.dispose()


def _configs(settings: FaultSettings, stores: str, scenario: Scenario) -> list[dict[str, Any]]:
    origin = time.time_ns() // 1_000_000
    trees = {
        f"pod-{p + 1}": [f"tree-{p + 1}-{k}" for k in range(settings.trees_per_pod)]
        for p in range(settings.pods)
    }
    every = [t for group in trees.values() for t in group]
    configs = []
    for index, (instance_id, own) in enumerate(trees.items()):
        configs.append(
            {
                "instance_id": instance_id,
                "stores": stores,
                "time_scale": settings.time_scale,
                "origin_ms": origin,
                "lease_ms": settings.lease_ms,
                "poll_ms": settings.poll_ms,
                "op_bound_ms": settings.op_bound_ms,
                "hold_timeout_s": settings.hold_timeout_s,
                "shutdown_s": max(1.0, settings.shutdown_s - 2),
                "trees": own,
                "all_trees": every,
                "children": settings.children,
                "pause_trees": [t for t in every if t.endswith("-0")],
                "holds": [h.command() for h in scenario.holds if h.pod in (None, index)],
                "pieces": settings.pieces,
            }
        )
    return configs


def run_scenario(
    url: str,
    scenario: Scenario | str,
    *,
    stores: str = DEFAULT_STORES,
    settings: FaultSettings | None = None,
    url_for_pod: UrlForPod | None = None,
    dump_dir: str | Path | None = None,
    keep: bool = False,
) -> ScenarioResult:
    """Run one scenario on `url`: reset the database, start the pods (each on
    `url_for_pod(index, url)` when given), drive the fault, let every tree end, stop the
    pods, and audit. Every pod is killed before this returns, whatever happened. A failed
    run's events, store history and pod output go to `dump_dir` (default: the
    `AGBOSS_FAULT_DUMP_DIR` environment variable); with `keep`, a passed run's too."""
    if isinstance(scenario, str):
        scenario = SCENARIOS[scenario]
    if scenario.probe is not None:
        began = time.monotonic()
        found = scenario.probe(url)
        return ScenarioResult(
            scenario=scenario.name,
            violations=[Violation(scenario.name, detail) for detail in found],
            seconds=time.monotonic() - began,
            time_to_error_ms=[],
            untyped_errors=[],
        )
    settings = settings or FaultSettings()
    dump = dump_dir if dump_dir is not None else os.environ.get(DUMP_ENV) or None
    reset_database(url)
    run_dir = Path(tempfile.mkdtemp(prefix=f"agboss-faults-{scenario.name}-"))
    configs = _configs(settings, stores, scenario)
    trees = [t for c in configs for t in c["trees"]]
    network = scenario.network(url) if scenario.network is not None else None
    if network is not None:
        url_for_pod = network.url_for_pod
    cluster = Cluster(run_dir, url, configs, url_for_pod=url_for_pod)
    run = ScenarioRun(cluster, settings, network)
    began = time.monotonic()
    violations: list[Violation] = []
    unfinished: set[str] = set()
    unsubmitted: list[str] = []
    try:
        cluster.start()
        try:
            scenario.act(run)
        except WaitTimeout as error:
            violations.append(Violation("no-hang", f"{scenario.name}: {error}"))
        for hold in scenario.holds:
            run.release_everywhere(hold.hold_id)
        # A tree whose pod the scenario killed or stopped before its record committed was
        # never submitted: no pod can take it over, so it is not waited for (nor expected).
        ended = set(cluster.killed) | set(run.terminated)
        if ended:
            owners = {tree: c["instance_id"] for c in configs for tree in c["trees"]}
            unsubmitted = never_submitted(
                trees, owners, ended, _recorded(url, trees), cluster.snapshot()
            )
        unfinished = _wait_for_trees(
            cluster, url, [t for t in trees if t not in unsubmitted], settings.tree_bound_s
        )
        for pod in cluster.pods:
            if pod.alive and not cluster.stop(pod, settings.shutdown_s):
                run.slow_stops.append(pod.instance_id)
    finally:
        cluster.close()
        if network is not None:
            network.close()
    events = cluster.snapshot()
    history = read_sql_history(url)
    facts = AuditFacts(
        trees=trees,
        children_per_tree=settings.children,
        freezes=[(f.pod, f.start, f.end) for f in cluster.freezes],
        zombies=run.zombies,
        unfinished=sorted(unfinished),
        slow_stops=run.slow_stops,
        terminated=run.terminated,
        op_bound_ms=settings.op_bound_ms,
        unsubmitted=unsubmitted,
    )
    violations += audit(history, events, facts)
    errors = [e for e in events if e.get("kind") == "op-error"]
    result = ScenarioResult(
        scenario=scenario.name,
        violations=violations,
        seconds=time.monotonic() - began,
        time_to_error_ms=[float(e["ms"]) for e in errors],
        untyped_errors=sorted({f"{e['op']}: {e['error']}" for e in errors if not e.get("typed")}),
        pids=[p.process.pid for p in cluster.pods if p.process is not None],
        unsubmitted=unsubmitted,
    )
    if (violations or keep) and dump:
        target = Path(dump) / f"{scenario.name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        shutil.copytree(run_dir, target, dirs_exist_ok=True)
        history.dump(target / "store-history.json")
        (target / "violations.txt").write_text(
            "\n".join(str(v) for v in violations) + "\n", encoding="utf-8"
        )
        result.run_dir = target
    with contextlib.suppress(OSError):
        shutil.rmtree(run_dir)
    return result


def p99(values: Sequence[float]) -> float | None:
    """The 99th percentile (nearest rank), or `None` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def format_report(results: Iterable[ScenarioResult], *, title: str = "fault suite") -> str:
    """A table: scenario, runs, failed runs, violations, p99 time-to-error, then each
    violation and each untyped error seen."""
    by: dict[str, list[ScenarioResult]] = {}
    for result in results:
        by.setdefault(result.scenario, []).append(result)
    lines = [
        title,
        f"{'scenario':<22} {'runs':>4} {'failed':>6} {'violations':>10} {'p99 time-to-error':>18} {'p99 run':>8}",
    ]
    notes: list[str] = []
    for name, runs in by.items():
        failed = sum(1 for r in runs if not r.passed)
        count = sum(len(r.violations) for r in runs)
        tte = p99([ms for r in runs for ms in r.time_to_error_ms])
        run_s = p99([r.seconds for r in runs])
        lines.append(
            f"{name:<22} {len(runs):>4} {failed:>6} {count:>10} "
            f"{'-' if tte is None else f'{tte:.0f} ms':>18} {run_s or 0:>7.0f}s"
        )
        for r in runs:
            notes += [f"  {name}: {v}" for v in r.violations]
            if r.run_dir is not None:
                notes.append(f"  {name}: dumped to {r.run_dir}")
        untyped = sorted({u for r in runs for u in r.untyped_errors})
        notes += [f"  {name}: untyped error {u}" for u in untyped]
    return "\n".join(lines + notes)


def fault_suite(
    *,
    name: str,
    url: str | Callable[[], str],
    stores: str = DEFAULT_STORES,
    scenarios: Iterable[str] | None = None,
    time_scale: float = 10.0,
    pods: int = 3,
    settings: FaultSettings | None = None,
    url_for_pod: UrlForPod | None = None,
) -> type:
    """A pytest class (`Test<Name>Faults`) with one test per scenario
    (`test_<scenario>`): each runs the scenario with `pods` real processes on the store set
    made by the factory at `stores` (`module:function`, called in each pod as
    `factory(url, pod_identity)`), and fails with every audit violation found.

    `url` is the database URL (or a callable giving it at test time, e.g. reading a
    fixture's environment); `scenarios` a subset of `SCENARIOS` (default: all that run on
    the URL's dialect); `time_scale` speeds the pods' clocks up; `url_for_pod` gives each
    pod its own URL (a per-pod proxy for network faults)."""
    import pytest

    if not 2 <= pods <= 8:
        raise ValueError(f"pods must be 2..8 (a fault needs a pod to take over), got {pods}")
    chosen = list(scenarios) if scenarios is not None else list(SHORT_SET)
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}: the scenarios are {', '.join(SCENARIOS)}")
    base = settings or FaultSettings()
    base = FaultSettings(**{**base.__dict__, "time_scale": time_scale, "pods": pods})
    parts = [p for p in "".join(c if c.isalnum() else " " for c in name).split() if p]
    class_name = "Test" + "".join(p[0].upper() + p[1:] for p in parts) + "Faults"
    namespace: dict[str, Any] = {
        "__doc__": f"Fault scenarios on the store set {name!r}",
        "__test__": True,
    }

    def make(scenario: Scenario) -> Callable[[Any], None]:
        def test(self: Any) -> None:
            target = url() if callable(url) else url
            if not scenario.runs_on(dialect_of(target)):
                pytest.skip(f"{scenario.name} does not run on {dialect_of(target)}")
            result = run_scenario(
                target, scenario, stores=stores, settings=base, url_for_pod=url_for_pod
            )
            if not result.passed:
                pytest.fail(
                    format_report([result], title=f"{name}: {scenario.name}"), pytrace=False
                )

        test.__name__ = "test_" + scenario.name.replace("-", "_")
        test.__doc__ = scenario.doc
        return test

    for scenario_name in chosen:
        scenario = SCENARIOS[scenario_name]
        namespace["test_" + scenario.name.replace("-", "_")] = make(scenario)
    import sys

    namespace["__module__"] = str(sys._getframe(1).f_globals.get("__name__", __name__))
    return type(class_name, (), namespace)


__all__ = [
    "DEFAULT_STORES",
    "DUMP_ENV",
    "FaultSettings",
    "ScenarioResult",
    "ScenarioRun",
    "dialect_of",
    "fault_suite",
    "format_report",
    "p99",
    "reset_database",
    "run_scenario",
]
