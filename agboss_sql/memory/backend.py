"""The shared state of one in-process cluster: every instance's in-memory stores on one backend."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from agboss_sql.contracts.rules import payload_text
from agboss_sql.contracts.types import (
    ChildStatus,
    CostEntry,
    ExecutionLeaseEvent,
    ExecutionRecord,
    ExecutionSnapshot,
    JsonValue,
    MeshRequest,
    OutboundCall,
    PausedExecution,
    StoredKeyFacts,
)


def json_text(value: JsonValue) -> str:
    """`value` as JSON text; a value no backend stores is `InvalidPayloadError`
    (`contracts.rules.payload_text`)."""
    return payload_text("the payload", value)


def json_copy(value: JsonValue) -> JsonValue:
    """A deep copy of `value` through JSON, as a database's JSON column would give it back."""
    return json.loads(json_text(value))


@dataclass(slots=True)
class LeaseRow:
    """One lease per `(tenant_id, execution_id)`."""

    tenant_id: str
    execution_id: str
    holder_instance_id: str
    lease_epoch: int
    expires_at: int
    released: bool = False
    yielded: bool = False
    finished: bool = False
    closed_reason: str | None = None
    """Why the epoch ended: "released", "finished", or "superseded" when `lease_state_of`
    closed it after it expired."""


@dataclass(slots=True)
class FencedResultRow:
    """A fenced effect's stored result, keyed by `fenced_key_identity_of(key)`."""

    value_json: str
    facts: StoredKeyFacts
    token: int
    stored_at: int


@dataclass(slots=True)
class ChildRow:
    """One queued child and how far it got."""

    tenant_id: str
    root_execution_id: str
    parent_execution_id: str
    child_execution_id: str
    depth: int
    payload: JsonValue
    queued_at: int
    sequence: int
    status: ChildStatus = ChildStatus.QUEUED
    attempt: int = 0
    claimed_by: str | None = None
    outcome: JsonValue = None
    finished_order: int | None = None
    finished_attempt: int | None = None
    """The attempt whose finish finished the child (`None`: finished without one)."""
    finish_remaining: int | None = None
    """What the finish answered; 0 when it owes the parent's wake."""
    wake_claimed_by: str | None = None
    wake_claimed_until: int | None = None
    parent_woken_at: int | None = None


@dataclass(slots=True)
class RecordRow:
    record: ExecutionRecord
    sequence: int
    """Insertion order."""
    moved: int
    """Order of the last write (insert or status move)."""


@dataclass(slots=True)
class PauseRow:
    pause: PausedExecution
    updated_at: int
    """When the pause was saved or last moved (the application clock's time)."""
    taken_by: str | None = None


@dataclass(slots=True)
class WindowRow:
    start: int
    used: int


class InMemoryBackend:
    """The state of one in-process cluster, shared by every instance's stores as connections
    share one database.

    Each table is a plain dict. A step that never awaits is atomic on the event loop by
    itself; `atomic()` serialises the steps that do await (a fenced effect holds it across
    its work, as a SQL transaction holds its lease row lock) and everything that must not
    interleave with them: the lease rows, the scope marks, fenced results and outbound calls.
    """

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], LeaseRow] = {}
        self.execution_ids: set[str] = set()
        self.lease_events: list[ExecutionLeaseEvent] = []
        self.fence_marks: dict[str, int] = {}
        self.fenced_results: dict[str, FencedResultRow] = {}
        self.outbound_calls: dict[str, OutboundCall] = {}
        self.children: dict[str, ChildRow] = {}
        self.unfinished_children: dict[tuple[str, str], int] = {}
        """How many children of each (tenant, parent) are not finished: a finish counts
        what is left in constant time, as the SQL store's count row."""
        self.records: dict[tuple[str, str], RecordRow] = {}
        self.trees: dict[tuple[str, str], dict[str, str]] = {}
        self.mesh_requests: dict[tuple[str, str], MeshRequest] = {}
        """Mesh requests by (tenant, idempotency key)."""
        self.slots: dict[str, dict[str, int]] = {}
        self.windows: dict[str, WindowRow] = {}
        self.rate_pauses: dict[str, int] = {}
        self.pauses: dict[tuple[str, str], PauseRow] = {}
        self.cost_entries: dict[tuple[str, str], CostEntry] = {}
        """By (tenant, entry id)."""
        self.reservations: dict[tuple[str, str, str], int] = {}
        """By (scope, tenant or NO_TENANT, key)."""
        """Reserved micros per `(scope, key)`."""
        self.history: dict[tuple[str, str], ExecutionSnapshot] = {}
        self.business_rows: list[Any] = []
        """Rows the fenced effects' work inserted, committed with their results."""
        self._sequence = itertools.count(1)
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._lock_holder: asyncio.Task[Any] | None = None

    def next_sequence(self) -> int:
        """A number that grows with every call: the insertion order of rows."""
        return next(self._sequence)

    def reset(self) -> None:
        """Empty every table (between test cases)."""
        self.leases.clear()
        self.execution_ids.clear()
        self.lease_events.clear()
        self.fence_marks.clear()
        self.fenced_results.clear()
        self.outbound_calls.clear()
        self.children.clear()
        self.unfinished_children.clear()
        self.records.clear()
        self.trees.clear()
        self.mesh_requests.clear()
        self.slots.clear()
        self.windows.clear()
        self.rate_pauses.clear()
        self.pauses.clear()
        self.cost_entries.clear()
        self.reservations.clear()
        self.history.clear()
        self.business_rows.clear()

    def _lock_for(self, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
        # Made on first use, and again for a new event loop: a backend may outlive the loop it
        # was first used in (one backend per test module, one loop per test).
        if self._lock is None or self._lock_loop is not loop:
            self._lock = asyncio.Lock()
            self._lock_loop = loop
            self._lock_holder = None
        return self._lock

    @asynccontextmanager
    async def atomic(self) -> AsyncIterator[None]:
        """Hold the backend's lock for one atomic step."""
        task = asyncio.current_task()
        if task is not None and task is self._lock_holder:
            # A SQL store would wait forever on its own row lock here.
            raise RuntimeError(
                "a fenced effect's work called a lease or fencing store of its own backend: "
                "that waits on the lock the effect holds; write business rows through the "
                "transaction the work was given instead"
            )
        async with self._lock_for(asyncio.get_running_loop()):
            self._lock_holder = task
            try:
                yield
            finally:
                self._lock_holder = None


class InMemoryTransaction:
    """The transaction an in-memory fenced effect hands its work: rows inserted here are
    committed with the effect's result, or dropped with it."""

    def __init__(self, backend: InMemoryBackend) -> None:
        self.backend = backend
        self._rows: list[Any] = []
        self._on_commit: list[Callable[[], None]] = []
        self._open = True

    @property
    def rows(self) -> tuple[Any, ...]:
        """The rows staged so far."""
        return tuple(self._rows)

    @property
    def is_open(self) -> bool:
        return self._open

    def insert(self, row: Any) -> None:
        """Stage a business row: it is committed with the effect's result."""
        if not self._open:
            raise RuntimeError("the fenced effect's transaction is over: insert inside the work")
        self._rows.append(row)

    def _stage(self, action: Callable[[], None]) -> None:
        self._on_commit.append(action)

    def _commit(self) -> None:
        if not self._open:
            raise RuntimeError("the transaction is already over")
        self._open = False
        for action in self._on_commit:
            action()
        self.backend.business_rows.extend(self._rows)

    def _rollback(self) -> None:
        self._open = False
        self._rows.clear()
        self._on_commit.clear()


__all__ = [
    "ChildRow",
    "FencedResultRow",
    "InMemoryBackend",
    "InMemoryTransaction",
    "LeaseRow",
    "PauseRow",
    "RecordRow",
    "WindowRow",
    "json_copy",
    "json_text",
]
