"""Assembly of an application's store providers, the backend-layout checks, and readiness.

    async with Application(name="support", providers=[*sql_stores()],
                           values={DatabaseUrl: DatabaseUrl(url)}) as app:
        leases = app.store(ExecutionLeaseRepository)
        report = await app.check_readiness()

(or `await app.start()` ... `await app.close()`).

A contract with no listed provider gets its `InMemory*` default. A provider's
dependencies are resolved from its constructor's annotations: `SqlConnection`
(created once per application instance, never listed), `Clock`, `StoreClock`,
`ApplicationContext`, `InMemoryBackend`, and any type given in `values`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from agboss_sql.contracts.clocks import Clock, StoreClock, SystemClock
from agboss_sql.contracts.errors import (
    AssemblyError,
    FencedEffectStoreMismatchError,
    StoreUnavailableError,
)
from agboss_sql.contracts.stores import (
    CONTRACTS,
    ExecutionLeaseRepository,
    FencedEffectRepository,
    FencingStore,
    OutboundCallRepository,
    Store,
)
from agboss_sql.contracts.types import ApplicationContext, LeaseCheck
from agboss_sql.memory import InMemoryBackend, memory_stores
from agboss_sql.sql import sql_stores
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.migrate import DEFAULT_DATABASE_URL, require_head, resolve_url

S = TypeVar("S")

logger = logging.getLogger("agboss_sql.application")

READINESS_TIMEOUT_S = 2.0


class DatabaseUrl(str):
    """A value type for `values=`: the URL of the application's SQL database."""

    __slots__ = ()


def _contract_of(provider: type[Any]) -> type[Any] | None:
    for contract in CONTRACTS.values():
        if issubclass(provider, contract):
            return contract
    try:
        from langgraph.checkpoint.base import BaseCheckpointSaver
    except ImportError:  # pragma: no cover - LangGraph is an optional extra
        return None
    if issubclass(provider, BaseCheckpointSaver):
        return BaseCheckpointSaver
    return None


def _name(cls: type[Any]) -> str:
    return cls.__name__


class HealthStatus(StrEnum):
    UP = "up"
    DEGRADED = "degraded"
    """Serving, but a load balancer should prefer another instance (e.g. every step slot
    is busy)."""
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class ComponentHealth:
    """One store's readiness: its status, how long its ping took, and why it failed."""

    name: str
    status: HealthStatus
    latency_ms: float
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ReadinessReport:
    """The application's readiness: up only when every component is up; degraded when none
    is down and one is degraded; else down."""

    status: HealthStatus
    components: tuple[ComponentHealth, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        lines = [f"readiness: {self.status}"]
        for c in self.components:
            suffix = f" ({c.error})" if c.error else ""
            lines.append(f"  {c.name}: {c.status} in {c.latency_ms:.1f} ms{suffix}")
        return "\n".join(lines)


class _UnlistedFencingStore:
    """The in-memory default of a fencing contract beside leases on another backend: it
    assembles (an application that never fences need not list one), and its first call fails."""

    lease_check = LeaseCheck.ATOMIC

    def __init__(self, contract: type[Any], lease_store: Store) -> None:
        self.contract = contract
        self.backend = "in-memory"
        self._lease_store = lease_store

    async def ping(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or not hasattr(self.contract, name):
            raise AttributeError(name)

        async def refused(*_args: Any, **_kwargs: Any) -> Any:
            raise FencedEffectStoreMismatchError(
                f"{_name(self.contract)} has no listed provider, so it is the in-memory default, "
                f"but the leases are {_name(type(self._lease_store))} on backend "
                f"{self._lease_store.backend!r}: its lease check cannot be atomic. List a "
                f"{_name(self.contract)} on backend {self._lease_store.backend!r} in providers="
            )

        return refused


class Application:
    """An application instance: its stores, built from `providers` (defaults in memory).

    Build one per instance; `start()` assembles and checks the layout, raising one
    `AssemblyError` that lists every violation, and refuses a SQL database whose schema
    is not at the head revision (`SchemaNotReadyError`; `require_schema=False` skips that
    check); `close()` closes the connections it created. `async with Application(...) as
    app:` does both around the block."""

    def __init__(
        self,
        name: str,
        providers: Sequence[type[Any]] = (),
        values: Mapping[Any, Any] | None = None,
        *,
        strict: bool = False,
        instance_id: str | None = None,
        require_schema: bool = True,
    ) -> None:
        self.name = name
        self.providers = tuple(providers)
        self.values: dict[Any, Any] = dict(values or {})
        self.strict = strict
        self.require_schema = require_schema
        self.instance_id = instance_id or f"{name}-{uuid.uuid4().hex[:12]}"
        self.context = ApplicationContext(instance_id=self.instance_id, name=name)
        self._stores: dict[type[Any], Any] = {}
        self._components: dict[str, Callable[[], ComponentHealth]] = {}
        self._owned_connections: list[Any] = []
        self._started = False

    # --- assembly ---------------------------------------------------------------------------

    def _value(self, annotation: Any) -> Any:
        if annotation in self.values:
            return self.values[annotation]
        if annotation is ApplicationContext:
            return self.context
        value: Any
        if annotation is StoreClock:
            value = StoreClock()
        elif annotation is Clock:
            value = SystemClock()
        elif annotation is InMemoryBackend:
            value = InMemoryBackend()
        elif _is_sql_connection(annotation):
            value = self._connection()
        else:
            raise AssemblyError(
                f"[di.unresolved-dependency] no value for {annotation!r}: give it in values="
            )
        self.values[annotation] = value
        return value

    def _connection(self) -> Any:
        connection = SqlConnection(resolve_url(self.values.get(DatabaseUrl)))
        self._owned_connections.append(connection)
        return connection

    def _build(self, provider: type[Any]) -> Any:
        hints = typing.get_type_hints(provider.__init__)
        kwargs: dict[str, Any] = {}
        for parameter in list(inspect.signature(provider.__init__).parameters.values())[1:]:
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            annotation = hints.get(parameter.name)
            if annotation is None:
                if parameter.default is parameter.empty:
                    raise AssemblyError(
                        f"[di.unresolved-dependency] {_name(provider)}({parameter.name}) has no "
                        "type annotation to resolve it from"
                    )
                continue
            annotation = _resolvable(annotation)
            if annotation is None or (
                parameter.default is not parameter.empty
                and annotation not in self.values
                and not _is_sql_connection(annotation)
                and annotation not in _BUILTIN_DEPS
            ):
                continue
            kwargs[parameter.name] = self._value(annotation)
        return provider(**kwargs)

    async def start(self) -> None:
        """Build every store and check the layout; raise one `AssemblyError` listing every
        violation. An opted-out fencing store logs `[application.lease-check-not-atomic]`.

        Then, unless `require_schema=False`, read the schema revision of each SQL
        database the stores use: a database that answers at a revision other than the head
        (unmigrated, or behind) is refused at once with `SchemaNotReadyError`, naming the
        command to run, and the connections the application created are closed. A database
        that does not answer within `READINESS_TIMEOUT_S` is left to `check_readiness()`
        (a warning is logged): an instance may start before its database is up.

        Building the stores (compiling their statements, importing drivers) runs on a
        worker thread, so the event loop is not held while it lasts."""
        if self._started:
            return
        built, violations = await asyncio.to_thread(self._assemble)
        if violations:
            await self._close_owned()
            raise AssemblyError(
                f"the store layout of application {self.name!r} is invalid:\n  "
                + "\n  ".join(violations)
            )
        if self.require_schema:
            try:
                await self._require_schema()
            except BaseException:
                await self._close_owned()
                raise
        self._stores = built
        self._started = True

    def _sql_connections(self) -> list[SqlConnection]:
        found: list[SqlConnection] = []
        for value in self.values.values():
            if isinstance(value, SqlConnection) and value not in found:
                found.append(value)
        return found

    async def _require_schema(self) -> None:
        for connection in self._sql_connections():
            try:
                await asyncio.wait_for(require_head(connection), READINESS_TIMEOUT_S)
            except (StoreUnavailableError, TimeoutError) as exc:
                logger.warning(
                    "[application.schema-unchecked] the schema revision of %s could not be "
                    "read at start (%s): readiness reports it until the database answers",
                    connection.url.render_as_string(hide_password=True),
                    f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
                )

    def _assemble(self) -> tuple[dict[type[Any], Any], list[str]]:
        """Build every store (blocking work: run on a worker thread by `start()`); answer
        them and the layout's violations."""
        violations: list[str] = []
        by_contract: dict[type[Any], list[type[Any]]] = {}
        for provider in self.providers:
            contract = _contract_of(provider)
            if contract is None:
                violations.append(
                    f"[di.unknown-provider] {_name(provider)} implements no store contract"
                )
                continue
            by_contract.setdefault(contract, []).append(provider)
        built: dict[type[Any], Any] = {}
        for contract, listed in by_contract.items():
            instances = [self._build(p) for p in listed]
            if len(listed) > 1:
                named = ", ".join(
                    f"{_name(p)} (backend {getattr(i, 'backend', None)!r})"
                    for p, i in zip(listed, instances, strict=True)
                )
                violations.append(
                    f"[di.ambiguous-implementation] {_name(contract)} has {len(listed)} listed "
                    f"stores: {named}; list exactly one"
                )
            built[contract] = instances[0]
        defaults = {_contract_of(cls): cls for cls in memory_stores()}
        lease_store = built.get(ExecutionLeaseRepository)
        if lease_store is None:
            lease_store = self._build(defaults[ExecutionLeaseRepository])
            built[ExecutionLeaseRepository] = lease_store
        for contract in CONTRACTS.values():
            if contract in built:
                continue
            if contract in (FencedEffectRepository, OutboundCallRepository) and (
                lease_store.backend != "in-memory"
            ):
                built[contract] = _UnlistedFencingStore(contract, lease_store)
                continue
            built[contract] = self._build(defaults[contract])
        for contract in (FencedEffectRepository, OutboundCallRepository):
            if contract not in by_contract:
                continue
            store = built[contract]
            violations.extend(self._layout_violations(store, lease_store))
        return built, violations

    def _layout_violations(self, store: Any, lease_store: Any) -> list[str]:
        cls, lease_cls = type(store), type(lease_store)
        if getattr(store, "lease_check", LeaseCheck.ATOMIC) is (
            LeaseCheck.WITHOUT_DOUBLE_CHARGE_PROTECTION
        ):
            message = (
                f"[application.lease-check-not-atomic] {_name(cls)} opts out of the atomic lease "
                "check (LeaseCheck.WITHOUT_DOUBLE_CHARGE_PROTECTION): a holder whose lease was "
                "just taken over can still write; never back payments with it"
            )
            if self.strict:
                return [message]
            logger.warning(message)
            return []
        if store.backend is None or lease_store.backend is None:
            undeclared = cls if store.backend is None else lease_cls
            return [
                f"[application.store-backend-undeclared] {_name(undeclared)} declares no backend: "
                "a fencing store and its lease store must say where their rows live"
            ]
        if store.backend != lease_store.backend:
            suggestion = getattr(cls, "lease_repository", None)
            lease_hint = (
                _name(suggestion)
                if suggestion is not None
                else f'a lease store declaring backend "{store.backend}"'
            )
            return [
                f"[application.store-backend-mismatch] {_name(cls)} (backend {store.backend!r}) "
                f"cannot check leases of {_name(lease_cls)} (backend {lease_store.backend!r}) "
                f"in its own transaction: list {lease_hint} as the lease store, or a "
                f"{_name(_contract_of(cls) or cls)} on backend {lease_store.backend!r}"
            ]
        return []

    # --- use --------------------------------------------------------------------------------

    def store(self, contract: type[S]) -> S:
        """The store built for `contract` (after `start()`)."""
        if not self._started:
            raise RuntimeError("call `await app.start()` first")
        try:
            return self._stores[contract]  # type: ignore[no-any-return]
        except KeyError:
            raise KeyError(f"no store for {contract!r}") from None

    @property
    def stores(self) -> Mapping[type[Any], Any]:
        return dict(self._stores)

    def add_readiness_component(self, name: str, probe: Callable[[], ComponentHealth]) -> None:
        """Report `probe()` (a quick, non-blocking look at local state, such as the step
        slots) among the readiness components, under `name` (replacing one of that name)."""
        self._components[name] = probe

    async def check_readiness(self, timeout_s: float = READINESS_TIMEOUT_S) -> ReadinessReport:
        """Ping every store concurrently, each under `timeout_s`, and read the schema
        revision of each SQL database the stores use (a `schema (URL)` component, down
        unless the database is at the head revision); never hangs longer. The components
        added by `add_readiness_component` are reported beside them."""

        async def probe(contract: type[Any], store: Any) -> ComponentHealth:
            name = f"{_name(contract)} ({_name(type(store))})"
            started = time.perf_counter()
            try:
                await asyncio.wait_for(store.ping(), timeout_s)
            except TimeoutError:
                elapsed = (time.perf_counter() - started) * 1000
                return ComponentHealth(
                    name, HealthStatus.DOWN, elapsed, f"no answer within {timeout_s:g} s"
                )
            except Exception as exc:
                elapsed = (time.perf_counter() - started) * 1000
                return ComponentHealth(
                    name, HealthStatus.DOWN, elapsed, f"{type(exc).__name__}: {exc}"
                )
            elapsed = (time.perf_counter() - started) * 1000
            return ComponentHealth(name, HealthStatus.UP, elapsed)

        async def schema(connection: SqlConnection) -> ComponentHealth:
            shown = connection.url.set(drivername=connection.dialect_name)
            name = f"schema ({shown.render_as_string(hide_password=True)})"
            started = time.perf_counter()
            try:
                await asyncio.wait_for(require_head(connection), timeout_s)
            except TimeoutError:
                elapsed = (time.perf_counter() - started) * 1000
                return ComponentHealth(
                    name, HealthStatus.DOWN, elapsed, f"no answer within {timeout_s:g} s"
                )
            except Exception as exc:
                elapsed = (time.perf_counter() - started) * 1000
                return ComponentHealth(name, HealthStatus.DOWN, elapsed, str(exc))
            elapsed = (time.perf_counter() - started) * 1000
            return ComponentHealth(name, HealthStatus.UP, elapsed)

        components = list(
            await asyncio.gather(
                *(probe(contract, store) for contract, store in self._stores.items()),
                *(schema(connection) for connection in self._sql_connections()),
            )
        )
        for name, local in self._components.items():
            try:
                components.append(local())
            except Exception as exc:
                components.append(
                    ComponentHealth(name, HealthStatus.DOWN, 0.0, f"{type(exc).__name__}: {exc}")
                )
        if any(c.status is HealthStatus.DOWN for c in components):
            status = HealthStatus.DOWN
        elif any(c.status is HealthStatus.DEGRADED for c in components):
            status = HealthStatus.DEGRADED
        else:
            status = HealthStatus.UP
        return ReadinessReport(status, tuple(components))

    async def _close_owned(self) -> None:
        for connection in self._owned_connections:
            await connection.close()
        self._owned_connections.clear()

    async def close(self) -> None:
        """Close the connections this application created."""
        await self._close_owned()
        self._started = False

    async def __aenter__(self) -> Application:
        """`async with Application(...) as app:` starts the application (as `start()`,
        raising its `AssemblyError`) and hands it over started."""
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        """Leaving the block closes the connections the application created, whatever
        ended it; an exception from the block propagates unchanged."""
        await self.close()


def _is_sql_connection(annotation: Any) -> bool:
    return (
        isinstance(annotation, type)
        and annotation.__name__ == "SqlConnection"
        and (annotation.__module__ == "agboss_sql.sql.connection")
    )


_BUILTIN_DEPS = (ApplicationContext, StoreClock, Clock, InMemoryBackend)


def _resolvable(annotation: Any) -> Any:
    """The type to resolve for an annotation (`X | None` resolves `X`)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        return options[0] if len(options) == 1 else None
    return annotation


__all__ = [
    "DEFAULT_DATABASE_URL",
    "Application",
    "ComponentHealth",
    "DatabaseUrl",
    "FencingStore",
    "HealthStatus",
    "ReadinessReport",
    "sql_stores",
]
