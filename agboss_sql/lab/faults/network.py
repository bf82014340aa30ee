"""Network faults for the fault suite's pods: one `TcpProxy` per pod, driven from a
synchronous harness.

`ProxyFleet` runs the pods' proxies on an event loop of its own (a thread of the harness's
process) and answers through a blocking API. It is the harness's network fault: give
`fleet.url_for_pod` to `run_scenario(url_for_pod=…)` (each pod then reaches the database
only through its own proxy), and drive the faults per pod (`index`, 0-based, as the
harness numbers pods; `None`: every pod).

The network scenarios (`NETWORK_SCENARIO_ACTS`, built into the harness's `Scenario`s by
`network_scenarios()`) find their fleet through the run's `url_for_pod`; run one with
`run_network_scenario(url, name)`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from agboss_sql.lab.faults.proxy import After, TcpProxy
from agboss_sql.lab.faults.scenarios import Scenario
from agboss_sql.lab.faults.suite import ScenarioResult, run_scenario

T = TypeVar("T")

_CALL_BOUND_S = 30.0  # every blocking call into the fleet's loop ends within this
EFFECT_MARKER = "agboss_fenced_effect_results"  # a statement only fenced effects send


class ProxyFleet:
    """One loopback `TcpProxy` per pod, on an event loop in a thread of this process.

    Every method blocks until the fault is in place (a drop: the open connections reset)
    and is bounded in time. Use as a context manager, or `close()` it."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._proxies: dict[int, TcpProxy] = {}
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="agboss-proxy-fleet", daemon=True
        )
        self._thread.start()
        self._closed = False

    def _call(self, factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
        if self._closed:
            raise RuntimeError("the proxy fleet is closed")
        future = asyncio.run_coroutine_threadsafe(factory(), self._loop)
        return future.result(_CALL_BOUND_S)

    def url_for_pod(self, index: int, url: str) -> str:
        """`url` as pod `index` reaches it: through its own proxy (made on first call)."""

        async def make() -> str:
            proxy = self._proxies.get(index)
            if proxy is None:
                proxy = await TcpProxy.for_url(url).start()
                self._proxies[index] = proxy
            return proxy.url_for(url)

        return self._call(make)

    def _chosen(self, index: int | None) -> list[TcpProxy]:
        if index is None:
            return list(self._proxies.values())
        if index not in self._proxies:
            raise KeyError(f"pod {index} has no proxy (ask url_for_pod first)")
        return [self._proxies[index]]

    def _each(self, index: int | None, act: Callable[[TcpProxy], Any]) -> None:
        async def run() -> None:
            for proxy in self._chosen(index):
                result = act(proxy)
                if asyncio.iscoroutine(result):
                    await result

        self._call(run)

    def pass_through(self, index: int | None = None) -> None:
        """Heal: new connections pass, no latency, no armed cut."""
        self._each(index, TcpProxy.pass_through)

    def drop(self, index: int | None = None) -> None:
        """Reset open connections and refuse new ones until healed."""
        self._each(index, TcpProxy.drop)

    def reset_connections(self, index: int | None = None) -> None:
        """Reset the open connections once."""
        self._each(index, TcpProxy.reset_connections)

    def blackhole(self, index: int | None = None) -> None:
        """Never answer nor close any connection, open or new, until healed."""
        self._each(index, TcpProxy.blackhole)

    def set_latency(self, ms: float, index: int | None = None) -> None:
        """Deliver every chunk `ms` late, both ways."""
        self._each(index, lambda proxy: proxy.set_latency(ms))

    def cut_at_commit(
        self,
        index: int,
        *,
        deliver: bool,
        after: After = "reset",
        count: int = 1,
        marker: str | None = None,
    ) -> None:
        """Cut the connection of pod `index`'s next `count` COMMITs (`deliver`: the COMMIT
        reaches the server and commits; else it never does), of transactions that sent a
        statement holding `marker` when given."""
        self._each(
            index,
            lambda proxy: proxy.cut_at_commit(
                deliver=deliver, after=after, count=count, marker=marker
            ),
        )

    def wait_cut(self, index: int, timeout_s: float) -> bool:
        """Block until pod `index`'s armed cut was made (True) or `timeout_s` passed."""
        bound = min(timeout_s, _CALL_BOUND_S - 1)

        async def wait() -> bool:
            return await self._chosen(index)[0].wait_cut(bound)

        return self._call(wait)

    def stats(self, index: int) -> dict[str, Any]:
        async def read() -> dict[str, Any]:
            return self._chosen(index)[0].stats()

        return self._call(read)

    def close(self) -> None:
        """Close every proxy (resetting what still goes through them) and stop the loop."""
        if self._closed:
            return

        async def close_all() -> None:
            for proxy in self._proxies.values():
                await proxy.close()

        try:
            self._call(close_all)
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_CALL_BOUND_S)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> ProxyFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- scenarios ------------------------------------------------------------------------------
#
# Each act gets the harness's run (`ScenarioRun`: `run.cluster`, `run.wait(match, what)`)
# and finds the fleet behind the run's `url_for_pod`. Pod 0 ("pod-1") is the one cut off.


def fleet_of(run: Any) -> ProxyFleet:
    """The `ProxyFleet` whose `url_for_pod` the run's pods were started with."""
    fleet = getattr(run.cluster.url_for_pod, "__self__", None)
    if not isinstance(fleet, ProxyFleet):
        raise RuntimeError("a network scenario needs its pods behind a ProxyFleet")
    return fleet


def _first_effect(run: Any) -> None:
    run.wait(
        lambda e: e.get("kind") == "effect" and e.get("pod_index") == 0, "pod-1's first effect"
    )


def _trees_running(run: Any, pod_index: int) -> set[str]:
    """The trees the pod said it runs and has not yet said it ended or gave up."""
    running: set[str] = set()
    for event in run.cluster.snapshot():
        if event.get("pod_index") != pod_index:
            continue
        if event.get("kind") == "tree-run":
            running.add(event["tree"])
        elif event.get("kind") in ("tree-done", "handover"):
            running.discard(event["tree"])
    return running


def _cut_off(fault: Callable[[ProxyFleet], None], what: str) -> Callable[[Any], None]:
    def act(run: Any) -> None:
        fleet = fleet_of(run)
        _first_effect(run)
        mark = run.cluster.mark()
        running = _trees_running(run, 0)
        fault(fleet)
        if running:
            # Pod 1 learns of it from its own calls, within their bounds, and gives its
            # trees up (its keeper fences itself); the others take them over.
            run.wait(
                lambda e: e.get("pod_index") == 0 and e.get("kind") == "handover",
                f"pod-1 to give a tree up while {what}",
                since=mark,
            )
        else:
            # Pod 1 runs no tree (a loaded machine let the others take its trees before
            # it started): its calls must still end, typed, within their bounds.
            run.wait(
                lambda e: (
                    e.get("pod_index") == 0
                    and e.get("kind") == "op-error"
                    and str(e.get("code")).startswith("store.")
                ),
                f"a call of pod-1 to end with a typed store error while {what}",
                since=mark,
            )
        fleet.pass_through(0)

    return act


def _latency(run: Any) -> None:
    fleet = fleet_of(run)
    fleet.set_latency(20)
    _first_effect(run)


def _commit_cut(deliver: bool) -> Callable[[Any], None]:
    def act(run: Any) -> None:
        fleet = fleet_of(run)
        _first_effect(run)
        # A fenced effect's COMMIT, not a new connection's set-up one.
        fleet.cut_at_commit(0, deliver=deliver, after="reset", marker=EFFECT_MARKER)
        if not fleet.wait_cut(0, 25):
            raise AssertionError("pod-1 sent no COMMIT through its proxy within 25 s")
        fleet.pass_through(0)

    return act


NETWORK_SCENARIO_ACTS: dict[str, tuple[str, Callable[[Any], None]]] = {
    "net-drop": (
        "every connection of a pod reset and new ones refused: its calls fail typed "
        "(StoreUnavailableError), its keeper fences itself, the others take its trees over",
        _cut_off(lambda fleet: fleet.drop(0), "its connections are dropped"),
    ),
    "net-blackhole": (
        "a pod's connections black-holed (read, never answered): each call ends within its "
        "bound, its keeper fences itself, the others take its trees over",
        _cut_off(lambda fleet: fleet.blackhole(0), "its connections are black-holed"),
    ),
    "net-latency": (
        "20 ms added each way on every pod's connections: every tree ends, nothing doubled",
        _latency,
    ),
    "net-commit-lost": (
        "a pod's COMMIT never reaches the server and its connection is reset: the outcome "
        "is unknown to it; the step runs once in the end",
        _commit_cut(False),
    ),
    "net-reply-lost": (
        "a pod's COMMIT commits and its reply is lost: the outcome is unknown to it; the "
        "step is replayed, never charged twice",
        _commit_cut(True),
    ),
}
"""The network scenarios: name -> (what it proves, the harness's act)."""


def network_scenarios() -> dict[str, Scenario]:
    """The network scenarios as the fault suite's `Scenario`s (server databases only)."""
    return {
        name: Scenario(
            name=name,
            doc=doc,
            act=act,
            dialects=("postgresql", "mysql"),
            tags=("network",),
            network=_fleet_for,
        )
        for name, (doc, act) in NETWORK_SCENARIO_ACTS.items()
    }


def _fleet_for(url: str) -> ProxyFleet:
    """A network scenario's fault: a fresh fleet (the harness closes it after the run)."""
    return ProxyFleet()


def run_network_scenario(url: str, name: str, **kwargs: Any) -> ScenarioResult:
    """Run the network scenario `name` on `url` (the fault suite's `run_scenario`, each
    pod behind its own proxy); its `ScenarioResult`."""
    return run_scenario(url, network_scenarios()[name], **kwargs)


__all__ = [
    "NETWORK_SCENARIO_ACTS",
    "ProxyFleet",
    "fleet_of",
    "network_scenarios",
    "run_network_scenario",
]
