"""Stop a test run at the first sign that its database server went away.

When the database under test is a server, a run with tests marked `database` checks
before its first test that something answers on the server's port, and after every
failed database test checks again: a server that
no longer answers stops the run there with one line (`session.shouldstop`, as `-x`
does), instead of failing every test after it with the same refused connection.
The check is a TCP connection to the port, never a look at process names.
"""

from __future__ import annotations

import os
import socket

import pytest
from sqlalchemy.engine import make_url

DATABASE_URL_ENV = "AGBOSS_TEST_DATABASE_URL"
PROBE_TIMEOUT_S = 2.0

_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306}


def server_of(url: str | None) -> tuple[str, int] | None:
    """The `(host, port)` of a server URL; `None` for SQLite, a socket-only URL or none."""
    if not url:
        return None
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend not in _DEFAULT_PORTS or not parsed.host:
        return None
    return parsed.host, parsed.port or _DEFAULT_PORTS[backend]


def unanswered(server: tuple[str, int]) -> str | None:
    """Why nothing answers on `server`'s port (`None` when a connection is accepted)."""
    try:
        with socket.create_connection(server, timeout=PROBE_TIMEOUT_S):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def lost_server_message(server: tuple[str, int], why: str, *, at_start: bool) -> str:
    host, port = server
    when = "at the start of the run" if at_start else "during the run"
    return (
        f"the database server at {host}:{port} does not answer {when} ({why}): stopping "
        f"here; start it again (dialects/<db>/ready.sh) and rerun"
    )


_session: pytest.Session | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _session
    _session = session


def pytest_collection_finish(session: pytest.Session) -> None:
    """Before the first test: a run with tests marked `database` needs its server."""
    server = server_of(os.environ.get(DATABASE_URL_ENV))
    if server is None or session.config.option.collectonly:
        return
    if not any(item.get_closest_marker("database") for item in session.items):
        return
    why = unanswered(server)
    if why is not None:
        pytest.exit(lost_server_message(server, why, at_start=True), returncode=3)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """After a failed database test: stop the run if the server no longer answers."""
    if not report.failed or _session is None or "database" not in report.keywords:
        return
    server = server_of(os.environ.get(DATABASE_URL_ENV))
    if server is None:
        return
    why = unanswered(server)
    if why is not None:
        _session.shouldstop = lost_server_message(server, why, at_start=False)
