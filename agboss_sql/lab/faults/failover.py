"""The failover scenario: the fault suite's pods on a PostgreSQL primary and its streaming
standby (`dialects/postgresql/replica.sh`), the primary SIGKILLed mid-run and the standby
promoted (`pg_ctl promote`).

The pods connect with the URL naming both servers and `target_session_attrs=read-write`:
a new connection skips the dead primary and the standby until it is promoted. The run is
audited as every scenario is (no epoch granted twice, no effect run twice, every tree
ends), the pods' own reports included, which a promoted standby that lost acknowledged
commits no longer shows; and it measures the time from the primary's death to the
first lease granted after it.

    python -m agboss_sql.lab.faults.failover --runs 10 [--async] [--script PATH]

Each run makes a fresh pair (the script), runs the scenario, and stops the pair.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agboss_sql.lab.faults.holds import BEFORE_FENCE
from agboss_sql.lab.faults.run import FaultSettings, ScenarioRun
from agboss_sql.lab.faults.scenarios import FIRST_TREE, Hold, Scenario
from agboss_sql.lab.faults.suite import ScenarioResult, run_scenario

SCRIPT = "dialects/postgresql/replica.sh"
PROMOTE_BOUND_S = 60
"""`pg_ctl promote -w` waits at most this long for the standby to take writes."""
SCRIPT_BOUND_S = 180
"""A pair's making (initdb, base backup, the standby streaming) ends within this."""
GRANTS = ("tree-run", "child-run")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class ReplicaPair:
    """The pair `replica.sh` made under `directory`: its primary's and standby's data
    directories, and the PostgreSQL binaries that run them (as the postgres user when
    this process is root)."""

    directory: Path
    bin_dir: Path = Path(os.environ.get("AGBOSS_PG_BIN", "/usr/lib/postgresql/15/bin"))

    @property
    def primary(self) -> Path:
        return self.directory / "primary"

    @property
    def standby(self) -> Path:
        return self.directory / "standby"

    def pid_of(self, data: Path) -> int:
        """The postmaster's pid of `data` (its `postmaster.pid`)."""
        return int((data / "postmaster.pid").read_text().split()[0])

    def kill_primary(self) -> int:
        """SIGKILL the primary's postmaster and every process it forked, at once (frozen
        first so it forks no more): its sessions end with it, as on a machine that died.
        The time of death (host ms)."""
        pid = self.pid_of(self.primary)
        # Listed first, while it runs, so that no session answers between the first kill
        # and the last; listed again once it is frozen, for those forked meanwhile.
        children = _children_of(pid)
        os.kill(pid, signal.SIGSTOP)
        died = _now_ms()
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        for child in _children_of(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
        return died

    def promote(self) -> int:
        """`pg_ctl promote -w` on the standby: returns (host ms) once it takes writes."""
        command = [str(self.bin_dir / "pg_ctl"), "promote", "-w", "-t", str(PROMOTE_BOUND_S)]
        command += ["-D", str(self.standby)]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=PROMOTE_BOUND_S + 10)
        return _now_ms()


def _children_of(pid: int) -> list[int]:
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and _parent_of(entry) == pid
    ]


def _parent_of(entry: Path) -> int | None:
    try:
        stat = (entry / "stat").read_text()
    except OSError:
        return None
    # pid (comm) state ppid …: comm may hold spaces, so split after its closing paren.
    return int(stat.rsplit(")", 1)[1].split()[1])


@dataclass
class FailoverFault:
    """The scenario's fault (the harness's `NetworkFault`): the pods reach the pair by its
    URL unchanged; the act kills and promotes through it and records what it measured."""

    pair: ReplicaPair
    died_ms: int | None = None
    promoted_ms: int | None = None
    first_grant_ms: int | None = None
    first_effect_ms: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    def url_for_pod(self, index: int, url: str) -> str:
        return url

    def close(self) -> None:
        return None


def _act(run: ScenarioRun) -> None:
    fault = run.network
    assert isinstance(fault, FailoverFault)
    try:
        # Mid-run: a pod holds the first tree's first effect (before its transaction); the
        # others go on writing (their trees, children, leases) meanwhile.
        run.held("failover")
        fault.died_ms = fault.pair.kill_primary()
        fault.promoted_ms = fault.pair.promote()
        # What the pods report after the promotion was answered by the new primary (one
        # reported in the few ms after the kill may be the old one's last answer).
        mark_ms = fault.promoted_ms
        run.release_everywhere("failover")
        granted = run.wait(
            lambda e: e.get("kind") in GRANTS and int(e.get("t", 0)) >= mark_ms,
            "a lease granted after the standby was promoted (a tree or a child run)",
        )
        fault.first_grant_ms = int(granted["t"])
        effect = run.wait(
            lambda e: e.get("kind") == "effect" and int(e.get("t", 0)) >= mark_ms,
            "an effect stored after the standby was promoted",
        )
        fault.first_effect_ms = int(effect["t"])
    finally:
        fault.events = run.cluster.events  # the run's list, read once the run is over


def failover_scenario(pair: ReplicaPair, faults: list[FailoverFault]) -> Scenario:
    """The scenario on `pair`; each run's fault is appended to `faults`."""

    def fault_for(url: str) -> FailoverFault:
        fault = FailoverFault(pair)
        faults.append(fault)
        return fault

    return Scenario(
        name="failover",
        doc="SIGKILL the PostgreSQL primary mid-run and promote its standby: the pods "
        "reconnect to the new primary (the URL names both servers, "
        "target_session_attrs=read-write), no epoch is granted twice, no effect runs twice, "
        "every tree ends",
        act=_act,
        holds=(Hold("failover", BEFORE_FENCE, f"{FIRST_TREE}/s1/"),),
        dialects=("postgresql",),
        tags=("long", "replica"),
        network=fault_for,
    )


@dataclass
class FailoverRun:
    """One run: the scenario's result and what it measured (ms)."""

    result: ScenarioResult
    mode: str
    promote_ms: float | None
    first_grant_ms: float | None
    first_effect_ms: float | None
    lost_grants: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "passed": self.result.passed,
            "violations": [str(v) for v in self.result.violations],
            "seconds": round(self.result.seconds, 1),
            "promote_ms": self.promote_ms,
            "first_grant_ms": self.first_grant_ms,
            "first_effect_ms": self.first_effect_ms,
            "lost_grants": self.lost_grants,
            "untyped_errors": self.result.untyped_errors,
        }


def _lost_grants(url: str, events: list[dict[str, Any]]) -> list[str]:
    """The grants the pods reported that the database shows no trace of: the lease log has
    no such grant (the same epoch of the same tree or child to the same pod) and the lease
    row is below that epoch, or at it with another holder. Acknowledged commits a promoted
    standby never received. (A grant whose log write failed, its lease row kept, is not
    one; one superseded since, its row at a later epoch, is not counted.)"""
    from agboss_sql.lab.faults.audit import GRANTS as LOGGED
    from agboss_sql.lab.faults.audit import read_sql_history

    history = read_sql_history(url)
    logged = {
        (str(e["execution_id"]), int(e["lease_epoch"]), str(e["instance_id"]))
        for e in history.lease_events
        if e["kind"] in LOGGED
    }
    rows = {
        str(r["execution_id"]): (int(r["lease_epoch"]), str(r["holder_instance_id"]))
        for r in history.leases
    }
    reported = {
        (
            str(e["tree"] if e["kind"] == "tree-run" else e["child"]),
            int(e["epoch"]),
            str(e.get("pod")),
        )
        for e in events
        if e.get("kind") in GRANTS and e.get("epoch") is not None
    }
    lost = []
    for what, epoch, pod in sorted(reported - logged):
        row_epoch, holder = rows.get(what, (0, ""))
        if row_epoch < epoch or (row_epoch == epoch and holder != pod):
            lost.append(f"{what}@{epoch} to {pod}")
    return lost


def run_failover(
    script: str | Path = SCRIPT,
    *,
    asynchronous: bool = False,
    directory: str | Path | None = None,
    settings: FaultSettings | None = None,
) -> FailoverRun:
    """One run on a fresh pair made by `script` (synchronous, or asynchronous
    replication), stopped after."""
    where = Path(directory or os.environ.get("AGBOSS_REPLICA_DIR") or ".replica").resolve()
    env = {**os.environ, "AGBOSS_REPLICA_DIR": str(where)}
    made = subprocess.run(
        ["bash", str(script), "start", *(["--async"] if asynchronous else [])],
        env=env,
        capture_output=True,
        text=True,
        timeout=SCRIPT_BOUND_S,
    )
    if made.returncode != 0 or not made.stdout.strip():
        raise RuntimeError(f"{script} failed: {made.stderr.strip().splitlines()[-1:]}")
    url = made.stdout.strip().splitlines()[-1]
    faults: list[FailoverFault] = []
    try:
        result = run_scenario(url, failover_scenario(ReplicaPair(where), faults), settings=settings)
        fault = faults[-1]
        lost = _lost_grants(url, list(fault.events))
    finally:
        subprocess.run(
            ["bash", str(script), "stop"], env=env, capture_output=True, timeout=SCRIPT_BOUND_S
        )

    def since_death(at: int | None) -> float | None:
        return None if at is None or fault.died_ms is None else float(at - fault.died_ms)

    return FailoverRun(
        result=result,
        mode="async" if asynchronous else "sync",
        promote_ms=since_death(fault.promoted_ms),
        first_grant_ms=since_death(fault.first_grant_ms),
        first_effect_ms=since_death(fault.first_effect_ms),
        lost_grants=lost,
    )


def _summary(runs: list[FailoverRun]) -> str:
    def spread(values: list[float | None]) -> str:
        found = sorted(v for v in values if v is not None)
        if not found:
            return "-"
        return f"median {statistics.median(found):.0f} ms, {found[0]:.0f}-{found[-1]:.0f} ms"

    failed = [r for r in runs if not r.result.passed]
    lines = [
        f"failover ({runs[0].mode}): {len(runs)} runs, {len(failed)} with violations",
        f"  primary killed -> standby promoted: {spread([r.promote_ms for r in runs])}",
        f"  primary killed -> first lease granted after the promotion: "
        f"{spread([r.first_grant_ms for r in runs])}",
        f"  primary killed -> first effect stored after the promotion: "
        f"{spread([r.first_effect_ms for r in runs])}",
        f"  runs with grants the database shows no trace of: "
        f"{sum(1 for r in runs if r.lost_grants)}",
    ]
    for number, run in enumerate(runs, 1):
        for violation in run.result.violations:
            lines.append(f"  run {number}: {violation}")
        if run.lost_grants:
            lines.append(f"  run {number}: grants lost by the promotion: {run.lost_grants}")
        for untyped in run.result.untyped_errors:
            lines.append(f"  run {number}: untyped error {untyped}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the failover scenario `--runs` times; exit 1 when any run broke a promise."""
    parser = argparse.ArgumentParser(
        prog="python -m agboss_sql.lab.faults.failover", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument(
        "--async",
        dest="asynchronous",
        action="store_true",
        help="asynchronous replication (default: synchronous)",
    )
    parser.add_argument("--script", default=SCRIPT, help=f"the pair's script ({SCRIPT})")
    parser.add_argument("--json", metavar="PATH", help="write every run's figures there")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    runs: list[FailoverRun] = []
    for number in range(1, args.runs + 1):
        run = run_failover(args.script, asynchronous=args.asynchronous)
        runs.append(run)
        print(f"run {number}: {json.dumps(run.as_dict())}", flush=True)
    print(_summary(runs), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([r.as_dict() for r in runs], indent=1) + "\n")
    return 0 if all(r.result.passed for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["FailoverFault", "FailoverRun", "ReplicaPair", "failover_scenario", "run_failover"]
