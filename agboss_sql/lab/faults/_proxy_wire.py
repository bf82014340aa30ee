"""What the fault suite's TCP proxy reads of the wire protocols: where a client's COMMIT
starts in its byte stream (`_Framer`), for PostgreSQL and MySQL."""

from __future__ import annotations

from typing import Literal

Protocol = Literal["postgresql", "mysql"]

_PEEK = 64  # body bytes of a message looked at: a COMMIT is far shorter
_PG_SSL_REQUEST = 80_877_103
_PG_GSSENC_REQUEST = 80_877_104


def _is_commit_text(text: bytes) -> bool:
    return _first_word(text) in (b"COMMIT", b"END")


def _is_rollback_text(text: bytes) -> bool:
    return _first_word(text) == b"ROLLBACK"


def _first_word(text: bytes) -> bytes:
    words = text.strip().rstrip(b";").upper().split()
    return words[0] if len(words) == 1 or (words and words[1] in (b"WORK", b"TRANSACTION")) else b""


class _Framer:
    """Message boundaries of a client's byte stream, to find where a COMMIT starts.

    Keeps each message's header and its first `_PEEK` body bytes, skips the rest, and tracks
    absolute stream positions (a message may span chunks)."""

    def __init__(self, protocol: Protocol) -> None:
        self.protocol = protocol
        self._startup = protocol == "postgresql"  # untyped messages until StartupMessage
        self._head = bytearray()
        self._skip = 0
        self._start = 0
        self._pos = 0
        self._prepared: dict[bytes, tuple[bytes, bool]] = {}  # name -> (query head, whole)
        self._marked = False  # a statement with the marker was sent since the last end

    @property
    def position(self) -> int:
        """Bytes fed so far."""
        return self._pos

    def _header_size(self) -> int:
        if self.protocol == "mysql":
            return 4  # 3-byte little-endian payload length, sequence id
        return 4 if self._startup else 5  # (type byte,) int32 length counting itself

    def _body_size(self) -> int:
        size = self._header_size()
        if self.protocol == "mysql":
            return int.from_bytes(self._head[0:3], "little")
        return max(0, int.from_bytes(self._head[size - 4 : size], "big") - 4)

    def feed(self, data: bytes, marker: bytes | None = None) -> list[tuple[int, bool]]:
        """The COMMITs in `data`: each one's absolute position in the whole stream (reported
        once its first bytes are known, maybe in a later chunk), and whether its
        transaction sent a statement whose first bytes hold `marker`."""
        found: list[tuple[int, bool]] = []
        i, n = 0, len(data)
        while i < n:
            if self._skip:
                take = min(self._skip, n - i)
                self._skip -= take
                i += take
                continue
            if not self._head:
                self._start = self._pos + i
            size = self._header_size()
            if len(self._head) < size:
                take = min(size - len(self._head), n - i)
                self._head += data[i : i + take]
                i += take
                if len(self._head) < size:
                    break
            body = self._body_size()
            peek = min(body, _PEEK)
            have = len(self._head) - size
            if have < peek:
                take = min(peek - have, n - i)
                self._head += data[i : i + take]
                i += take
                if len(self._head) - size < peek:
                    break
            statement = self._statement(bytes(self._head[:size]), bytes(self._head[size:]), body)
            if statement is not None:
                text, whole = statement
                if whole and _is_commit_text(text):
                    found.append((self._start, self._marked))
                    self._marked = False
                elif whole and _is_rollback_text(text):
                    self._marked = False
                elif marker is not None and marker in text:
                    self._marked = True
            self._skip = body - peek
            self._head = bytearray()
        self._pos += n
        return found

    def _statement(self, header: bytes, body: bytes, size: int) -> tuple[bytes, bool] | None:
        """The head of the statement a message sends, and whether it is whole; `None` for
        a message that sends none."""
        whole = size <= _PEEK
        if self.protocol == "mysql":
            if body[:1] != b"\x03" or b"\0" in body:  # COM_QUERY text holds no NUL
                return None
            return body[1:], whole
        if self._startup:
            code = int.from_bytes(body[:4], "big") if len(body) >= 4 else 0
            if code not in (_PG_SSL_REQUEST, _PG_GSSENC_REQUEST):
                self._startup = False
            return None
        kind = header[:1]
        if kind == b"Q":
            return body.split(b"\0", 1)[0], whole
        if kind == b"P":  # Parse: statement name, query
            name, _, rest = body.partition(b"\0")
            query = rest.split(b"\0", 1)[0]
            whole = whole or b"\0" in rest
            if name:
                self._prepared[name] = (query, whole)
            return query, whole
        if kind == b"B":  # Bind: portal name, statement name (a prepared statement run again)
            parts = body.split(b"\0", 2)
            if len(parts) >= 2 and parts[1]:
                return self._prepared.get(parts[1])
        return None
