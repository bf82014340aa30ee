"""A link that goes silent while SQLAlchemy sets up an engine's first connection ends typed.

An engine's first connection is asked a few questions by SQLAlchemy itself (the server's
SQL mode, default schema, ...) before the work's transaction begins, on an ad-hoc
connection that has no info dict. The checkout is bounded (`pool_ms` + `connect_ms` + a
statement's bound); when the bound cancels a question in flight, the engine's
`handle_error` listeners run on that ad-hoc connection. One of ours read its `info`,
which raises a bare `NotImplementedError` there, and SQLAlchemy raised that in place of
the cancellation: a store call ended untyped after the bound (seen once in the Galera
node-freeze scenario, on a node stalled by the loss of another; docs/operations.md,
"Losing a Galera node"). Where SQLAlchemy guards the question with `except
NotImplementedError`, the cancellation was swallowed instead and the set-up went on with a
closed connection.

Each test stands a `TcpProxy` between a new `SqlConnection` and the server under test and
black-holes the link just as SQLAlchemy sends its k-th set-up question (every one of them
in turn): the checkout must end in `StoreTimeoutError(what="connect")`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from support.capabilities import pooled_url, proxied_network_path

from agboss_sql.contracts.errors import StoreTimeoutError
from agboss_sql.lab.faults.proxy import TcpProxy
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.timeouts import Timeouts

SHORT = Timeouts(connect_ms=2_000, statement_ms=1_000, lock_ms=1_000, pool_ms=1_000, retry_ms=1_000)
"""Small bounds: each black-holed checkout ends after about 4.5 s (pool + connect + a
statement and its grace); the connect bound leaves a healthy connection's opening room on
a loaded machine (the healthy run that counts the questions must not time out)."""

HANG_BOUND_S = 40.0
"""Far past the checkout's bound with `SHORT` (about 4.5 s): reaching it means the call
waited on the silent link, which stays silent until the proxy closes."""


@pytest.fixture(scope="module")
def server_url(database_url: str) -> str:
    if not proxied_network_path(database_url):
        pytest.skip("a proxy needs a server database (SQLite has no network path)")
    return database_url


def _watch_statements(on_statement: Callable[[int], None]) -> Callable[[], None]:
    """Call `on_statement(n)` as each engine's n-th statement (from 0) is handed to the driver,
    SQLAlchemy's own set-up questions included (the dialect's `do_execute`, which runs on
    the ad-hoc connection too); returns the function that stops watching."""
    count = [0]

    def before_execute(*_args: Any) -> None:
        on_statement(count[0])
        count[0] += 1
        return None  # not handled here: the driver sends it

    sa.event.listen(sa.Engine, "do_execute", before_execute)
    return lambda: sa.event.remove(sa.Engine, "do_execute", before_execute)


async def _checkout(connection: SqlConnection) -> None:
    """A transaction on a new engine connection, sending nothing of its own."""
    async with connection.transaction():
        pass


async def _setup_questions(url: str) -> int:
    """How many statements SQLAlchemy sends through the engine to set up its first
    connection (a checkout with no statement of its own, on a healthy link)."""
    seen: list[int] = []
    stop = _watch_statements(seen.append)
    connection = SqlConnection(url, timeouts=SHORT)
    try:
        await asyncio.wait_for(_checkout(connection), HANG_BOUND_S)
    finally:
        stop()
        await connection.close()
    return len(seen)


async def _outcomes_of_silence(url: str, questions: int) -> dict[int, str]:
    """For each set-up question in turn, a new connection's checkout through a proxy that
    black-holes the link as that question is sent: what the checkout ended in."""
    outcomes: dict[int, str] = {}
    for silent_at in range(questions):
        async with TcpProxy.for_url(url) as proxy:

            def black_hole_at(n: int, silent_at: int = silent_at, proxy: TcpProxy = proxy) -> None:
                if n == silent_at:
                    proxy.blackhole()

            stop = _watch_statements(black_hole_at)
            connection = SqlConnection(proxy.url_for(url), timeouts=SHORT)
            try:
                await asyncio.wait_for(_checkout(connection), HANG_BOUND_S)
                outcomes[silent_at] = "no error"
            except StoreTimeoutError as exc:
                # The bound's own cancellation leaves no cause; an error raised in its place
                # is kept as the cause.
                cause = "" if exc.__cause__ is None else f" from {type(exc.__cause__).__name__}"
                outcomes[silent_at] = f"StoreTimeoutError({exc.what}){cause}"
            except Exception as exc:  # recorded: the assertions name every case
                outcomes[silent_at] = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
            finally:
                stop()
                await asyncio.wait_for(connection.close(), HANG_BOUND_S)
    return outcomes


def _expected(url: str, questions: int, cause: str = "") -> dict[int, str]:
    """Each question's outcome: the checkout's bound (`connect`); behind a transaction pooler
    the first question's round trip is the wait for a server connection, bounded by
    `pool_ms` first (`StoreTimeoutError(what="pool")`, docs/operations.md)."""
    expected = dict.fromkeys(range(questions), f"StoreTimeoutError(connect){cause}")
    if pooled_url(url):
        expected[0] = f"StoreTimeoutError(pool){cause}"
    return expected


async def test_a_silent_link_during_any_set_up_question_ends_typed(server_url: str) -> None:
    questions = await _setup_questions(server_url)
    assert questions > 0, "SQLAlchemy sent no set-up question through the engine: nothing tested"
    outcomes = await _outcomes_of_silence(server_url, questions)
    # No cause: the bound's cancellation itself came out, nothing was raised in its place.
    assert outcomes == _expected(server_url, questions), outcomes


async def test_an_error_raised_in_place_of_the_bounds_cancellation_ends_typed(
    server_url: str,
) -> None:
    """Whatever SQLAlchemy raises in place of the cancellation once the checkout's bound has
    passed (here: an error handler of the engine that raises its own error, as ours once
    did) is the bound's `StoreTimeoutError`, with that error as its cause."""
    questions = await _setup_questions(server_url)
    assert questions > 0, "SQLAlchemy sent no set-up question through the engine: nothing tested"

    def handler_that_raises(context: Any) -> None:
        raise RuntimeError("an error handler's own error")

    sa.event.listen(sa.Engine, "handle_error", handler_that_raises)
    try:
        outcomes = await _outcomes_of_silence(server_url, questions)
    finally:
        sa.event.remove(sa.Engine, "handle_error", handler_that_raises)
    assert outcomes == _expected(server_url, questions, " from RuntimeError"), outcomes
