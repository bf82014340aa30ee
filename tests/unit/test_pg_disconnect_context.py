"""psycopg's C wait, handling a connection the server closed, may raise an error of its own
(a bare NotImplementedError was seen when a primary died mid-statement): with a lost
connection's error as its context it is a disconnect (typed `StoreUnavailableError`), and
with any other context, or none, it is not."""

from __future__ import annotations

import psycopg
import pytest

from agboss_sql._dialects import postgresql


def _raised_while_handling(first: BaseException) -> BaseException:
    try:
        try:
            raise first
        except BaseException:
            raise NotImplementedError()  # noqa: B904 - the implicit context is the point
    except NotImplementedError as error:
        return error


def test_an_error_raised_while_handling_a_lost_connection_is_a_disconnect() -> None:
    lost = psycopg.OperationalError("consuming input failed: server closed the connection")
    assert postgresql.is_disconnect(_raised_while_handling(lost))


@pytest.mark.parametrize(
    "first",
    [psycopg.errors.UniqueViolation("duplicate key"), ValueError("not the driver's")],
)
def test_other_contexts_are_not(first: BaseException) -> None:
    assert not postgresql.is_disconnect(_raised_while_handling(first))
    assert not postgresql.is_disconnect(NotImplementedError())
