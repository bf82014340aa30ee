"""The fault suite's TCP proxy's connections: each client connection and its server side
(`_Link`), one direction of it (`_Pipe`), and what a connection reads of its proxy
(`LinkOwner`, which `proxy.TcpProxy` is)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Any, Literal
from typing import Protocol as Interface

from agboss_sql.lab.faults._proxy_wire import (
    _PG_GSSENC_REQUEST,
    _PG_SSL_REQUEST,
    Protocol,
    _Framer,
)

After = Literal["reset", "hang"]

_CHUNK = 65_536
_REPLY_WAIT_S = 10.0  # how long a delivered COMMIT's reply is waited for before the cut
_QUEUE_CHUNKS = 256  # chunks in flight per direction (latency): back-pressure beyond
_PG_STARTUP_MAX = 10_000  # PostgreSQL's longest startup message (MAX_STARTUP_PACKET_LENGTH)


class LinkOwner(Interface):
    """What a connection reads and moves of its proxy: the target, the mode, the latency, the
    armed cut and its counters, and the set of open connections."""

    target_host: str
    target_port: int
    protocol: Protocol | None
    mode: Literal["pass", "drop", "blackhole"]
    latency_ms: float
    cuts: int
    _cuts_armed: int
    _cut_deliver: bool
    _cut_marker: bytes | None
    _cut_after: After
    _cut_made: asyncio.Event | None
    _links: set[_Link]


class _Pipe:
    """One direction of a connection: chunks delivered in order, each at its due time."""

    _CLOSE = object()

    def __init__(self, link: _Link, writer: asyncio.StreamWriter, server_side: bool) -> None:
        self._link = link
        self._writer = writer
        self._server_side = server_side  # False: towards the client
        self._queue: asyncio.Queue[Any] = asyncio.Queue(_QUEUE_CHUNKS)
        self.task = asyncio.get_running_loop().create_task(self._deliver())

    async def send(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        await self._queue.put((loop.time() + self._link.proxy.latency_ms / 1000, data))

    async def close_after(self) -> None:
        """Close this direction's socket once what was queued before is delivered."""
        await self._queue.put(self._CLOSE)

    async def _deliver(self) -> None:
        try:
            await self._deliver_queued()
        except (ConnectionError, OSError):
            self._link.close()

    async def _deliver_queued(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            item = await self._queue.get()
            if item is self._CLOSE:
                _abort(self._writer, reset=False)
                return
            due, data = item
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if self._link.silenced(towards_server=self._server_side):
                continue
            self._writer.write(data)
            await self._writer.drain()


def _abort(writer: asyncio.StreamWriter, *, reset: bool) -> None:
    """Close `writer`'s socket now; with `reset`, by RST (SO_LINGER 0) instead of FIN."""
    transport = writer.transport
    if transport.is_closing():
        return
    if reset:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    else:
        transport.close()


class _Link:
    """One client connection and (unless black-holed from the start) its server side."""

    def __init__(
        self, proxy: LinkOwner, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.proxy = proxy
        self.reader = reader
        self.writer = writer
        self.blackholed = False
        self.swallowing = False  # replies from the server are dropped (after a delivered cut)
        self.cut = False
        self.upstream: asyncio.StreamWriter | None = None
        self.to_server: _Pipe | None = None
        self.to_client: _Pipe | None = None
        self.tasks: list[asyncio.Task[Any]] = []
        self.framer = _Framer(proxy.protocol) if proxy.protocol is not None else None
        self.closed = False
        self.early = b""  # the first bytes of a PostgreSQL startup message, read already
        self.reply_seen = asyncio.Event()

    def silenced(self, *, towards_server: bool) -> bool:
        if self.blackholed:
            return True
        return not towards_server and self.swallowing

    def blackhole(self) -> None:
        self.blackholed = True

    def reset(self) -> None:
        self.close(reset=True)

    def close(self, *, reset: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        _abort(self.writer, reset=reset)
        if self.upstream is not None:
            _abort(self.upstream, reset=reset)
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        self.proxy._links.discard(self)

    async def run(self) -> None:
        proxy = self.proxy
        if proxy.protocol == "postgresql" and not await self._refuse_encryption():
            self.close()
            return
        if self.blackholed or proxy.mode == "blackhole":
            self.blackholed = True
            self.tasks.append(asyncio.current_task())  # type: ignore[arg-type]
            await self._from_client()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(
                proxy.target_host, proxy.target_port
            )
        except OSError:
            self.reset()
            return
        if self.closed:
            _abort(up_writer, reset=True)
            return
        self.upstream = up_writer
        self.to_server = _Pipe(self, up_writer, server_side=True)
        self.to_client = _Pipe(self, self.writer, server_side=False)
        if self.early:
            await self.to_server.send(self.early)
        self.tasks += [
            self.to_server.task,
            self.to_client.task,
            asyncio.current_task(),  # type: ignore[list-item]
        ]
        from_server = asyncio.get_running_loop().create_task(self._from_server(up_reader))
        self.tasks.append(from_server)
        await self._from_client()

    async def _refuse_encryption(self) -> bool:
        """Answer a PostgreSQL client's SSLRequest/GSSENCRequest with "N" (at most twice);
        keep the first bytes of its startup message for the server. False on EOF."""
        for _ in range(3):
            try:
                first = await self.reader.readexactly(8)
            except (asyncio.IncompleteReadError, ConnectionError):
                return False
            length, code = struct.unpack("!ii", first)
            if length == 8 and code in (_PG_SSL_REQUEST, _PG_GSSENC_REQUEST):
                self.writer.write(b"N")
                await self.writer.drain()
                continue
            # The whole startup message, sent on at once as a client sends it: PgBouncer
            # refuses one that comes in two reads ("partial pkt in startup phase").
            try:
                rest = await self.reader.readexactly(max(0, min(length, _PG_STARTUP_MAX) - 8))
            except (asyncio.IncompleteReadError, ConnectionError):
                return False
            self.early = first + rest
            if self.framer is not None:
                self.framer.feed(self.early)
            return True
        return False

    async def _from_client(self) -> None:
        try:
            while not self.closed:
                data = await self.reader.read(_CHUNK)
                if not data:
                    break
                if self.blackholed or self.cut:
                    continue
                await self._forward_from_client(data)
        except ConnectionError:
            pass
        self.close()

    async def _forward_from_client(self, data: bytes) -> None:
        assert self.to_server is not None
        framer = self.framer
        chunk_start = framer.position if framer is not None else 0
        proxy = self.proxy
        marker = proxy._cut_marker
        found = framer.feed(data, marker) if framer is not None else []
        starts = [start for start, marked in found if marker is None or marked]

        if not starts or proxy._cuts_armed <= 0:
            await self.to_server.send(data)
            return
        proxy._cuts_armed -= 1
        proxy.cuts += 1
        self.cut = True
        if proxy._cut_deliver:
            self.swallowing = True
            await self.to_server.send(data)
            self.tasks.append(
                asyncio.get_running_loop().create_task(self._after_delivered_commit())
            )
        else:
            before = max(0, starts[0] - chunk_start)
            if before:
                await self.to_server.send(data[:before])
            await self.to_server.close_after()
            self._cut_client()
        if proxy._cut_made is not None:
            proxy._cut_made.set()

    async def _after_delivered_commit(self) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.reply_seen.wait(), _REPLY_WAIT_S)
        if self.upstream is not None:
            _abort(self.upstream, reset=False)
        self._cut_client()

    def _cut_client(self) -> None:
        if self.proxy._cut_after == "reset":
            self.reset()
        else:
            self.blackholed = True

    async def _from_server(self, reader: asyncio.StreamReader) -> None:
        assert self.to_client is not None
        try:
            while not self.closed:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                if self.swallowing:
                    self.reply_seen.set()
                    continue
                if self.blackholed:
                    continue
                await self.to_client.send(data)
        except ConnectionError:
            pass
        if not (self.blackholed or self.cut or self.closed):
            # The server ended the session: the client learns it once what came first is in.
            await self.to_client.close_after()
