"""A statement's parameters written into its text for PyMySQL and aiomysql, which send no
bound parameters: the literals their `Cursor.mogrify` writes, made with one type test a
value instead of their converter chain (five calls a value), and a value's bytes escaped
before they are decoded rather than after (`_escaped_bytes`). The checkpoint saver's
statements pass 14 values each on average, and that chain was a fifth of a sync call's CPU
on MariaDB.

Only the types the stores pass take the short way (`str`, `bytes`, `int`, `None`); any
other value, and every value on a session in `NO_BACKSLASH_ESCAPES` mode (where quotes are
doubled instead), goes through the driver's own `literal`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_NO_BACKSLASH_ESCAPES = 512
"""The server status flag `SERVER_STATUS_NO_BACKSLASH_ESCAPES` of MySQL's protocol (as
`pymysql.constants.SERVER_STATUS` names it; PyMySQL is not imported here, it is optional)."""

# The characters MySQL's string literals take escaped, as PyMySQL escapes them
# (`converters.escape_string`): NUL, backslash, newline, carriage return, Ctrl-Z and both
# quotes; every other character stands for itself. A list indexed by code point, as
# PyMySQL's: `str.translate` looks a list up faster than a dict.
_ESCAPES: list[str] = [chr(code) for code in range(128)]
for _char, _escaped in (
    ("\0", "\\0"),
    ("\\", "\\\\"),
    ("\n", "\\n"),
    ("\r", "\\r"),
    ("\032", "\\Z"),
    ('"', '\\"'),
    ("'", "\\'"),
):
    _ESCAPES[ord(_char)] = _escaped
del _char, _escaped


def _escaped_bytes(value: bytes) -> str:
    """`value` escaped as `_ESCAPES` escapes text, its other bytes kept as they are (as
    surrogates, which the query's `surrogateescape` encoding turns back into those bytes).
    Replacing in the bytes first is a tenth of the work of translating the decoded text,
    whose every non-ASCII character misses the table (a checkpoint's msgpack is mostly
    such bytes). The backslash goes first, so no escape is escaped again."""
    for byte, escaped in _BYTE_ESCAPES:
        if byte in value:
            value = value.replace(byte, escaped)
    return value.decode("ascii", "surrogateescape")


_BYTE_ESCAPES: tuple[tuple[bytes, bytes], ...] = tuple(
    (bytes([code]), _ESCAPES[code].encode("ascii"))
    for code in sorted(
        (code for code in range(128) if _ESCAPES[code] != chr(code)),
        key=lambda code: code != ord("\\"),  # the backslash first
    )
)


def rendered(raw: Any, sql: str, params: Mapping[str, Any]) -> str:
    """`sql` with its `%(name)s` placeholders replaced by `params` as MySQL literals: the
    text `mogrify(sql, params)` gives on `raw`, an aiomysql connection or a PyMySQL one
    opened with `binary_prefix=True` (bytes are sent as `_binary'…'`, not as text in the
    connection's character set)."""
    if raw.server_status & _NO_BACKSLASH_ESCAPES:
        return sql % {name: raw.literal(value) for name, value in params.items()}
    literals: dict[str, str] = {}
    for name, value in params.items():
        kind = type(value)
        if kind is str:
            literals[name] = "'" + value.translate(_ESCAPES) + "'"
        elif kind is bytes:
            literals[name] = "_binary'" + _escaped_bytes(value) + "'"
        elif kind is int:
            literals[name] = str(value)
        elif value is None:
            literals[name] = "NULL"
        else:
            literals[name] = raw.literal(value)
    return sql % literals
