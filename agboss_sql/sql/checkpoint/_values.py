"""The values a saver wrote or read, kept by key so a read need not fetch them again.

A channel value is stored once per (thread, namespace, channel, version) and that row
never changes: a put skips a version already stored, and deletes remove a value only
with every checkpoint that reads it (a thread, a run, the history `prune` drops; the base
of an append only with every checkpoint that reads the append). So the bytes the serde
wrote for a key are the bytes any later read of that key would give back (joined to its
base, for an append: `_appends`), for as long as a checkpoint that names the key exists,
and a read that found the checkpoint in the database may take a named value from here
instead of from the database. Entries hold whole values, never appends. Nothing else
is taken on trust: which checkpoint is the latest, and which versions it names, always come
from the database.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar

ValueKey = tuple[str, str, str, str]
"""(thread hash, namespace hash, channel hash, version)."""
Stored = tuple[str, bytes | None]
"""(serde type, serialised value), whole as the serde wrote it."""

K = TypeVar("K", bound=tuple[Any, ...])
V = TypeVar("V")

ENTRY_OVERHEAD = 160
"""Bytes counted per entry beside its value: the key's strings and the dictionary slot."""

DEFAULT_VALUE_CACHE_BYTES = 32 * 1024 * 1024
"""Default bound of a saver's kept values (`value_cache_bytes`)."""


class BoundedCache(Generic[K, V]):
    """Entries by key, each counted at a cost in bytes, least recently used first out,
    bounded by `limit` bytes; safe across threads. `limit` 0 keeps nothing. Keys begin with
    a thread hash (`forget_thread`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._guard = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entries: Iterable[tuple[K, V, int]]) -> None:
        """Keep these (key, value, cost) entries (the newest last out); an entry costing
        more than the bound is not kept."""
        if not self.limit:
            return
        with self._guard:
            for key, value, cost in entries:
                if cost > self.limit:
                    continue
                old = self._entries.pop(key, None)
                if old is not None:
                    self.size -= old[1]
                self._entries[key] = (value, cost)
                self.size += cost
            while self.size > self.limit:
                _, (_, cost) = self._entries.popitem(last=False)
                self.size -= cost

    def _touched(self, key: K) -> tuple[V, int] | None:
        """The entry under `key`, made the most recently used; under the guard."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def get(self, key: K) -> V | None:
        """The value kept under `key`, if any (one `found`, without its dictionary)."""
        if not self._entries:
            return None
        with self._guard:
            entry = self._touched(key)
        return None if entry is None else entry[0]

    def found(self, keys: Iterable[K]) -> dict[K, V]:
        """The values kept under these keys (absent keys are left out)."""
        if not self._entries:
            return {}
        out: dict[K, V] = {}
        with self._guard:
            for key in keys:
                entry = self._touched(key)
                if entry is not None:
                    out[key] = entry[0]
        return out

    def forget_thread(self, thread_hash: str) -> None:
        """Drop every entry of a thread (its rows were deleted)."""
        with self._guard:
            for key in [k for k in self._entries if k[0] == thread_hash]:
                self.size -= self._entries.pop(key)[1]


class ValueCache(BoundedCache[ValueKey, Stored]):
    """Serialised values by key, least recently used first out, bounded by bytes; safe
    across threads. `limit` 0 keeps nothing."""

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"value_cache_bytes is a number of bytes >= 0, got {limit!r}")
        super().__init__(limit)

    def keep(self, entries: Iterable[tuple[ValueKey, Stored]]) -> None:
        """Keep these values (the newest last out)."""
        if self.limit:
            self.put(
                (key, stored, ENTRY_OVERHEAD + (len(stored[1]) if stored[1] is not None else 0))
                for key, stored in entries
            )


def fetched_entries(
    blobs: Mapping[tuple[str, str, str, str], tuple[object, object]],
) -> list[tuple[ValueKey, Stored]]:
    """Cache entries of values a read fetched (bytes only: a driver's memoryview copied)."""
    out: list[tuple[ValueKey, Stored]] = []
    for key, (kind, data) in blobs.items():
        if isinstance(data, memoryview):
            data = bytes(data)
        if data is not None and not isinstance(data, bytes):
            continue
        out.append(((str(key[0]), str(key[1]), str(key[2]), str(key[3])), (str(kind), data)))
    return out
