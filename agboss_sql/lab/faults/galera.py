"""Losing a Galera node: the fault suite's pods spread over the three nodes of the test
cluster (`dialects/galera/ready.sh`), one node SIGKILLed, frozen past the group's suspect
timeout, or restarted by state transfer while the pods run; then the suite's audit.

    python -m agboss_sql.lab.faults.galera --rounds 10 [--scenario node-kill ...] URL URL URL

Pod `pod-K` (K = 1..3) connects to node K, with the other nodes as its `failover`
alternates (`mysql://…node K…?failover=node K+1,node K+2`): when its node is gone, its new
connections go to the next node that is in the primary component and Synced. The victim is
always node 2 (pod-2's); the harness resets, waits on and audits through node 1. Every
scenario checks, besides the suite's rules:

- `quorum`: the two survivors form a primary component of 2 within `QUORUM_BOUND_S`, and
  keep it;
- `failover`: the victim's pod is answered by a surviving node within `FAILOVER_BOUND_S`
  of the fault (a `ping` through its own store connection);
- `rejoin` (freeze and rejoin scenarios): the victim is back, Synced in a cluster of 3,
  within `REJOIN_BOUND_S`; after a rejoin a new pod on it is answered by it.

After each run the victim is restarted (if it is down) and the cluster is of 3 Synced
nodes again before the next run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from agboss_sql.lab._nodes import node_url
from agboss_sql.lab.faults.holds import AFTER_COMMIT, AFTER_WORK, BEFORE_FENCE, BEFORE_WORK
from agboss_sql.lab.faults.run import FaultSettings, ScenarioRun
from agboss_sql.lab.faults.scenarios import Hold, Scenario
from agboss_sql.lab.faults.suite import ScenarioResult, format_report, run_scenario

QUORUM_BOUND_S = 45.0
"""How long the survivors may take to form a primary component of 2: the node's loss is
noticed within `evs.suspect_timeout` (10 s in ready.sh), at most `evs.inactive_timeout`
(30 s), and a loaded machine adds to both."""
FAILOVER_BOUND_S = 60.0
"""How long the victim's pod may take to be answered by a surviving node: its open calls
end within their bounds (4 s statements, 3 s connects, 4 s of retries), and a freeze holds
every node's commits until the frozen one is evicted (`QUORUM_BOUND_S`)."""
REJOIN_BOUND_S = 150.0
"""How long a node may take to rejoin: a restarted one waits for the eviction of its
previous self (up to `evs.inactive_timeout`), then transfers the state."""
SETTLE_S = 10.0
"""How long a thawed cluster must stay 3 Synced nodes in one view before `restore` returns.
A node frozen for about `evs.suspect_timeout` (10 s in ready.sh) answers "Synced" in the
old view after SIGCONT while the others finish evicting it: seen here, the view changed 4 s
after the thaw and the node left service to rejoin. One suspect timeout covers the
install that was under way when the node woke."""
VICTIM = 2


def _checkout() -> Path:
    """The checkout whose `dialects/galera` scripts run the cluster: this module's, or (an
    installed wheel, as tox runs it) the working directory."""
    mine = Path(__file__).resolve().parents[3]
    return mine if (mine / "dialects" / "galera" / "ready.sh").is_file() else Path.cwd()


SCRIPTS = _checkout() / "dialects" / "galera"


class NodeError(RuntimeError):
    """A node could not be signalled or started (its pid file names no server of it, or
    `ready.sh --node` failed): the message says which and why."""


@dataclass
class GaleraNodes:
    """The three nodes of the test cluster: their URLs (node 1 first), signalled by the pid
    in each node's pid file, only when that pid is a server started with that node's own
    config file (as `stop.sh` checks)."""

    urls: list[str]
    directory: Path = field(
        default_factory=lambda: Path(
            os.environ.get("AGBOSS_GALERA_DIR") or SCRIPTS.parents[1] / ".galera"
        )
    )
    scripts: Path = SCRIPTS

    def __post_init__(self) -> None:
        if len(self.urls) != 3:
            raise ValueError(f"give the 3 nodes' URLs (ready.sh prints them), got {self.urls}")

    def port(self, node: int) -> int:
        port = sa.make_url(self.urls[node - 1]).port
        if port is None:
            raise ValueError(f"node {node}'s URL names no port: {self.urls[node - 1]}")
        return port

    def url_with_failover(self, node: int) -> str:
        """Node `node`'s URL, the next nodes (in turn) as its `failover` alternates (as
        `agboss-sql cluster` gives its workers)."""
        return node_url(self.urls, node - 1)

    def pid(self, node: int) -> int | None:
        """The running server of `node`, or `None` when none runs."""
        node_dir = self.directory / f"node{node}"
        try:
            pid = int((node_dir / "mysqld.pid").read_text().strip())
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            return None
        return pid if f"--defaults-file={node_dir}/my.cnf" in command else None

    def signal(self, node: int, sig: signal.Signals) -> int:
        pid = self.pid(node)
        if pid is None:
            raise NodeError(f"node {node} runs no server of this cluster (see {self.directory})")
        os.kill(pid, sig)
        return pid

    def kill(self, node: int) -> None:
        """SIGKILL `node`'s server and wait (bounded) until it is gone."""
        pid = self.signal(node, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and _not_zombie(pid):
            if time.monotonic() > deadline:
                raise NodeError(f"node {node} (pid {pid}) still runs 30 s after SIGKILL")
            time.sleep(0.05)

    def start(self, node: int, *, sst: bool = False) -> subprocess.Popen[bytes]:
        """Start `node` alone (`ready.sh --node`, with `--sst` a full state transfer); the
        process ends once the node is Synced (or failed)."""
        command = ["bash", str(self.scripts / "ready.sh"), "--node", str(node)]
        return subprocess.Popen(
            [*command, *(["--sst"] if sst else [])],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "AGBOSS_GALERA_DIR": str(self.directory)},
        )

    def status(self, node: int, bound_s: float = 3.0) -> dict[str, str] | None:
        """`node`'s wsrep status (cluster size and status, ready, local state), or `None`
        when it does not answer within `bound_s`."""
        import pymysql

        url = sa.make_url(self.urls[node - 1])
        try:
            raw = pymysql.connect(
                host=url.host,
                port=self.port(node),
                user=url.username or "root",
                password=url.password or "",
                connect_timeout=bound_s,
                read_timeout=bound_s,
                write_timeout=bound_s,
            )
        except pymysql.MySQLError:
            return None
        try:
            with raw.cursor() as cursor:
                cursor.execute(
                    "SHOW STATUS WHERE Variable_name IN ('wsrep_cluster_size', "
                    "'wsrep_cluster_status', 'wsrep_ready', 'wsrep_local_state_comment', "
                    "'wsrep_cluster_conf_id')"
                )
                return {str(k).lower(): str(v) for k, v in cursor.fetchall()}
        except pymysql.MySQLError:
            return None
        finally:
            with contextlib.suppress(Exception):
                raw.close()

    def wait_until(
        self,
        nodes: Sequence[int],
        check: Callable[[dict[str, str]], bool],
        bound_s: float,
        *,
        held_s: float = 0.0,
    ) -> float | None:
        """Seconds until every node of `nodes` answered a status passing `check`, all in
        one view (the same `wsrep_cluster_conf_id`), and kept doing so for `held_s`; `None`
        when `bound_s` ran out first."""
        began = time.monotonic()
        since: float | None = None
        while True:
            statuses = [self.status(n) for n in nodes]
            views = {s.get("wsrep_cluster_conf_id") for s in statuses if s is not None}
            now = time.monotonic()
            if all(s is not None and check(s) for s in statuses) and len(views) == 1:
                since = now if since is None else since
                if now - since >= held_s:
                    return since - began
            else:
                since = None
            if now - began > bound_s:
                return None
            time.sleep(0.2)

    def restore(self, bound_s: float = REJOIN_BOUND_S, *, thawed: bool = False) -> None:
        """Every node running again (a stopped one thawed, a gone one restarted) and the
        cluster of 3 Synced nodes; `NodeError` otherwise. After a thaw (here, or by the
        caller: `thawed`) the cluster must also stay so for `SETTLE_S`, past the eviction
        a long freeze leads to."""
        for node in (1, 2, 3):
            pid = self.pid(node)
            if pid is not None:
                thawed = thawed or _stopped(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        for node in (1, 2, 3):
            if self.pid(node) is None:
                process = self.start(node)
                try:
                    _, err = process.communicate(timeout=bound_s + 60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    raise NodeError(
                        f"node {node} did not restart within {bound_s + 60:.0f} s"
                    ) from None
                if process.returncode != 0:
                    raise NodeError(f"ready.sh --node {node} failed: {err.decode()[-400:]}")
        held_s = SETTLE_S if thawed else 0.0
        if self.wait_until((1, 2, 3), _synced_of(3), bound_s, held_s=held_s) is None:
            raise NodeError(f"the cluster is not 3 Synced nodes {bound_s:.0f} s after a restore")


def _stopped(pid: int) -> bool:
    """Whether `pid` is stopped by a signal (SIGSTOP): its state is `T`."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "T"
    except OSError:
        return False


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _synced_of(size: int) -> Callable[[dict[str, str]], bool]:
    def check(status: dict[str, str]) -> bool:
        return (
            status.get("wsrep_cluster_size") == str(size)
            and status.get("wsrep_cluster_status") == "Primary"
            and status.get("wsrep_local_state_comment") == "Synced"
        )

    return check


@dataclass
class NodeFacts:
    """What a node scenario measured (seconds from the fault) and the rules it found broken."""

    quorum_s: float | None = None
    failover_s: float | None = None
    rejoin_s: float | None = None
    served_by_rejoined: bool | None = None
    state_transfer: str | None = None
    victim_errors: dict[str, int] = field(default_factory=dict)
    """The victim pod's failed calls up to the quorum, by error type (all typed, or the
    audit's `no-hang` says which was not)."""
    failures: list[str] = field(default_factory=list)


def _ping_until_served(
    run: ScenarioRun, pod_index: int, ports: set[int], bound_s: float
) -> float | None:
    """Seconds until the pod's store connection is answered by a server on one of `ports`
    (a ping a second, each waited up to 10 s); `None` when `bound_s` ran out."""
    from agboss_sql.lab.faults.harness import WaitTimeout

    pod = run.cluster.pods[pod_index]
    began = time.monotonic()
    while time.monotonic() - began < bound_s:
        mark = run.cluster.mark()
        run.cluster.send(pod, {"cmd": "ping"})
        try:
            answer = run.cluster.wait_for(
                lambda e: e.get("pod") == pod.instance_id and e.get("kind") == "pong",
                10,
                f"{pod.instance_id}'s ping",
                since=mark,
            )
        except WaitTimeout:
            continue
        if answer.get("port") in ports:
            return time.monotonic() - began
        time.sleep(1.0)  # the next ping a second later (a pause between tries, not a wait)
    return None


def _measure_loss(run: ScenarioRun, nodes: GaleraNodes, facts: NodeFacts, began: float) -> None:
    """The victim's pod served by a survivor, then the survivors' quorum, each timed from
    `began` (the fault); the victim pod's errors so far, by type."""
    survivors = [n for n in (1, 2, 3) if n != VICTIM]
    served = _ping_until_served(
        run, VICTIM - 1, {nodes.port(n) for n in survivors}, FAILOVER_BOUND_S
    )
    if served is None:
        facts.failures.append(
            f"failover: pod-{VICTIM} was not answered by a surviving node within "
            f"{FAILOVER_BOUND_S:.0f} s"
        )
    else:
        facts.failover_s = time.monotonic() - began
    quorum = nodes.wait_until(survivors, _primary_of(2), QUORUM_BOUND_S)
    if quorum is None:
        facts.failures.append(
            f"quorum: nodes {survivors} did not form a primary component of 2 within "
            f"{QUORUM_BOUND_S:.0f} s"
        )
    else:
        facts.quorum_s = time.monotonic() - began
    for event in run.cluster.snapshot():
        if event.get("kind") == "op-error" and event.get("pod") == f"pod-{VICTIM}":
            name = str(event.get("error"))
            facts.victim_errors[name] = facts.victim_errors.get(name, 0) + 1


def _primary_of(size: int) -> Callable[[dict[str, str]], bool]:
    def check(status: dict[str, str]) -> bool:
        return (
            status.get("wsrep_cluster_size") == str(size)
            and status.get("wsrep_cluster_status") == "Primary"
            and status.get("wsrep_ready") == "ON"
        )

    return check


def node_scenarios(nodes: GaleraNodes, facts: NodeFacts) -> dict[str, Scenario]:
    """The node-loss scenarios on `nodes`, each recording what it measured in `facts`."""

    def kill(run: ScenarioRun) -> None:
        # pod-2 holds a fenced effect's transaction open on node 2, its work written.
        run.held("node-kill")
        began = time.monotonic()
        nodes.kill(VICTIM)
        run.release_everywhere("node-kill")
        _measure_loss(run, nodes, facts, began)

    def freeze(run: ScenarioRun) -> None:
        run.held("node-freeze")
        began = time.monotonic()
        nodes.signal(VICTIM, signal.SIGSTOP)
        try:
            run.release_everywhere("node-freeze")
            _measure_loss(run, nodes, facts, began)
        finally:
            nodes.signal(VICTIM, signal.SIGCONT)
        thawed = time.monotonic()
        back = nodes.wait_until((1, 2, 3), _synced_of(3), REJOIN_BOUND_S)
        if back is None:
            facts.failures.append(
                f"rejoin: node {VICTIM} was not back Synced in a cluster of 3 within "
                f"{REJOIN_BOUND_S:.0f} s of SIGCONT"
            )
        else:
            facts.rejoin_s = time.monotonic() - thawed

    def rejoin(sst: bool) -> Callable[[ScenarioRun], None]:
        def act(run: ScenarioRun) -> None:
            run.held("node-rejoin")
            began = time.monotonic()
            nodes.kill(VICTIM)
            run.release_everywhere("node-rejoin")
            _measure_loss(run, nodes, facts, began)
            # The node restarts while the pods run; pod-1 keeps tree-1-1's lease (held
            # before its third step, renewing) until a new pod is served by the node.
            restarted = time.monotonic()
            process = nodes.start(VICTIM, sst=sst)
            try:
                _, err = process.communicate(timeout=REJOIN_BOUND_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
                facts.failures.append(
                    f"rejoin: node {VICTIM} not Synced {REJOIN_BOUND_S:.0f} s after its restart"
                )
                return
            if process.returncode != 0:
                facts.failures.append(f"rejoin: ready.sh --node {VICTIM}: {err.decode()[-300:]}")
                return
            facts.rejoin_s = time.monotonic() - restarted
            facts.state_transfer = _last_transfer(nodes, VICTIM)
            newcomer = run.cluster.add(
                {
                    **_config_of(run, 0),
                    "instance_id": "pod-4",
                    "trees": [],
                    "holds": [],
                }
            )
            served = _ping_until_served(run, newcomer.index, {nodes.port(VICTIM)}, FAILOVER_BOUND_S)
            facts.served_by_rejoined = served is not None
            if served is None:
                facts.failures.append(
                    f"rejoin: a new pod on node {VICTIM} was not answered by it within "
                    f"{FAILOVER_BOUND_S:.0f} s of its Synced"
                )
            run.release_everywhere("rejoin-keep")

        return act

    # The victim's hold is its pod's first fenced effect, whichever tree it runs (a tree of
    # its own may be run by another pod: a recovery sweep can take it first).
    victim = VICTIM - 1
    return {
        "node-kill": Scenario(
            name="node-kill",
            doc="SIGKILL node 2 while pod-2 holds a fenced effect's transaction open on it "
            "(its work written, before COMMIT): pod-2's calls end typed within their bounds, "
            "its new connections go to a surviving node, nodes 1 and 3 keep quorum",
            act=kill,
            holds=(Hold("node-kill", AFTER_WORK, None, pod=victim),),
            dialects=("mysql",),
            tags=("galera", "long"),
        ),
        "node-freeze": Scenario(
            name="node-freeze",
            doc="SIGSTOP node 2 (pod-2 inside a fenced effect on it, between fence and work) "
            "until nodes 1 and 3 evicted it past evs.suspect_timeout and pod-2 is served by a "
            "survivor, then SIGCONT: node 2 rejoins by itself",
            act=freeze,
            holds=(Hold("node-freeze", BEFORE_WORK, None, pod=victim),),
            dialects=("mysql",),
            tags=("galera", "long"),
        ),
        "node-rejoin-ist": Scenario(
            name="node-rejoin-ist",
            doc="SIGKILL node 2 right after pod-2's COMMIT on it, restart it while the pods "
            "run: it rejoins by incremental state transfer, and a new pod on it is served",
            act=rejoin(sst=False),
            holds=(
                Hold("node-rejoin", AFTER_COMMIT, None, pod=victim),
                Hold("rejoin-keep", BEFORE_FENCE, "tree-1-1/s3/", pod=0),
            ),
            dialects=("mysql",),
            tags=("galera", "long"),
        ),
        "node-rejoin-sst": Scenario(
            name="node-rejoin-sst",
            doc="as node-rejoin-ist, its grastate.dat deleted before the restart: it rejoins "
            "by a full state transfer (rsync, from a donor serving pods)",
            act=rejoin(sst=True),
            holds=(
                Hold("node-rejoin", BEFORE_FENCE, None, pod=victim),
                Hold("rejoin-keep", BEFORE_FENCE, "tree-1-1/s3/", pod=0),
            ),
            dialects=("mysql",),
            tags=("galera", "long"),
        ),
    }


NODE_SCENARIOS = ("node-kill", "node-freeze", "node-rejoin-ist", "node-rejoin-sst")


def _config_of(run: ScenarioRun, index: int) -> dict[str, Any]:
    return dict(run.cluster.configs[index])


def _last_transfer(nodes: GaleraNodes, node: int) -> str:
    """`IST` or `SST`: how `node` received its state at its last start (its error log)."""
    log = nodes.directory / f"node{node}" / "error.log"
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "unknown"
    last = text[text.rfind("Starting MariaDB") :]
    if "Local state: 00000000-0000-0000-0000-000000000000:-1" in last:
        return "SST"  # no position of its own: the whole state was copied
    return "IST" if "IST received" in last else "unknown"


@dataclass
class NodeResult:
    """One run of a node scenario: the suite's result and what the node faults measured."""

    result: ScenarioResult
    facts: NodeFacts

    @property
    def passed(self) -> bool:
        return self.result.passed and not self.facts.failures


def run_node_scenario(
    nodes: GaleraNodes,
    name: str,
    *,
    settings: FaultSettings | None = None,
    failover: bool = True,
) -> NodeResult:
    """Run the node scenario `name` once (the cluster restored first and after). Without
    `failover` each pod is given its node alone (no alternates): the `failover` check must
    then fail, which shows it can."""
    facts = NodeFacts()
    scenario = node_scenarios(nodes, facts)[name]
    nodes.restore()
    try:
        result = run_scenario(
            nodes.urls[0],
            scenario,
            settings=settings or FaultSettings(),
            url_for_pod=lambda index, _url: (
                nodes.url_with_failover(_NODE_OF_POD.get(index, 1))
                if failover
                else nodes.urls[_NODE_OF_POD.get(index, 1) - 1]
            ),
        )
    finally:
        nodes.restore()
    return NodeResult(result, facts)


_NODE_OF_POD = {0: 1, 1: 2, 2: 3, 3: VICTIM}
"""pod-1..pod-3 on nodes 1..3; pod-4 (started after a rejoin) on the rejoined node."""


def format_node_report(results: Sequence[NodeResult]) -> str:
    """The suite's table, then per scenario the node figures (median and max) and every
    node rule broken."""
    lines = [format_report([r.result for r in results], title="Galera node loss")]
    by: dict[str, list[NodeResult]] = {}
    for r in results:
        by.setdefault(r.result.scenario, []).append(r)
    for name, runs in by.items():
        parts = []
        for label, values in (
            ("quorum of 2", [r.facts.quorum_s for r in runs]),
            ("pod-2 served by a survivor", [r.facts.failover_s for r in runs]),
            ("rejoined", [r.facts.rejoin_s for r in runs]),
        ):
            seen = sorted(v for v in values if v is not None)
            if seen:
                parts.append(f"{label} {seen[len(seen) // 2]:.1f} s median, {seen[-1]:.1f} s max")
        transfers = sorted({r.facts.state_transfer for r in runs if r.facts.state_transfer})
        if transfers:
            parts.append("state transfer " + "/".join(transfers))
        lines.append(f"{name}: " + "; ".join(parts))
        lines += [f"  {name}: {failure}" for r in runs for failure in r.facts.failures]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m agboss_sql.lab.faults.galera [--rounds N] [--scenario S ...] URL URL URL`:
    exit 0 when every run passed."""
    parser = argparse.ArgumentParser(prog="python -m agboss_sql.lab.faults.galera")
    parser.add_argument("urls", nargs="+", help="the three nodes' URLs (ready.sh prints them)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each scenario")
    parser.add_argument("--scenario", action="append", choices=NODE_SCENARIOS, help="default: all")
    parser.add_argument(
        "--no-failover",
        action="store_true",
        help="give each pod its node alone, without alternates (the failover check fails)",
    )
    args = parser.parse_args(argv)
    urls = [u for item in args.urls for u in item.split() if u]
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    nodes = GaleraNodes(urls)
    results: list[NodeResult] = []
    for round_ in range(args.rounds):
        for name in args.scenario or NODE_SCENARIOS:
            found = run_node_scenario(nodes, name, failover=not args.no_failover)
            results.append(found)
            verdict = "passed" if found.passed else "FAILED"
            print(
                f"round {round_ + 1} {name}: {verdict} in {found.result.seconds:.0f} s "
                f"{found.facts}",
                flush=True,
            )
            for violation in found.result.violations:
                print(f"  {violation}", flush=True)
    print(format_node_report(results), flush=True)
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
