"""A loopback TCP relay in front of a PostgreSQL server, for tests of a connection that
goes silent, answers late or is refused: every byte passes through it, on the test's event
loop, and the test decides at any time what it forwards.

- `silent = True`: nothing more is forwarded either way on any connection, open or new,
  while both sockets stay open (a server gone without a word: a black hole);
- `hold(marker, until_s)`: a client's message holding `marker` (and all after it on that
  connection) is forwarded only `until_s` after the connection was accepted, never when
  `until_s` is None (a server that takes that long, or forever, to answer it);
- `rewrite(marker, into)`: a client's message holding `marker` reaches the server with it
  replaced by `into` (the same length: the message's framing stays valid);
- `closing = True`: every new connection is counted and closed at once.

A side that closes closes the other. `url_for` turns off TLS and GSS encryption so that
the relay reads the protocol in the clear.
"""

from __future__ import annotations

import asyncio
import contextlib

from sqlalchemy.engine import URL


class Relay:
    """The relay before `host:port` (see the module): `async with Relay(host, port) as r`."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.silent = False
        self.closing = False
        self.accepted = 0
        """Connections accepted."""
        self.held = 0
        """Messages held (`hold`) or rewritten (`rewrite`) so far."""
        self.clients_closed = 0
        """Connections whose client closed its side."""
        self._marker: bytes | None = None
        self._until_s: float | None = None
        self._into: bytes | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> Relay:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    def url_for(self, url: URL) -> URL:
        """`url` through the relay, in the clear."""
        query = {**url.query, "sslmode": "disable", "gssencmode": "disable"}
        return url.set(host="127.0.0.1", port=self.port, query=query)

    def hold(self, marker: bytes, until_s: float | None) -> None:
        self._marker, self._until_s, self._into = marker, until_s, None

    def rewrite(self, marker: bytes, into: bytes) -> None:
        assert len(into) == len(marker), "a rewrite keeps the message's length"
        self._marker, self._until_s, self._into = marker, None, into

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.add(writer)
        try:
            if self.closing:
                return
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            self._writers.add(up_writer)
            accepted_at = asyncio.get_running_loop().time()
            try:
                await asyncio.gather(
                    self._pump(reader, up_writer, accepted_at, from_client=True),
                    self._pump(up_reader, writer, accepted_at, from_client=False),
                )
            finally:
                self._writers.discard(up_writer)
                up_writer.close()
        except OSError:
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        accepted_at: float,
        *,
        from_client: bool,
    ) -> None:
        stalled = False  # a message held forever on this connection: nothing after it
        try:
            while chunk := await reader.read(65536):
                if from_client and self._marker is not None and self._marker in chunk:
                    self.held += 1
                    if self._into is not None:
                        chunk = chunk.replace(self._marker, self._into)
                    elif self._until_s is None:
                        stalled = True
                    else:
                        loop = asyncio.get_running_loop()
                        await asyncio.sleep(max(0.0, accepted_at + self._until_s - loop.time()))
                if self.silent or stalled:
                    continue
                writer.write(chunk)
                await writer.drain()
        except OSError:
            pass
        finally:
            if from_client:
                self.clients_closed += 1
            with contextlib.suppress(OSError):
                writer.close()
