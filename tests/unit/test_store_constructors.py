"""Every store's constructor checks its connection, clock and application alike
(`contracts.rules.checked_dependencies`): a wrong one is a `TypeError` naming the store,
raised before anything is built. SQL stores are built on URLs no server answers (a closed
port; a SQLite file that must not appear): construction never connects."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agboss_sql.contracts import (
    ApplicationContext,
    Clock,
    StoreClock,
    SystemClock,
    VirtualClock,
)
from agboss_sql.contracts.rules import checked_dependencies
from agboss_sql.memory import InMemoryBackend, memory_stores
from agboss_sql.sql import SqlConnection, sql_stores

APP = ApplicationContext("constructor-test")
UNANSWERED = {
    "postgresql": "postgresql://nobody@127.0.0.1:1/none",
    "mysql": "mysql://nobody@127.0.0.1:1/none",
}
STORES: list[type[Any]] = [*memory_stores(), *sql_stores(checkpoint_saver=False)]


def _clock_kind(store: type[Any]) -> str:
    """What the constructor's `clock` annotation asks for."""
    annotation = typing.get_type_hints(store.__init__)["clock"]
    if annotation is StoreClock:
        return "store"
    if annotation is Clock:
        return "application"
    return "unused"


def _good_clock(store: type[Any]) -> Any:
    kind = _clock_kind(store)
    return StoreClock(VirtualClock()) if kind == "store" else VirtualClock()


def _is_sql(store: type[Any]) -> bool:
    return store in sql_stores(checkpoint_saver=False)


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def connection(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlConnection]:
    if request.param == "sqlite":
        path = tmp_path / "never-opened" / "store.db"
        yield SqlConnection(f"sqlite:///{path}")
        assert not path.exists(), "building a store opened its SQLite file"
    else:
        yield SqlConnection(UNANSWERED[request.param])


def _backend(store: type[Any], connection: SqlConnection) -> Any:
    return connection if _is_sql(store) else InMemoryBackend()


def test_every_store_is_checked() -> None:
    # One memory and one SQL class per contract; the kinds of clock are all present.
    assert len(STORES) == 24
    kinds = {_clock_kind(store) for store in STORES}
    assert kinds == {"store", "application", "unused"}


@pytest.mark.parametrize("store", STORES, ids=lambda s: s.__name__)
def test_right_dependencies_build_without_connecting(
    store: type[Any], connection: SqlConnection
) -> None:
    built = store(_backend(store, connection), _good_clock(store), APP)
    assert built.application == APP
    if _is_sql(store):
        assert built.connection is connection


@pytest.mark.parametrize("store", STORES, ids=lambda s: s.__name__)
def test_a_wrong_connection_is_a_type_error(store: type[Any], connection: SqlConnection) -> None:
    wrong = InMemoryBackend() if _is_sql(store) else connection
    for bad in (wrong, object(), None):
        with pytest.raises(TypeError, match=store.__name__):
            store(bad, _good_clock(store), APP)


@pytest.mark.parametrize("store", STORES, ids=lambda s: s.__name__)
def test_a_wrong_clock_is_a_type_error(store: type[Any], connection: SqlConnection) -> None:
    kind = _clock_kind(store)
    if kind == "store":
        wrong: list[object] = [SystemClock(), VirtualClock(), object()]
    elif kind == "application":
        wrong = [StoreClock(), StoreClock(VirtualClock()), object()]
    else:
        wrong = [object(), "clock"]
    for bad in wrong:
        with pytest.raises(TypeError, match=store.__name__):
            store(_backend(store, connection), bad, APP)


@pytest.mark.parametrize("store", STORES, ids=lambda s: s.__name__)
def test_a_wrong_application_is_a_type_error(store: type[Any], connection: SqlConnection) -> None:
    # A lease log takes no application of its own (None is fine there); every other is
    # refused, the lease log's included.
    for bad in ("constructor-test", object(), *(() if _clock_kind(store) == "unused" else (None,))):
        with pytest.raises(TypeError, match=store.__name__):
            store(_backend(store, connection), _good_clock(store), bad)


def test_a_lease_log_needs_no_clock_and_no_application(connection: SqlConnection) -> None:
    for store in STORES:
        if _clock_kind(store) == "unused":
            built = store(_backend(store, connection))
            assert isinstance(built.application, ApplicationContext)


def test_every_constructor_uses_the_one_check() -> None:
    # The rule has one home: each constructor (or the base it inherits it from) calls it.
    for store in STORES:
        sources = "".join(
            inspect.getsource(klass.__init__)
            for klass in store.__mro__
            if "__init__" in vars(klass) and klass.__module__.startswith("agboss_sql.")
        )
        assert checked_dependencies.__name__ in sources, store.__name__
