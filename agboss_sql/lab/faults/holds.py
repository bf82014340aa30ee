"""Hold points: stop a store operation in a pod at a named point until the harness acts.

`with_hold_points(StoreClass)` is a subclass whose public async methods report to the
pod's `HoldController` (installed by the pod; without one, every call passes straight
through). Each operation has up to four points:

- `before`: the call entered, nothing sent yet (for a fenced effect: before the fence);
- `work`: the store called the `work` it was given (for a fenced effect: after the fence
  and the claim, inside the transaction);
- `after-work`: the work returned, its result not stored, the transaction not committed;
- `after`: the store answered (committed), the caller has not read the answer yet.

A point is armed by the harness with a `StoreHoldPoint` and an optional text the call's
description must contain; the first matching call waits there (bounded: it goes on by
itself after `hold_timeout_s`) until released, or until the harness kills the pod.

The controller also times every call: a call that ends in an error, or takes longer than
`op_bound_ms` (time spent held excluded), is reported as an event, and a call still open
past the bound is reported once as hung.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agboss_sql.contracts.errors import AgbossError
from agboss_sql.contracts.stores import CONTRACTS

WHERE = ("before", "work", "after-work", "after")
"""The points of one operation, in the order a call passes them."""

S = TypeVar("S")

Emit = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class StoreHoldPoint:
    """A point of a store operation: `operation` is `<contract>.<method>` (the contract key
    of `store_conformance`, e.g. `fenced_effect.save_result_if_absent`), `where` one of
    `before`, `work`, `after-work`, `after`."""

    operation: str
    where: str = "before"

    def __post_init__(self) -> None:
        if self.where not in WHERE:
            raise ValueError(f"where must be one of {', '.join(WHERE)}, got {self.where!r}")
        if "." not in self.operation:
            raise ValueError(
                f"operation is '<contract>.<method>' (e.g. fenced_effect.save_result_if_absent), "
                f"got {self.operation!r}"
            )

    @property
    def name(self) -> str:
        """`<contract>.<method>:<where>`, the point's name in events and commands."""
        return f"{self.operation}:{self.where}"

    @classmethod
    def parse(cls, text: str) -> StoreHoldPoint:
        """The point named `<contract>.<method>:<where>`."""
        operation, _, where = text.partition(":")
        return cls(operation, where or "before")


BEFORE_FENCE = StoreHoldPoint("fenced_effect.save_result_if_absent", "before")
"""A fenced effect before its transaction began (nothing locked)."""
BEFORE_WORK = StoreHoldPoint("fenced_effect.save_result_if_absent", "work")
"""A fenced effect between the fence and the work (the lease row is locked)."""
AFTER_WORK = StoreHoldPoint("fenced_effect.save_result_if_absent", "after-work")
"""A fenced effect after its work, before its result is stored and committed."""
AFTER_COMMIT = StoreHoldPoint("fenced_effect.save_result_if_absent", "after")
"""A fenced effect after COMMIT, before its caller read the answer."""


@dataclass
class _Armed:
    hold_id: str
    point: str
    contains: str | None
    count: int


@dataclass
class _Open:
    op: str
    started: float
    wall_started: int
    held_s: float = 0.0
    holding: bool = False
    reported: bool = False


@dataclass
class HoldController:
    """A pod's side of the hold points and of the operation timing (one per process)."""

    emit: Emit
    hold_timeout_s: float = 120.0
    op_bound_ms: int = 15_000
    _armed: list[_Armed] = field(default_factory=list)
    _waiting: dict[str, asyncio.Event] = field(default_factory=dict)
    _open: dict[int, _Open] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    count: int = 0
    max_ms: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    stopping: bool = False
    _gate: asyncio.Event | None = None
    _gate_id: str | None = None
    _settled: asyncio.Event | None = None

    # -- commands from the harness ------------------------------------------------------

    def arm(self, hold_id: str, point: str, contains: str | None = None, count: int = 1) -> None:
        """Hold the next `count` calls reaching `point` whose description contains
        `contains`."""
        StoreHoldPoint.parse(point)
        self._armed.append(_Armed(hold_id, point, contains, count))

    def disarm(self, hold_id: str) -> None:
        """Hold no further call for `hold_id` (calls held now stay held until released)."""
        self._armed = [a for a in self._armed if a.hold_id != hold_id]

    def release(self, hold_id: str) -> None:
        """Let the call held for `hold_id` go on (or, for a quiesce, every call it held)."""
        event = self._waiting.pop(hold_id, None)
        if event is not None:
            event.set()
        if self._gate is not None and self._gate_id == hold_id:
            self._gate.set()
            self._gate = self._gate_id = None

    async def quiesce(self, hold_id: str, timeout_s: float) -> None:
        """Hold every call that starts from now at its `before` point, wait until every
        call in flight has ended or is held, then report `quiet` (or `quiet-timeout` after
        `timeout_s`). `release(hold_id)` lets them all go. A pod frozen when quiet holds no
        transaction open: what blocks the others then is its lease alone."""
        self._gate = asyncio.Event()
        self._gate_id = hold_id
        try:
            async with asyncio.timeout(timeout_s):
                while any(not o.holding for o in self._open.values()):
                    self._settled = asyncio.Event()
                    await self._settled.wait()
        except TimeoutError:
            busy = sorted(o.op for o in self._open.values() if not o.holding)
            self.emit({"kind": "quiet-timeout", "hold": hold_id, "busy": busy})
            return
        self.emit({"kind": "quiet", "hold": hold_id})

    def _settle(self) -> None:
        if self._settled is not None:
            self._settled.set()

    def release_all(self) -> None:
        """Disarm everything and let every held call go on (a stopping pod)."""
        self.stopping = True
        self._armed.clear()
        if self._gate is not None:
            self._gate.set()
            self._gate = self._gate_id = None
        for event in self._waiting.values():
            event.set()
        self._waiting.clear()

    # -- calls from the wrapped stores --------------------------------------------------

    async def reach(self, key: int, point: str, describe: str) -> None:
        """A call reached `point`: wait there if an armed hold matches it (bounded)."""
        gate = self._gate
        if gate is not None and point.endswith(":before") and not self.stopping:
            await self._wait(key, gate)
        chosen = None
        for armed in self._armed:
            if (
                armed.point == point
                and armed.count > 0
                and (armed.contains is None or armed.contains in describe)
            ):
                chosen = armed
                break
        if chosen is None or self.stopping:
            return
        chosen.count -= 1
        if chosen.count <= 0:
            self._armed.remove(chosen)
        event = asyncio.Event()
        self._waiting[chosen.hold_id] = event
        self.emit({"kind": "held", "hold": chosen.hold_id, "point": point, "call": describe})
        if await self._wait(key, event):
            self.emit({"kind": "hold-released", "hold": chosen.hold_id, "point": point})
        else:
            self._waiting.pop(chosen.hold_id, None)
            self.emit({"kind": "hold-timeout", "hold": chosen.hold_id, "point": point})

    async def _wait(self, key: int, event: asyncio.Event) -> bool:
        """Wait (held, not timed as the call's own) until `event` is set; False when
        `hold_timeout_s` ended first."""
        began = time.monotonic()
        found = self._open.get(key)
        if found is not None:
            found.holding = True
            self._settle()
        try:
            await asyncio.wait_for(event.wait(), self.hold_timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            if found is not None:
                found.holding = False
                found.held_s += time.monotonic() - began

    def opened(self, op: str) -> int:
        key = next(self._ids)
        self._open[key] = _Open(op, time.monotonic(), time.time_ns() // 1_000_000)
        return key

    def closed(self, key: int, error: BaseException | None) -> None:
        found = self._open.pop(key, None)
        self._settle()
        if found is None:
            return
        ms = (time.monotonic() - found.started - found.held_s) * 1000
        self.count += 1
        self.max_ms = max(self.max_ms, ms)
        end = time.time_ns() // 1_000_000
        if error is not None and not isinstance(error, asyncio.CancelledError):
            name = type(error).__name__
            self.errors[name] = self.errors.get(name, 0) + 1
            self.emit(
                {
                    "kind": "op-error",
                    "op": found.op,
                    "ms": round(ms, 1),
                    "error": name,
                    "typed": isinstance(error, AgbossError),
                    "code": getattr(error, "code", None),
                    "message": str(error)[:300],
                    "start": found.wall_started,
                    "end": end,
                    # Where an untyped error came from: the audit names it as a defect.
                    **({} if isinstance(error, AgbossError) else {"where": _where(error)}),
                }
            )
        if ms > self.op_bound_ms:
            self.emit(
                {
                    "kind": "op-slow",
                    "op": found.op,
                    "ms": round(ms, 1),
                    "start": found.wall_started,
                    "end": end,
                }
            )

    def hung(self) -> list[dict[str, Any]]:
        """The open calls past the bound not reported yet (each is reported once)."""
        now = time.monotonic()
        found = []
        for item in self._open.values():
            ms = (now - item.started - item.held_s) * 1000
            if not item.reported and not item.holding and ms > self.op_bound_ms:
                item.reported = True
                found.append(
                    {
                        "kind": "op-hung",
                        "op": item.op,
                        "ms": round(ms, 1),
                        "start": item.wall_started,
                    }
                )
        return found

    def stats(self) -> dict[str, Any]:
        """What the pod's calls did: how many, the slowest, the errors by type, how many
        are still open."""
        return {
            "kind": "op-stats",
            "count": self.count,
            "max_ms": round(self.max_ms, 1),
            "errors": dict(self.errors),
            "open": len(self._open),
        }


def _where(error: BaseException) -> list[str]:
    """The last frames `error` passed through, and the errors it was raised from."""
    frames = traceback.extract_tb(error.__traceback__)[-6:]
    where = [f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in frames]
    cause = error.__cause__ or error.__context__
    if cause is not None:
        where.append(f"from {type(cause).__name__}: {str(cause)[:200]}")
    return where


_controller: HoldController | None = None


def install(controller: HoldController | None) -> None:
    """Make `controller` this process's hold controller (`None` removes it)."""
    global _controller
    _controller = controller


def controller() -> HoldController | None:
    """This process's hold controller, if a pod installed one."""
    return _controller


def _contract_of(cls: type) -> str:
    for base in cls.__mro__:
        for key, contract in CONTRACTS.items():
            if base is contract:
                return key
    return cls.__name__


def describe_call(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """A short text naming what a call is about (a key's step, an execution id), for
    matching holds and for events."""
    parts: list[str] = []
    for value in (*args, *kwargs.values()):
        if callable(value):
            continue
        step = getattr(value, "step", None)
        if step is not None and hasattr(step, "idempotency_key"):
            parts.append(f"{step.execution_id}/{step.idempotency_key}/{getattr(value, 'name', '')}")
        elif hasattr(value, "execution_id"):
            parts.append(str(value.execution_id))
        elif hasattr(value, "child_execution_id"):
            parts.append(str(value.child_execution_id))
        elif isinstance(value, (str, int)):
            parts.append(str(value))
    return " ".join(parts)[:300]


def _wrap(operation: str, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    takes_work = "work" in inspect.signature(method).parameters

    @functools.wraps(method)
    async def held(self: Any, *args: Any, **kwargs: Any) -> Any:
        control = _controller
        if control is None:
            return await method(self, *args, **kwargs)
        describe = describe_call(args, kwargs)
        key = control.opened(operation)
        error: BaseException | None = None
        try:
            await control.reach(key, f"{operation}:before", describe)
            if takes_work:
                args, kwargs = _with_held_work(control, key, operation, describe, args, kwargs)
            answer = await method(self, *args, **kwargs)
            await control.reach(key, f"{operation}:after", describe)
            return answer
        except BaseException as exc:
            error = exc
            raise
        finally:
            control.closed(key, error)

    return held


def _with_held_work(
    control: HoldController,
    key: int,
    operation: str,
    describe: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    def wrap(work: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
        async def held_work(tx: Any) -> Any:
            await control.reach(key, f"{operation}:work", describe)
            value = await work(tx)
            await control.reach(key, f"{operation}:after-work", describe)
            return value

        return held_work

    if "work" in kwargs:
        return args, {**kwargs, "work": wrap(kwargs["work"])}
    if len(args) >= 2 and callable(args[1]):
        return (args[0], wrap(args[1]), *args[2:]), kwargs
    return args, kwargs


def with_hold_points(store_class: type[S]) -> type[S]:
    """A subclass of `store_class` whose public async methods can be held at their
    `before`, `work`, `after-work` and `after` points by the pod's `HoldController`, and
    are timed by it. Without a controller (outside a pod) it behaves as `store_class`."""
    contract = _contract_of(store_class)
    namespace: dict[str, Any] = {
        "__module__": store_class.__module__,
        "__doc__": store_class.__doc__,
    }
    for name in dir(store_class):
        if name.startswith("_") or name == "ping":
            continue
        method = getattr(store_class, name)
        if inspect.iscoroutinefunction(method):
            namespace[name] = _wrap(f"{contract}.{name}", method)
    held: type[S] = type(f"Held{store_class.__name__}", (store_class,), namespace)
    return held


__all__ = [
    "AFTER_COMMIT",
    "AFTER_WORK",
    "BEFORE_FENCE",
    "BEFORE_WORK",
    "WHERE",
    "HoldController",
    "StoreHoldPoint",
    "controller",
    "describe_call",
    "install",
    "with_hold_points",
]
