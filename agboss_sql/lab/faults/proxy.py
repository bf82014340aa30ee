"""`TcpProxy`: a loopback TCP proxy in front of a database server, with network faults
switchable at run time.

One proxy stands between one pod and its database server: the pod connects to the proxy's
port (`url_for` rewrites its URL) and every byte goes through it. Faults:

- `pass_through()`: bytes flow both ways (with `latency_ms` added when set). Heals every
  fault for new connections and disarms a commit cut; a connection already black-holed or
  cut stays so (a partition does not hand back the requests it swallowed).
- `drop()`: every open connection is reset (RST) and every new one is reset on accept, until
  the mode changes. `reset_connections()` resets the open ones once and keeps the mode.
- `blackhole()`: every connection, open or new, is read and never answered nor closed.
  The server's side of an open connection stays open, like a session behind a partition
  (its locks stay held until the proxy closes it).
- `set_latency(ms)`: each chunk, both ways, is delivered `ms` after it arrived.
- `cut_at_commit(deliver=..., after=..., marker=...)`: the next COMMIT a client sends
  (found in the wire protocol: a PostgreSQL simple query, or a Parse or Bind of a `COMMIT`
  statement; a MySQL `COM_QUERY`), of a transaction that sent a statement holding
  `marker` when one is given, cuts its connection. `deliver=False`: the COMMIT never reaches the
  server, whose side is closed (the server rolls the transaction back). `deliver=True`:
  the COMMIT reaches the server, its reply is read and dropped (the transaction committed)
  and only then is the server's side closed. `after="reset"` then resets the client's
  side; `after="hang"` leaves it open and never answers. Either way the client sent
  COMMIT and never learns its outcome. `cuts` counts the cuts made.

A PostgreSQL client's request for TLS or GSS encryption is answered "no" by the proxy
itself (the protocol must stay readable); `url_for` also sets `sslmode=disable`.

Another process controls a proxy through its control port (`serve_control()`; a client is
`ProxyControl`), or runs one of its own: `python -m agboss_sql.lab.faults.proxy
--url URL` prints `{"port": …, "control_port": …, "url": …}` on one line and serves until
its stdin closes or it is terminated.

Only loopback addresses are accepted (listening and target); every loop ends with its
connection or the proxy, and the number of connections is bounded (`max_connections`).

What the proxy reads of the wire protocols is in `_proxy_wire`, its connections in
`_proxy_links`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any, Literal

from sqlalchemy.engine import URL, make_url

from agboss_sql.lab.faults._proxy_links import After as After
from agboss_sql.lab.faults._proxy_links import _abort, _Link
from agboss_sql.lab.faults._proxy_wire import Protocol as Protocol
from agboss_sql.lab.faults._proxy_wire import _Framer as _Framer

_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _checked_loopback(host: str, what: str) -> str:
    if not _is_loopback(host):
        raise ValueError(f"TcpProxy works on loopback addresses only; {what} is {host!r}")
    return host


class TcpProxy:
    """An asyncio TCP proxy on 127.0.0.1 (an ephemeral port unless `port` is given) in front
    of `target_host:target_port`, with faults switchable at run time (see the module).

    `protocol` (`"postgresql"` or `"mysql"`) lets it find COMMITs for `cut_at_commit`;
    `for_url` takes target and protocol from a database URL. Use as
    `async with TcpProxy(host, port, protocol="postgresql") as proxy:
    url = proxy.url_for(original_url)`."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        protocol: Protocol | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_connections: int = 256,
    ) -> None:
        if protocol not in (None, "postgresql", "mysql"):
            raise ValueError(f"unknown protocol {protocol!r}: use 'postgresql' or 'mysql'")
        self.target_host = _checked_loopback(target_host, "the target")
        self.target_port = int(target_port)
        self.protocol: Protocol | None = protocol
        self.host = _checked_loopback(host, "the listening address")
        self.port = port
        self.max_connections = max_connections
        self.mode: Literal["pass", "drop", "blackhole"] = "pass"
        self.latency_ms = 0.0
        self.accepted = 0
        self.cuts = 0
        self._cuts_armed = 0
        self._cut_deliver = False
        self._cut_marker: bytes | None = None
        self._cut_after: After = "reset"
        self._cut_made: asyncio.Event | None = None
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self._control: asyncio.Server | None = None
        self.control_port: int | None = None

    @classmethod
    def for_url(cls, url: str | URL, **kwargs: Any) -> TcpProxy:
        """A proxy in front of the server `url` names (its protocol from the URL's backend)."""
        parsed = make_url(url)
        backend = parsed.get_backend_name()
        if backend == "mariadb":
            backend = "mysql"
        if backend not in _DEFAULT_PORTS:
            raise ValueError(f"TcpProxy stands before a server, not {backend!r}")
        host = parsed.host or "127.0.0.1"
        port = parsed.port or _DEFAULT_PORTS[backend]
        return cls(host, port, protocol=backend, **kwargs)  # type: ignore[arg-type]

    # --- life ----------------------------------------------------------------------------

    async def start(self) -> TcpProxy:
        """Listen (idempotent). Returns the proxy."""
        if self._server is None:
            self._cut_made = asyncio.Event()
            self._server = await asyncio.start_server(self._accept, self.host, self.port)
            self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        """Stop listening and reset every connection (the servers' sides close too)."""
        for server in (self._control, self._server):
            if server is not None:
                server.close()
        for link in list(self._links):
            link.reset()
        for server in (self._control, self._server):
            if server is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server.wait_closed(), 5)
        self._control = self._server = None

    async def __aenter__(self) -> TcpProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def url_for(self, url: str | URL) -> str:
        """`url` pointed at this proxy (password kept; PostgreSQL gets `sslmode=disable`
        unless the URL sets one)."""
        if self._server is None:
            raise RuntimeError("start the proxy first")
        parsed = make_url(url).set(host=self.host, port=self.port)
        if parsed.get_backend_name() == "postgresql" and "sslmode" not in parsed.query:
            parsed = parsed.update_query_dict({"sslmode": "disable"})
        return parsed.render_as_string(hide_password=False)

    @property
    def open_connections(self) -> int:
        return len(self._links)

    def stats(self) -> dict[str, Any]:
        """Mode, latency, counters: what the control port answers."""
        return {
            "mode": self.mode,
            "latency_ms": self.latency_ms,
            "accepted": self.accepted,
            "open": len(self._links),
            "cuts": self.cuts,
            "cuts_armed": self._cuts_armed,
            "port": self.port,
            "control_port": self.control_port,
        }

    # --- faults --------------------------------------------------------------------------

    def pass_through(self) -> None:
        """Let new connections through unharmed: no latency, no armed cut."""
        self.mode = "pass"
        self.latency_ms = 0.0
        self._cuts_armed = 0

    async def drop(self) -> None:
        """Reset every open connection and every new one until the mode changes; returns
        once the open ones are reset."""
        self.mode = "drop"
        await self.reset_connections()

    async def reset_connections(self) -> None:
        """Reset every open connection once (the mode stays); returns once they are."""
        writers: list[asyncio.StreamWriter] = []
        for link in list(self._links):
            writers.append(link.writer)
            if link.upstream is not None:
                writers.append(link.upstream)
            link.reset()
        # The sockets close (RST) on the loop's next turns, after `abort`.
        for writer in writers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 5)

    def blackhole(self) -> None:
        """Read every connection, open or new, and never answer nor close it."""
        self.mode = "blackhole"
        for link in list(self._links):
            link.blackhole()

    def set_latency(self, ms: float) -> None:
        """Deliver each chunk, both ways, `ms` after it arrived (0: at once)."""
        if ms < 0:
            raise ValueError("latency must not be negative")
        self.latency_ms = float(ms)

    def cut_at_commit(
        self,
        *,
        deliver: bool,
        after: After = "reset",
        count: int = 1,
        marker: str | None = None,
    ) -> None:
        """Cut the connection of each of the next `count` COMMITs (see the module):
        `deliver` says whether the COMMIT reaches the server (and commits). With `marker`,
        only the COMMIT of a transaction that sent a statement holding `marker` in its first
        40 bytes or so (e.g. a table name) counts: a connection's set-up COMMIT does not."""
        if self.protocol is None:
            raise ValueError("cut_at_commit needs the wire protocol: give protocol=")
        if after not in ("reset", "hang"):
            raise ValueError(f"after must be 'reset' or 'hang', not {after!r}")
        self._cut_deliver = bool(deliver)
        self._cut_after = after
        self._cuts_armed = int(count)
        self._cut_marker = marker.encode() if marker else None
        if self._cut_made is not None:
            self._cut_made.clear()

    async def wait_cut(self, timeout: float) -> bool:
        """Wait (up to `timeout` s) until an armed cut was made; True when it was."""
        if self._cut_made is None:
            return False
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._cut_made.wait(), timeout)
        return self._cut_made.is_set()

    # --- connections ---------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "drop" or len(self._links) >= self.max_connections:
            _abort(writer, reset=True)
            return
        link = _Link(self, reader, writer)
        self._links.add(link)
        try:
            await link.run()
        except asyncio.CancelledError:
            pass
        except Exception:
            link.reset()

    # --- control from another process ------------------------------------------------------

    async def serve_control(self) -> int:
        """Listen on a loopback control port for JSON-line commands (`ProxyControl`);
        returns the port."""
        if self._control is None:
            self._control = await asyncio.start_server(self._command_stream, self.host, 0)
            self.control_port = self._control.sockets[0].getsockname()[1]
        assert self.control_port is not None
        return self.control_port

    async def command(self, request: dict[str, Any]) -> dict[str, Any]:
        """Apply one control command (`{"op": …, …}`) and answer it."""
        op = request.get("op")
        if op == "pass":
            self.pass_through()
        elif op == "drop":
            await self.drop()
        elif op == "reset":
            await self.reset_connections()
        elif op == "blackhole":
            self.blackhole()
        elif op == "latency":
            self.set_latency(float(request["ms"]))
        elif op == "cut_at_commit":
            self.cut_at_commit(
                deliver=bool(request["deliver"]),
                after=request.get("after", "reset"),
                count=int(request.get("count", 1)),
                marker=request.get("marker"),
            )
        elif op != "stats":
            raise ValueError(f"unknown op {op!r}")
        return {"ok": True, **self.stats()}

    async def _command_stream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                try:
                    answer = await self.command(json.loads(line))
                except Exception as exc:
                    answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                writer.write(json.dumps(answer).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()


class ProxyControl:
    """A blocking client of a `TcpProxy`'s control port, for another process (a fault
    harness driving the proxy of a pod, or a pod asking for its own fault)."""

    def __init__(self, port: int, host: str = "127.0.0.1", *, timeout_s: float = 10.0) -> None:
        self.host = _checked_loopback(host, "the control address")
        self.port = port
        self.timeout_s = timeout_s

    def command(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one command; its answer (`ok`, and the proxy's stats). Raises `RuntimeError`
        when the proxy refused it."""
        with socket.create_connection((self.host, self.port), timeout=self.timeout_s) as sock:
            sock.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
            with sock.makefile("rb") as stream:
                line = stream.readline()
        if not line:
            raise RuntimeError("the proxy closed its control connection")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise RuntimeError(str(answer.get("error")))
        return answer

    def pass_through(self) -> dict[str, Any]:
        return self.command("pass")

    def drop(self) -> dict[str, Any]:
        return self.command("drop")

    def reset_connections(self) -> dict[str, Any]:
        return self.command("reset")

    def blackhole(self) -> dict[str, Any]:
        return self.command("blackhole")

    def set_latency(self, ms: float) -> dict[str, Any]:
        return self.command("latency", ms=ms)

    def cut_at_commit(
        self,
        *,
        deliver: bool,
        after: After = "reset",
        count: int = 1,
        marker: str | None = None,
    ) -> Any:
        return self.command(
            "cut_at_commit", deliver=deliver, after=after, count=count, marker=marker
        )

    def stats(self) -> dict[str, Any]:
        return self.command("stats")


async def _serve(url: str, port: int, ready: Callable[[dict[str, Any]], None]) -> None:
    proxy = TcpProxy.for_url(url, port=port)
    async with proxy:
        control = await proxy.serve_control()
        ready({"port": proxy.port, "control_port": control, "url": proxy.url_for(url)})
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        stdin_closed = loop.run_in_executor(None, sys.stdin.read)
        stdin_closed.add_done_callback(lambda _: stop.set())
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    """Run one proxy in this process (see the module)."""
    parser = argparse.ArgumentParser(description="A fault-injecting TCP proxy (loopback).")
    parser.add_argument("--url", required=True, help="the database server URL to stand before")
    parser.add_argument("--port", type=int, default=0, help="listening port (0: ephemeral)")
    args = parser.parse_args(argv)

    def ready(info: dict[str, Any]) -> None:
        print(json.dumps(info), flush=True)

    asyncio.run(_serve(args.url, args.port, ready))


if __name__ == "__main__":
    main()
