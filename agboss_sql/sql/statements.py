"""Statements as the stores write them, and their compiled form.

A store writes an atomic step once, as a generator of `Exec`s (`Step`): it yields each
statement with its parameters, receives its `Result`, and returns its answer. The runners
(`_inline_runner`, `_pool_runner`) send the statements; `StatementCache` compiles each
SQLAlchemy Core statement once per dialect and keeps the compiled text.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa

from agboss_sql._dialects import Capabilities, Dialect, Suffixed

T = TypeVar("T")
S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Exec:
    """One statement of a step, with its parameters."""

    statement: Any
    params: Mapping[str, Any]


class Script:
    """Statements sent as one transaction in one text: `BEGIN`, each statement, `COMMIT`
    (`Capabilities.scripts`). Their parameters share one namespace: a name two of them use
    must mean one value. Send it alone, outside a transaction (it is one). Its `Result`'s
    rows are those of the last statement that returns rows (none if none does), its count
    the first statement's (`BEGIN`): no statement's count can be read."""

    __slots__ = ("statements",)

    def __init__(self, *statements: Any) -> None:
        self.statements = statements


class Result:
    """The rows a statement returned (if any) and the rows it changed or matched."""

    __slots__ = ("rowcount", "rows")

    def __init__(self, rows: list[Any] | None, rowcount: int) -> None:
        self.rows = rows if rows is not None else []
        self.rowcount = rowcount

    def first(self) -> Any | None:
        """The first row, or `None` when there is none."""
        return self.rows[0] if self.rows else None

    def scalar(self) -> Any | None:
        """The first column of the first row, or `None` when there is no row."""
        return self.rows[0][0] if self.rows else None


Step = Generator[Exec, Result, T]
"""An atomic step: yields statements, receives their results, returns its answer."""


@dataclass(frozen=True, slots=True)
class Compiled:
    """A statement's SQL text in the driver's paramstyle, and its default parameters."""

    sql: str
    defaults: Mapping[str, Any]
    verbatim: bool = False  # a text statement, sent as written when it has no params
    reads_only: bool = False  # a plain SELECT: sending it again changes nothing
    script: bool = False  # a `Script`: a failure leaves its transaction open


class SqlBuilder:
    """What a statement set needs to build its statements for one dialect."""

    def __init__(self, dialect: Dialect, database_time: bool) -> None:
        self.ops = dialect
        self.capabilities: Capabilities = dialect.CAPABILITIES
        self.database_time = database_time

    def now(self) -> tuple[Any, Any]:
        """`(source, now)`: a FROM to join (or `None`) and the statement's time, read once."""
        return self.ops.now_source(self.database_time)


StatementListener = Callable[[str, Mapping[str, Any]], None]

_SHARED: dict[
    str, tuple[sa.Dialect, dict[int, tuple[Any, Compiled]], dict[tuple[Any, bool], Any]]
] = {}
"""Per dialect: its SQLAlchemy compile dialect, compiled statements, statement sets."""


class StatementCache:
    """Statements compiled once per dialect, statement sets built once, and the listeners
    told of every statement sent."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        # Statement sets and compiled texts depend on the dialect only: every connection of
        # a process to one kind of database shares them, so a new connection (a new saver
        # instance, a store opened later) compiles nothing already compiled.
        shared = _SHARED.get(dialect.NAME)
        if shared is None:
            shared = _SHARED[dialect.NAME] = (dialect.compile_dialect(), {}, {})
        self._sa_dialect, self._compiled, self._prepared = shared
        self.listeners: list[StatementListener] = []

    def prepared(self, factory: Callable[[SqlBuilder], S], *, database_time: bool = False) -> S:
        """The statement set built by `factory` for this dialect, built once and reused."""
        cache_key: tuple[Any, bool] = (factory, database_time)
        found = self._prepared.get(cache_key)
        if found is None:
            found = factory(SqlBuilder(self.dialect, database_time))
            self._prepared[cache_key] = found
        return found

    def compiled(self, statement: Any) -> Compiled:
        """`statement` compiled for this dialect, once per statement object. Its bind params'
        values (constant literals; `None` for a param with no value, which is how
        `insert(table)` fills columns not given) are defaults under the caller's params. A
        `str` is sent as written, in the driver's own paramstyle."""
        entry = self._compiled.get(id(statement))
        if entry is not None and entry[0] is statement:
            return entry[1]
        if isinstance(statement, str):
            compiled = Compiled(statement, {}, verbatim=True, reads_only=_reads_only(statement))
        elif isinstance(statement, Script):
            compiled = self._script(statement)
        elif isinstance(statement, Suffixed):
            inner = self.compiled(statement.statement)
            compiled = Compiled(inner.sql + statement.suffix, inner.defaults, inner.verbatim)
        else:
            result = statement.compile(dialect=self._sa_dialect)
            if "__[POSTCOMPILE_" in result.string:
                raise ValueError(
                    "an expanding IN parameter cannot be sent to the raw driver: name one "
                    f"bind param per value instead ({result.string!r})"
                )
            compiled = Compiled(
                result.string, dict(result.params), reads_only=_select_reads_only(statement)
            )
        # Keep the statement alive with its compiled form, so its id is never reused.
        self._compiled[id(statement)] = (statement, compiled)
        return compiled

    def _script(self, script: Script) -> Compiled:
        if not self.dialect.CAPABILITIES.scripts:
            raise ValueError(f"{self.dialect.NAME} takes no statement scripts")
        parts = [self.compiled(statement) for statement in script.statements]
        defaults: dict[str, Any] = {}
        for part in parts:
            for name, value in part.defaults.items():
                if defaults.get(name, value) != value:
                    raise ValueError(f"two statements of a script give {name!r} two values")
                defaults[name] = value
        sql = ";\n".join([self.dialect.BEGIN, *(part.sql for part in parts), "COMMIT"])
        return Compiled(sql, defaults, script=True)

    def params(self, compiled: Compiled, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The params to send; `None` sends a text statement as written. A compiled statement
        always gets a mapping, even empty: the driver then reads its `%%` as `%`."""
        if not compiled.defaults:
            if compiled.verbatim and not params:
                return None
            return params
        merged = dict(compiled.defaults)
        merged.update(params)
        return merged

    def notify(self, sql: str, params: Mapping[str, Any] | None) -> None:
        for listener in self.listeners:
            listener(sql, params if params is not None else {})


def _select_reads_only(statement: Any) -> bool:
    """A plain SELECT, or a `UNION` of them (a checkpoint read with its writes), none of them
    locking rows: sending it again changes nothing, and the saver's sync path on SQLite runs
    it without this process's writer lock."""
    if isinstance(statement, sa.CompoundSelect):
        return statement._for_update_arg is None and all(
            _select_reads_only(part) for part in statement.selects
        )
    return isinstance(statement, sa.Select) and statement._for_update_arg is None


def _reads_only(sql: str) -> bool:
    return sql.lstrip().upper().startswith("SELECT") and "FOR UPDATE" not in sql.upper()


def single(statement: Any, params: Mapping[str, Any]) -> Callable[[], Step[Result]]:
    """The step of one statement."""

    def step() -> Step[Result]:
        return (yield Exec(statement, params))

    return step


__all__ = [
    "Compiled",
    "Exec",
    "Result",
    "Script",
    "SqlBuilder",
    "StatementCache",
    "StatementListener",
    "Step",
    "Suffixed",
    "single",
]
