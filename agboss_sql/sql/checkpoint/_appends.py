"""Channel values stored as an append to an earlier value of their channel.

A chat graph's `messages` channel (LangGraph's `add_messages`) holds the whole conversation
and takes a new version every turn: stored whole at each version, a 100-turn conversation
writes its first message 100 times. LangGraph's serde writes a list as a msgpack array, a
header that counts the elements and then each element's bytes, which depend on nothing
around them. So when the bytes of a new list begin with every element of a list stored whole
under an earlier version of the same channel (its base), the new value is stored as the
base's version and the elements after them; a read joins the two back into the very bytes
the serde wrote, and deserialises those.

The test is on bytes, not on what the elements are: how the list grew does not matter, and
the put stores an append only when joining gives back the serde's bytes exactly. An append
names a base stored whole, never another append, so a read needs at most one more row; a
value is stored whole again when what it adds outgrows `1/APPEND_SHARE` of its base, which
keeps the bytes written per version a fraction of the list's.
"""

from __future__ import annotations

MSGPACK = "msgpack"
"""The serde type whose values may be stored as appends."""

MIN_BASE = 2048
"""Bytes of elements a base holds at least: below, a value is stored whole."""

APPEND_SHARE = 4
"""An append holds at most 1/APPEND_SHARE of its base's element bytes."""


def array_header(data: bytes) -> tuple[int, int] | None:
    """(elements, header bytes) of a msgpack array, or None if `data` is not one."""
    if not data:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F, 1
    if first == 0xDC and len(data) >= 3:
        return int.from_bytes(data[1:3], "big"), 3
    if first == 0xDD and len(data) >= 5:
        return int.from_bytes(data[1:5], "big"), 5
    return None


def header(count: int) -> bytes:
    """The shortest msgpack array header of `count` elements (the one msgpack writes)."""
    if count < 16:
        return bytes((0x90 | count,))
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def appended(base: bytes, data: bytes) -> bytes | None:
    """`data` stored as an append to `base` (both serialised lists): a msgpack array of the
    elements `data` has after those of `base`; None when `data` does not begin with every
    element of `base`, or when the base is too small or the append too large to pay."""
    of_base, of_data = array_header(base), array_header(data)
    if of_base is None or of_data is None:
        return None
    (base_count, base_header), (count, data_header) = of_base, of_data
    body = len(base) - base_header
    added = len(data) - data_header - body
    if body < MIN_BASE or count < base_count or added < 0 or added * APPEND_SHARE > body:
        return None
    # `startswith` compares with memcmp; comparing memoryviews goes element by element.
    if not data.startswith(header(count)) or not data.startswith(base[base_header:], data_header):
        return None
    return header(count - base_count) + data[data_header + body :]


def joined(base: bytes, append: bytes) -> bytes:
    """The whole value an append stored against `base` stands for (the serde's bytes)."""
    of_base, of_append = array_header(base), array_header(append)
    if of_base is None or of_append is None:
        raise ValueError("a stored append or its base is not a msgpack array")
    return b"".join(
        (
            header(of_base[0] + of_append[0]),
            memoryview(base)[of_base[1] :],
            memoryview(append)[of_append[1] :],
        )
    )
