"""`TcpProxy` does what each fault says, in front of a loopback echo server.

The echo server stands for a database server here: these tests pin the proxy's own
behaviour (bytes through, reset, silence, delay, COMMIT found in the wire protocol,
control from another process). Its use in front of real databases is
`test_network_faults.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from agboss_sql.lab.faults.proxy import ProxyControl, TcpProxy, _Framer

pytestmark = pytest.mark.faults


def pg_query(text: str) -> bytes:
    body = text.encode() + b"\0"
    return b"Q" + struct.pack("!i", len(body) + 4) + body


def pg_message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def pg_startup() -> bytes:
    body = struct.pack("!i", 196608) + b"user\0postgres\0\0"
    return struct.pack("!i", len(body) + 4) + body


def mysql_query(text: str, seq: int = 0) -> bytes:
    payload = b"\x03" + text.encode()
    return len(payload).to_bytes(3, "little") + bytes([seq]) + payload


# --- the framer -----------------------------------------------------------------------------


def test_framer_finds_postgresql_commits_in_every_form() -> None:
    framer = _Framer("postgresql")
    stream = (
        pg_startup()
        + pg_query("SELECT 1")
        + pg_query("commit;")
        + pg_message(b"P", b"_pg3_0\0COMMIT\0\0\0")
        + pg_message(b"B", b"\0_pg3_0\0\0\0\0\0\0\0")
        + pg_message(b"P", b"\0INSERT INTO t VALUES (1)\0\0\0")
        + pg_query("SELECT 'COMMIT'")
        + pg_message(b"B", b"\0_pg3_0\0\0\0\0\0\0\0")
    )
    expected = []
    position = len(pg_startup()) + len(pg_query("SELECT 1"))
    expected.append(position)  # the simple COMMIT
    position += len(pg_query("commit;"))
    expected.append(position)  # Parse of a named COMMIT
    position += len(pg_message(b"P", b"_pg3_0\0COMMIT\0\0\0"))
    expected.append(position)  # Bind of it
    position += (
        len(pg_message(b"B", b"\0_pg3_0\0\0\0\0\0\0\0"))
        + len(pg_message(b"P", b"\0INSERT INTO t VALUES (1)\0\0\0"))
        + len(pg_query("SELECT 'COMMIT'"))
    )
    expected.append(position)  # the prepared COMMIT bound again
    # Byte by byte: a message split across any chunks is still found, at its start.
    found = [start for i in range(len(stream)) for start, _ in framer.feed(stream[i : i + 1])]
    assert found == expected


def test_framer_skips_long_messages_and_the_ssl_request() -> None:
    framer = _Framer("postgresql")
    ssl_request = struct.pack("!ii", 8, 80_877_103)
    long_query = pg_query("SELECT " + "x" * 100_000)
    stream = ssl_request + pg_startup() + long_query + pg_query("COMMIT")
    assert framer.feed(stream) == [(len(stream) - len(pg_query("COMMIT")), False)]


def test_framer_finds_mysql_commits() -> None:
    framer = _Framer("mysql")
    handshake = (40).to_bytes(3, "little") + b"\x01" + b"\x03" + b"COMMIT" + b"\0" * 33
    stream = handshake + mysql_query("SELECT 1") + mysql_query(" COMMIT ") + mysql_query("ROLLBACK")
    # The handshake response is not a command: only whole COM_QUERY payloads count, and
    # this one's payload runs past "COMMIT" (a NUL is no end of a MySQL query).
    assert framer.feed(stream) == [(len(handshake) + len(mysql_query("SELECT 1")), False)]


# --- the proxy before an echo server ------------------------------------------------------------


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65_536):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


async def roundtrip(port: int, data: bytes, timeout: float = 5) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(data)), timeout)
    finally:
        writer.close()


async def test_pass_through_and_latency(echo_port: int) -> None:
    async with TcpProxy("127.0.0.1", echo_port) as proxy:
        assert await roundtrip(proxy.port, b"hello") == b"hello"
        proxy.set_latency(20)
        assert await roundtrip(proxy.port, b"slow" * 1000) == b"slow" * 1000
        assert proxy.accepted == 2


async def test_blackhole_never_answers_nor_closes(echo_port: int) -> None:
    async with TcpProxy("127.0.0.1", echo_port) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        proxy.blackhole()
        writer.write(b"ping")
        # Neither an answer nor an end of stream: the read is still waiting when abandoned.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(1), 0.3)
        assert not reader.at_eof()
        # A new connection is accepted and silent too.
        with pytest.raises(TimeoutError):
            await roundtrip(proxy.port, b"new", timeout=0.3)
        proxy.pass_through()
        assert await roundtrip(proxy.port, b"healed") == b"healed"
        writer.close()


async def test_drop_resets_open_and_new_connections(echo_port: int) -> None:
    async with TcpProxy("127.0.0.1", echo_port) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"x")
        assert await reader.readexactly(1) == b"x"
        await proxy.drop()
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(1), 5)
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await roundtrip(proxy.port, b"y")
        proxy.pass_through()
        assert await roundtrip(proxy.port, b"z") == b"z"


@pytest.mark.parametrize("deliver", [False, True])
async def test_cut_at_commit(echo_port: int, deliver: bool) -> None:
    """The bytes before the COMMIT pass; the COMMIT reaches the server only when
    `deliver`; the client is reset and hears nothing of the COMMIT."""
    received = bytearray()
    answered = asyncio.Event()

    async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65_536):
            received.extend(data)
            writer.write(b"ok")
            await writer.drain()
            if b"COMMIT" in data:
                answered.set()

    listening = await asyncio.start_server(server, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    async with TcpProxy("127.0.0.1", port, protocol="mysql") as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(mysql_query("INSERT"))
        assert await reader.readexactly(2) == b"ok"
        proxy.cut_at_commit(deliver=deliver, after="reset")
        writer.write(mysql_query("COMMIT"))
        assert await proxy.wait_cut(5)
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(1), 5)
        if deliver:
            await asyncio.wait_for(answered.wait(), 5)
            assert bytes(received) == mysql_query("INSERT") + mysql_query("COMMIT")
        else:
            assert bytes(received) == mysql_query("INSERT")
        assert proxy.cuts == 1
    listening.close()


async def test_controlled_from_another_process(echo_port: int) -> None:
    """A proxy run as its own process (`python -m …proxy --url`), switched by
    `ProxyControl` from outside it."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agboss_sql.lab.faults.proxy",
            "--url",
            f"postgresql://postgres@127.0.0.1:{echo_port}/db",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 30)
        info = json.loads(line)
        assert info["url"].endswith(f":{info['port']}/db?sslmode=disable")
        control = ProxyControl(info["control_port"])
        assert control.stats()["mode"] == "pass"
        assert (await asyncio.to_thread(control.blackhole))["mode"] == "blackhole"
        assert (await asyncio.to_thread(control.set_latency, 5))["latency_ms"] == 5
        with pytest.raises(RuntimeError):
            control.command("no-such-fault")
        assert control.pass_through()["mode"] == "pass"
    finally:
        assert process.stdin is not None
        process.stdin.close()  # its stdin closing ends it
        process.wait(timeout=30)
    assert process.returncode == 0


def test_only_loopback() -> None:
    with pytest.raises(ValueError):
        TcpProxy("10.0.0.1", 5432)
    with pytest.raises(ValueError):
        TcpProxy("127.0.0.1", 5432, host="0.0.0.0")


# --- the fleet: proxies per pod behind a blocking API ----------------------------------------


def test_fleet_drives_each_pod_from_a_plain_thread() -> None:
    """`ProxyFleet` answers a synchronous harness: one proxy per pod, each fault in place
    when the call returns."""
    import socketserver
    import threading

    from sqlalchemy.engine import make_url

    from agboss_sql.lab.faults.network import ProxyFleet

    class Echo(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            with contextlib.suppress(OSError):
                while data := self.request.recv(65_536):
                    self.request.sendall(data)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = f"postgresql://user@127.0.0.1:{server.server_address[1]}/db"
    hello = pg_startup()

    def recv_exactly(sock: socket.socket, size: int) -> bytes:
        data = b""
        while len(data) < size and (more := sock.recv(size - len(data))):
            data += more
        return data

    def connect(url: str) -> socket.socket:
        return socket.create_connection(("127.0.0.1", make_url(url).port), timeout=5)

    try:
        with ProxyFleet() as fleet:
            first, second = fleet.url_for_pod(0, target), fleet.url_for_pod(1, target)
            assert first != second and fleet.url_for_pod(0, target) == first
            with connect(first) as sock:
                sock.sendall(hello)
                assert recv_exactly(sock, len(hello)) == hello
                fleet.blackhole(0)
                sock.sendall(hello)
                sock.settimeout(0.3)
                with pytest.raises(TimeoutError):
                    sock.recv(1)
            with connect(second) as sock:  # pod 2 untouched
                sock.sendall(hello)
                assert recv_exactly(sock, len(hello)) == hello
                fleet.drop(1)
                with pytest.raises(ConnectionError):
                    if not sock.recv(1):
                        raise ConnectionResetError("closed")
            assert fleet.stats(0)["mode"] == "blackhole" and fleet.stats(1)["mode"] == "drop"
            fleet.pass_through()
            with connect(first) as sock:
                sock.sendall(hello)
                assert recv_exactly(sock, len(hello)) == hello
    finally:
        server.shutdown()
        server.server_close()


def test_framer_marks_commits_of_transactions_that_sent_the_marker() -> None:
    """With a marker, a COMMIT counts only after a statement holding it (a connection's
    set-up COMMIT, or one after a ROLLBACK, does not), prepared statements included."""
    framer = _Framer("postgresql")
    framer.feed(pg_startup())
    marker = b"agboss_results"
    stream = [
        pg_query("SET x = 1"),
        pg_query("COMMIT"),
        pg_message(b"P", b"_s1\0INSERT INTO agboss_results VALUES (1)\0\0\0"),
        pg_query("COMMIT"),
        pg_message(b"B", b"\0_s1\0\0\0\0\0\0\0"),
        pg_query("ROLLBACK"),
        pg_query("COMMIT"),
        pg_message(b"B", b"\0_s1\0\0\0\0\0\0\0"),
        pg_query("commit"),
    ]
    marks = [marked for message in stream for _, marked in framer.feed(message, marker)]
    assert marks == [False, True, False, True]
    mysql = _Framer("mysql")
    found = [
        marked
        for text in ("COMMIT", "UPDATE agboss_results SET a = 1", "COMMIT")
        for _, marked in mysql.feed(mysql_query(text), marker)
    ]
    assert found == [False, True]
