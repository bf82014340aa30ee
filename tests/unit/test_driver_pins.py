"""Every private part of a driver (or of SQLAlchemy, Alembic and asyncio) that the code
overrides or calls, pinned against the installed release: a release that renames, drops or
reshapes one fails here, naming the pin and who relies on it, instead of silently undoing
what the override was for (a `_try_cancel` never called again waits 10 s on a dead link; a
`_reset` gone keeps every result in memory; a `_show_warnings` gone costs a round trip).

No database: only the installed classes are inspected. The tests at the end prove that a
pin whose member is gone fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

import pytest


class PinBroken(Exception):
    """The installed release no longer has what a pin needs."""


def _resolve(path: str) -> Any:
    """`module:Attr.attr` as the object it names."""
    module_name, _, attributes = path.partition(":")
    found: Any = import_module(module_name)
    for name in attributes.split(".") if attributes else ():
        found = getattr(found, name)
    return found


def _code_names(function: Any) -> tuple[str, ...]:
    return inspect.unwrap(function).__code__.co_names  # type: ignore[no-any-return]


@dataclass(frozen=True)
class MethodPin:
    """`owner.name` exists, is a coroutine function when `coroutine`, accepts a call with
    `args`/`kwargs` (after `self`), and each of `called_by` (methods of `owner`) still calls
    it: an override of it is still reached."""

    owner: str
    name: str
    used_by: str
    coroutine: bool
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    called_by: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.owner}.{self.name}"

    def check(self) -> None:
        owner = _resolve(self.owner)
        member = inspect.getattr_static(owner, self.name, None)
        if member is None:
            raise PinBroken(f"{owner.__qualname__} has no {self.name} any more")
        function = getattr(owner, self.name)
        if inspect.iscoroutinefunction(function) != self.coroutine:
            kind = "a coroutine function" if self.coroutine else "a plain function"
            raise PinBroken(f"{owner.__qualname__}.{self.name} is no longer {kind}")
        try:
            inspect.signature(function).bind(None, *self.args, **self.kwargs)
        except TypeError as exc:
            raise PinBroken(
                f"{owner.__qualname__}.{self.name}{inspect.signature(function)} no longer "
                f"takes ({self.args}, {self.kwargs}): {exc}"
            ) from None
        for caller in self.called_by:
            if self.name not in _code_names(getattr(owner, caller)):
                raise PinBroken(
                    f"{owner.__qualname__}.{caller} no longer calls {self.name}: an override "
                    "of it is never reached"
                )


@dataclass(frozen=True)
class AttributePin:
    """An instance made by `make` (from `owner`'s own `__init__`, no connection opened) has
    every attribute of `names`."""

    owner: str
    names: tuple[str, ...]
    used_by: str
    make: Callable[[Any], Any]

    @property
    def id(self) -> str:
        return f"{self.owner}({', '.join(self.names)})"

    def check(self) -> None:
        owner = _resolve(self.owner)
        instance = self.make(owner)
        for name in self.names:
            if not hasattr(instance, name):
                raise PinBroken(f"a new {owner.__qualname__} has no {name} any more")


@dataclass(frozen=True)
class CustomPin:
    """Anything else: `probe` raises `PinBroken` when the installed release broke it."""

    id: str
    used_by: str
    probe: Callable[[], None]
    requires: str = ""
    """The module the probe imports (the test is skipped without it)."""

    def check(self) -> None:
        self.probe()


Pin = MethodPin | AttributePin | CustomPin


def _psycopg_constants() -> None:
    import psycopg

    from agboss_sql._dialects import postgresql

    if postgresql._TUPLES_OK != psycopg.pq.ExecStatus.TUPLES_OK:
        raise PinBroken("psycopg.pq.ExecStatus.TUPLES_OK is no longer postgresql._TUPLES_OK")
    if postgresql._IDLE != psycopg.pq.TransactionStatus.IDLE:
        raise PinBroken("psycopg.pq.TransactionStatus.IDLE is no longer postgresql._IDLE")


def _psycopg_generators() -> None:
    from psycopg import _cursor_base, generators

    if not callable(getattr(generators, "execute", None)):
        raise PinBroken("psycopg.generators.execute is gone")
    if "_start_query" not in _cursor_base.BaseCursor._start_query.__code__.co_names:
        raise PinBroken("a cursor no longer starts its connection's transaction by _start_query")


def _work_connection_sets_what_sqlalchemy_sets() -> None:
    """`InlineWorkConnection.__init__` does not call `AsyncConnection.__init__`: it must set
    every attribute that one sets, through `_assign_proxied`, and answer through
    `_proxied`."""
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

    from agboss_sql.sql._inline_runner import InlineWorkConnection

    for name in ("_assign_proxied", "_proxied"):
        if inspect.getattr_static(AsyncConnection, name, None) is None:
            raise PinBroken(f"AsyncConnection has no {name} any more")
    slots = {
        slot
        for cls in AsyncConnection.__mro__
        for slot in ((cls.__dict__.get("__slots__") or ()),)
        for slot in ((slot,) if isinstance(slot, str) else slot)
    }
    engine = create_async_engine("sqlite+aiosqlite://")
    sync_engine = sa.create_engine("sqlite://")
    try:
        theirs = AsyncConnection(engine)
        with sync_engine.connect() as sync:
            raw = sync.connection.driver_connection
            assert isinstance(raw, sqlite3.Connection)
            ours = InlineWorkConnection(engine, sync, raw)
            missing = {s for s in slots if hasattr(theirs, s) and not hasattr(ours, s)}
            if missing:
                raise PinBroken(
                    f"AsyncConnection.__init__ now sets {sorted(missing)}, which "
                    "InlineWorkConnection.__init__ does not"
                )
            if ours._proxied is not sync:
                raise PinBroken("AsyncConnection._proxied no longer answers the connection")
    finally:
        sync_engine.dispose()


def _select_for_update_arg() -> None:
    import sqlalchemy as sa

    plain, locking = sa.select(sa.literal(1)), sa.select(sa.literal(1)).with_for_update()
    if getattr(plain, "_for_update_arg", 0) is not None or locking._for_update_arg is None:
        raise PinBroken("Select._for_update_arg no longer tells a locking read from a plain one")


PINS: list[Pin] = [
    # psycopg 3
    MethodPin(
        "psycopg:AsyncConnection",
        "_try_cancel",
        "agboss_sql/_dialects/postgresql.py (DroppingConnection: a cancelled call drops its "
        "connection instead of asking a maybe dead server to cancel)",
        coroutine=True,
        kwargs={"timeout": 5.0},
        called_by=("wait",),
    ),
    MethodPin(
        "psycopg:AsyncCursor",
        "_reset",
        "agboss_sql/_dialects/postgresql.py (_release: the result freed after each statement "
        "on the connection's one cursor)",
        coroutine=False,
    ),
    *(
        MethodPin(
            "psycopg:Connection",
            name,
            "agboss_sql/_dialects/_pg_pooling.py (PooledConnection: behind a transaction "
            "pooler, psycopg's implicit BEGIN also sets the transaction's bounds)",
            coroutine=False,
        )
        for name in ("_start_query", "_get_tx_start_command", "_check_connection_ok")
    ),
    CustomPin(
        "psycopg.generators.execute",
        "agboss_sql/_dialects/_pg_pooling.py (PooledConnection: the BEGIN and its bounds "
        "sent as one query, all its results read)",
        _psycopg_generators,
        requires="psycopg",
    ),
    CustomPin(
        "psycopg.pq status codes",
        "agboss_sql/_dialects/postgresql.py (_TUPLES_OK, _IDLE: read without building enums)",
        _psycopg_constants,
        requires="psycopg",
    ),
    # aiomysql on PyMySQL
    MethodPin(
        "aiomysql:Cursor",
        "_show_warnings",
        "agboss_sql/_dialects/mysql.py (QuietCursor: no hidden SHOW WARNINGS round trip)",
        coroutine=True,
        args=(None,),
        called_by=("_do_get_result",),
    ),
    AttributePin(
        "aiomysql:Connection",
        ("_writer", "_reader"),
        "agboss_sql/_dialects/mysql.py (is_usable polls the socket of _writer) and "
        "agboss_sql/_dialects/mysql.py (close_without_loop closes it without a loop)",
        make=lambda owner: _unopened(owner),
    ),
    # aiosqlite
    MethodPin(
        "aiosqlite:Connection",
        "_execute",
        "agboss_sql/_dialects/sqlite.py (InlineConnection: each call inline on the loop's "
        "thread, not a hop to aiosqlite's worker thread)",
        coroutine=True,
        args=(len, ()),
        called_by=("commit", "rollback", "cursor"),
    ),
    MethodPin(
        "aiosqlite:Cursor",
        "_execute",
        "agboss_sql/_dialects/sqlite.py (a cursor's calls reach InlineConnection._execute)",
        coroutine=True,
        args=(len, ()),
    ),
    AttributePin(
        "aiosqlite:Connection",
        ("_running", "_connection"),
        "agboss_sql/_dialects/sqlite.py (InlineConnection._execute refuses a closed "
        "connection as aiosqlite's own does)",
        make=lambda owner: owner(sqlite3.connect, 64),
    ),
    # SQLAlchemy
    CustomPin(
        "sqlalchemy AsyncConnection internals",
        "agboss_sql/sql/_inline_runner.py (InlineWorkConnection: an AsyncConnection on the "
        "inline work connection)",
        _work_connection_sets_what_sqlalchemy_sets,
    ),
    CustomPin(
        "sqlalchemy Select._for_update_arg",
        "agboss_sql/sql/statements.py (a plain SELECT compiled as reads-only)",
        _select_for_update_arg,
    ),
    # Alembic and asyncio
    MethodPin(
        "alembic.runtime.migration:MigrationContext",
        "_ensure_version_table",
        "agboss_sql/testing/database.py (the version table of a schema made from metadata)",
        coroutine=False,
    ),
    CustomPin(
        "asyncio _SelectorTransport._sock",
        "agboss_sql/_dialects/mysql.py (close_without_loop closes an aiomysql socket without its loop)",
        lambda: _stores("asyncio.selector_events:_SelectorTransport.__init__", "_sock"),
    ),
    CustomPin(
        "asyncio._get_running_loop",
        "agboss_sql/sql/checkpoint/_bridge.py (whether the caller runs on a loop)",
        lambda: _exists("asyncio:_get_running_loop"),
    ),
]


def _unopened(owner: type) -> Any:
    """An aiomysql connection made but never opened (its `__init__` wants a loop)."""
    loop = asyncio.new_event_loop()
    try:
        return owner(loop=loop)
    finally:
        loop.close()


def _stores(path: str, name: str) -> None:
    if name not in _code_names(_resolve(path)):
        raise PinBroken(f"{path} no longer sets {name}")


def _exists(path: str) -> None:
    try:
        _resolve(path)
    except AttributeError:
        raise PinBroken(f"{path} is gone") from None


def _installed(pin: Pin) -> str:
    """The installed distribution the pin is about, skipping the test when it is absent."""
    path = pin.owner if isinstance(pin, MethodPin | AttributePin) else pin.requires
    module = path.partition(":")[0].split(".")[0]
    if module:
        pytest.importorskip(module)
    return module


@pytest.mark.parametrize("pin", PINS, ids=lambda pin: pin.id)
def test_a_private_part_we_rely_on_is_still_there(pin: Pin) -> None:
    module = _installed(pin)
    try:
        pin.check()
    except PinBroken as exc:
        version = ""
        if module:
            from importlib.metadata import PackageNotFoundError
            from importlib.metadata import version as installed

            with contextlib.suppress(PackageNotFoundError):
                version = f" {installed(module)}"
        pytest.fail(
            f"driver pin {pin.id} broken by the installed {module or 'release'}{version}: "
            f"{exc}. Relied on by {pin.used_by}: adapt it (and this pin) to the release.",
            pytrace=False,
        )


def test_every_override_of_a_driver_method_is_pinned() -> None:
    """Each class the dialects derive from a driver's: every private method it overrides
    has a pin, so a new override cannot go unpinned."""
    from agboss_sql._dialects import mysql, postgresql, sqlite

    overrides = {
        "psycopg:AsyncConnection": postgresql._connection_class(),
        "aiomysql:Cursor": mysql._cursor_class(),
        "aiosqlite:Connection": _inline_connection_class(sqlite),
    }
    pinned = {(pin.owner, pin.name) for pin in PINS if isinstance(pin, MethodPin)}
    for owner, ours in overrides.items():
        for name in vars(ours):
            if name.startswith("_") and not name.startswith("__"):
                assert (owner, name) in pinned, f"{ours.__qualname__}.{name} has no pin"


def _inline_connection_class(sqlite: Any) -> type:
    create = sqlite.inline_aiosqlite_creator("unused.sqlite", 1)
    cells = [cell.cell_contents for cell in create.__closure__ or ()]
    return next(value for value in cells if isinstance(value, type))


# --- a pin whose member is gone fails -----------------------------------------------------


def _defining_class(owner: type, name: str) -> type:
    return next(cls for cls in owner.__mro__ if name in vars(cls))


@pytest.mark.parametrize(
    "pin", [pin for pin in PINS if isinstance(pin, MethodPin)], ids=lambda pin: pin.id
)
def test_a_method_pin_fails_when_the_method_is_gone(
    pin: MethodPin, monkeypatch: pytest.MonkeyPatch
) -> None:
    _installed(pin)
    owner = _resolve(pin.owner)
    monkeypatch.delattr(_defining_class(owner, pin.name), pin.name)
    with pytest.raises(PinBroken, match=pin.name):
        pin.check()


@pytest.mark.parametrize(
    "pin", [pin for pin in PINS if isinstance(pin, MethodPin) and pin.called_by], ids=lambda p: p.id
)
def test_a_method_pin_fails_when_the_driver_stops_calling_it(
    pin: MethodPin, monkeypatch: pytest.MonkeyPatch
) -> None:
    _installed(pin)
    owner = _resolve(pin.owner)
    caller = pin.called_by[0]

    async def replaced(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(_defining_class(owner, caller), caller, replaced)
    with pytest.raises(PinBroken, match=f"no longer calls {pin.name}"):
        pin.check()


def test_a_method_pin_fails_when_its_signature_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("psycopg")
    import psycopg

    async def reshaped(self: Any, timeout: float, *, hard: bool) -> None:
        return None

    monkeypatch.setattr(psycopg.AsyncConnection, "_try_cancel", reshaped)
    (pin,) = [p for p in PINS if p.id == "psycopg:AsyncConnection._try_cancel"]
    with pytest.raises(PinBroken, match="no longer takes"):
        pin.check()


@pytest.mark.parametrize(
    "pin", [pin for pin in PINS if isinstance(pin, AttributePin)], ids=lambda pin: pin.id
)
def test_an_attribute_pin_fails_when_the_attribute_is_gone(
    pin: AttributePin, monkeypatch: pytest.MonkeyPatch
) -> None:
    _installed(pin)
    owner = _resolve(pin.owner)

    def bare_init(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(owner, "__init__", bare_init)
    # The half-made instance goes before the patches do: its finalizer must not read them.
    monkeypatch.setattr(owner, "__del__", lambda self: None)
    with pytest.raises(PinBroken, match=pin.names[0]):
        pin.check()


def test_the_work_connection_pin_fails_when_sqlalchemy_drops_what_it_uses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sqlalchemy.ext.asyncio import AsyncConnection

    monkeypatch.delattr(_defining_class(AsyncConnection, "_assign_proxied"), "_assign_proxied")
    (pin,) = [p for p in PINS if p.id == "sqlalchemy AsyncConnection internals"]
    with pytest.raises(PinBroken, match="_assign_proxied"):
        pin.check()
