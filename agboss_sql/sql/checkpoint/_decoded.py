"""Decoded lists kept as pickles, so a read of a growing list decodes only what it added.

A chat graph's `messages` channel holds the whole conversation, and every turn reads it
whole: the serde decodes every message again (for LangChain's messages, a pydantic model
validated per message), and that decoding is most of what a read costs. LangGraph's
serde (`JsonPlusSerializer`) writes a list as a msgpack array and decodes one element by
element: the bytes of an element decode alone as they decode inside the list. So when the
bytes of a value begin with every element of a list this saver decoded before for the same
channel, the value decodes to what that list decoded to, followed by what its remaining
elements decode to.

What the earlier list decoded to is kept as a pickle of those objects, and a read loads
that pickle: new objects each time, equal in type and value to what the serde would make
(nothing a caller gets is shared with another caller, or with what the saver keeps), for
about a third of the serde's cost on LangChain messages. Only the serde's own decoding of
lists whose objects copy exactly through pickle is kept (`exact`): builtin scalars and
containers and pydantic models made of them, with the pickling pydantic gives them; a
value holding anything else, a serde other than `JsonPlusSerializer` or a value that is
not a list decodes through the serde every time, as before. The pickles never leave the
process: made here, of objects the serde made, loaded here.

The test is on bytes, as for stored appends (`_appends`): how the list grew does not
matter. Read the other way (a history newest first), a value whose elements are the first
ones of the kept list decodes to the first objects of its pickle. A channel's kept list is refreshed when what reads add to it outgrows
`1/APPEND_SHARE` of it, and made only once a channel was seen to grow (a value read
begins with the one read before), so a channel whose value is replaced each turn costs a
prefix comparison and nothing more.

A pickle loads with the cyclic garbage collector paused (`collector_paused`). Loading a
conversation makes some five containers a message (the model, its dict, a set, two lists);
run, the collector would stop the load every 700 of them to look at young objects, find
nothing to free, and move what is alive, the list being made among it, a generation older,
until enough has moved to start a full collection, which walks every object of the process
(some 160,000 beside LangGraph's imports: 100 to 150 ms). Reading back the history of a
105-turn chat (315 checkpoints, on SQLite) made two of those; with loads paused, one, and the
read took 1.05-1.17 ms a checkpoint against 1.68-2.18. Nothing a load makes can be garbage of
a cycle: `exact` admits only trees of builtins and pydantic models (a cycle fails its depth
bound), and loading them runs no code but pydantic's `__setstate__`. What a load made is
looked at by the collector's next run.
"""

from __future__ import annotations

import contextlib
import copyreg
import gc
import pickle
import threading
from collections.abc import Iterator
from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pydantic import BaseModel

from agboss_sql.sql.checkpoint._appends import APPEND_SHARE, MIN_BASE, MSGPACK, array_header, header
from agboss_sql.sql.checkpoint._values import BoundedCache

ChannelKey = tuple[str, str, str]
"""(thread hash, namespace hash, channel hash)."""

ENTRY_OVERHEAD = 200
"""Bytes counted per entry beside its bytes and pickle."""

_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})

_PICKLING_NAMES = ("__getstate__", "__setstate__", "__reduce__", "__reduce_ex__")
_MODEL_PICKLING = (
    BaseModel.__getstate__,
    BaseModel.__setstate__,
    object.__reduce__,
    object.__reduce_ex__,
)


_pause_guard = threading.Lock()
_pausing = 0
_resume = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused inside the block, and running again after if it
    ran before: the first of blocks overlapping in any threads pauses it, the last resumes it.
    (A `gc.disable()` by another thread inside a block is undone when the blocks end.) For
    decoding many objects at once, none of them garbage; never around a wait."""
    global _pausing, _resume
    with _pause_guard:
        if not _pausing:
            _resume = gc.isenabled()
            if _resume:
                gc.disable()
        _pausing += 1
    try:
        yield
    finally:
        with _pause_guard:
            _pausing -= 1
            if not _pausing and _resume:
                gc.enable()


def _load(pickled: bytes) -> Any:
    """`pickle.loads(pickled)`, with the collector paused (`collector_paused`)."""
    with collector_paused():
        return pickle.loads(pickled)


def _pickles_as_model(kind: type) -> bool:
    """Whether a pydantic model class pickles as pydantic makes it (its state: fields,
    extra, fields set, private), with no pickling of its own."""
    return (
        tuple(getattr(kind, name, None) for name in _PICKLING_NAMES) == _MODEL_PICKLING
        and getattr(kind, "__getnewargs_ex__", None) is None
        and getattr(kind, "__getnewargs__", None) is None
        and kind not in copyreg.dispatch_table
    )


def exact(value: Any, depth: int = 0) -> bool:
    """Whether a pickle copy of `value` is equal to it in type and value all the way down:
    builtin scalars, lists, tuples and dicts of them, and pydantic models of them that
    pickle as pydantic makes them."""
    if depth > 64:
        return False
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is list or kind is tuple:
        return all(exact(item, depth + 1) for item in value)
    if kind is dict:
        return all(type(k) in _SCALARS and exact(v, depth + 1) for k, v in value.items())
    if isinstance(value, BaseModel) and _pickles_as_model(kind):
        parts = (value.__dict__, value.__pydantic_extra__ or {}, value.__pydantic_private__ or {})
        return all(exact(part, depth + 1) for part in parts) and all(
            type(name) is str for name in value.__pydantic_fields_set__
        )
    return False


class _Kept:
    """A channel's list as last decoded: its bytes (header and elements) and, once the
    channel was seen to grow, a pickle of the objects they decode to (`refused`: they do
    not copy exactly, and the values that begin with them are not tried again)."""

    __slots__ = ("count", "data", "pickled", "refused", "serde", "start")

    def __init__(
        self,
        serde: object,
        data: bytes,
        start: int,
        count: int,
        pickled: bytes | None,
        refused: bool,
    ) -> None:
        self.serde = serde
        self.data = data
        self.start = start
        self.count = count
        self.pickled = pickled
        self.refused = refused

    def begins_with(self, serde: object, data: bytes, start: int, count: int) -> bool:
        """Whether this list begins with every element of `data` (elements from `start`),
        for the same serde: `data` is this list as it was `self.count - count` elements ago
        (a history read newest first meets its lists so)."""
        return (
            serde is self.serde
            and count <= self.count
            and self.data.startswith(memoryview(data)[start:], self.start)
        )

    def prefix_of(self, serde: object, data: bytes, start: int, count: int) -> bool:
        """Whether `data` (elements from `start`) begins with every element of this list,
        for the same serde."""
        body = len(self.data) - self.start
        return (
            serde is self.serde
            and count >= self.count
            and len(data) - start >= body
            and data.startswith(memoryview(self.data)[self.start :], start)
        )


class DecodedLists(BoundedCache[ChannelKey, _Kept]):
    """Per channel, the list the saver decoded last, kept to decode the next value of the
    channel from; least recently used first out, bounded by bytes (the bytes kept and the
    pickles); safe across threads. `limit` 0 keeps nothing."""

    def decode(self, serde: Any, channel: ChannelKey, kind: str, data: Any) -> Any:
        """What `serde.loads_typed((kind, data))` answers: the value of `channel`."""
        if isinstance(data, memoryview):
            data = bytes(data)
        if (
            not self.limit
            or kind != MSGPACK
            or type(serde) is not JsonPlusSerializer
            or type(data) is not bytes
            or len(data) <= MIN_BASE
        ):
            return serde.loads_typed((kind, data))
        of_data = array_header(data)
        if of_data is None:
            return serde.loads_typed((kind, data))
        count, start = of_data
        kept = self.found((channel,)).get(channel)
        if kept is not None and count < kept.count and kept.begins_with(serde, data, start, count):
            # An earlier state of the kept list (a history read newest first).
            if kept.pickled is not None:
                shorter: list[Any] = _load(kept.pickled)
                del shorter[count:]
                if count * 2 <= kept.count:
                    # Half as long: keep it instead, so a read loads at most twice what it
                    # answers (its objects were checked when the longer list was kept).
                    self._keep(channel, serde, data, start, count, shorter, checked=count)
                return shorter
            value = serde.loads_typed((kind, data))
            if not kept.refused and type(value) is list:
                # Seen to shrink: keep what it decoded to, for the states before it.
                self._keep(channel, serde, data, start, count, value)
            return value
        if kept is None or not kept.prefix_of(serde, data, start, count):
            value = serde.loads_typed((kind, data))
            self._keep(channel, serde, data, start, count, None)
            return value
        if kept.pickled is None:
            value = serde.loads_typed((kind, data))
            if not kept.refused and type(value) is list:
                # Seen to grow: keep what it decoded to.
                self._keep(channel, serde, data, start, count, value)
            return value
        value = _load(kept.pickled)
        rest = start + len(kept.data) - kept.start
        added = count - kept.count
        if added:
            more = serde.loads_typed((kind, header(added) + data[rest:]))
            value.extend(more)
            if (len(data) - rest) * APPEND_SHARE > len(kept.data) - kept.start:
                # Outgrown: keep the whole list as decoded now (its new elements checked).
                self._keep(channel, serde, data, start, count, value, checked=kept.count)
        return value

    def _keep(
        self,
        channel: ChannelKey,
        serde: object,
        data: bytes,
        start: int,
        count: int,
        value: list[Any] | None,
        checked: int = 0,
    ) -> None:
        pickled = None
        if value is not None and all(exact(item) for item in value[checked:]):
            try:
                pickled = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:
                # A model class pickle cannot find by name (defined in a function, say).
                pickled = None
        entry = _Kept(serde, data, start, count, pickled, value is not None and pickled is None)
        cost = ENTRY_OVERHEAD + len(data) + (len(pickled) if pickled is not None else 0)
        self.put(((channel, entry, cost),))
