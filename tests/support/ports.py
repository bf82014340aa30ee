"""Loopback ports for tests of connecting: one nothing listens on, one that never greets."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def silent_listener() -> Iterator[int]:
    """A loopback port whose listener never accepts: TCP connects, the greeting never comes
    (a frozen server)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield int(listener.getsockname()[1])
