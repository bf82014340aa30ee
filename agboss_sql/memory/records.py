"""In-memory execution records, tree keys, mesh requests and execution history."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from agboss_sql.contracts.errors import DuplicateExecutionError, IdempotencyKeyConflictError
from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import (
    checked_choice,
    checked_count,
    checked_key_prefix,
    checked_mesh_request,
    checked_record,
    checked_snapshot,
    checked_time,
)
from agboss_sql.contracts.stores import (
    ExecutionHistoryRepository,
    ExecutionRecordRepository,
    ExecutionTreeRepository,
    MeshRequestRepository,
)
from agboss_sql.contracts.types import (
    ExecutionRecord,
    ExecutionRecordStatus,
    ExecutionSnapshot,
    HistoryCursor,
    JsonValue,
    MeshRequest,
    MeshRequestSaved,
)
from agboss_sql.memory._fencing import ApplicationClockStore
from agboss_sql.memory.backend import RecordRow, json_copy, json_text

TERMINAL_STATUSES = frozenset(
    {
        ExecutionRecordStatus.SUCCEEDED,
        ExecutionRecordStatus.FAILED,
        ExecutionRecordStatus.CANCELLED,
    }
)
"""A run in one of these has its outcome: its status never moves again."""


def _record_out(record: ExecutionRecord) -> ExecutionRecord:
    return dataclasses.replace(record, outcome=json_copy(record.outcome))


class InMemoryExecutionRecordRepository(ApplicationClockStore, ExecutionRecordRepository):
    """Execution records in an `InMemoryBackend`; status moves are compare-and-set.

    A run that reached a terminal status (succeeded, failed, cancelled) never moves again,
    so two outcomes for one run are impossible.
    """

    async def save(self, record: ExecutionRecord) -> None:
        checked_record(record)
        stored = ExecutionRecordStatus(record.status)
        record = dataclasses.replace(record, status=stored, outcome=json_copy(record.outcome))
        key = (record.tenant_id, record.execution_id)
        if key in self.memory.records:
            raise DuplicateExecutionError(
                f"execution {record.execution_id!r} of tenant {record.tenant_id!r} already "
                "has a record"
            )
        sequence = self.memory.next_sequence()
        self.memory.records[key] = RecordRow(record, sequence, sequence)

    async def get(self, tenant_id: str, execution_id: str) -> ExecutionRecord | None:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        row = self.memory.records.get((tenant_id, execution_id))
        return None if row is None else _record_out(row.record)

    async def find_by_thread(self, tenant_id: str, thread_id: str) -> Sequence[ExecutionRecord]:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("thread_id", thread_id)
        rows = sorted(
            (
                row
                for row in self.memory.records.values()
                if row.record.tenant_id == tenant_id and row.record.thread_id == thread_id
            ),
            key=lambda r: (r.record.created_at, r.sequence),
        )
        return [_record_out(row.record) for row in rows]

    async def find_by_status(
        self, status: ExecutionRecordStatus, limit: int
    ) -> Sequence[ExecutionRecord]:
        status = checked_choice("status", ExecutionRecordStatus, status)
        checked_count("limit", limit)
        rows = sorted(
            (row for row in self.memory.records.values() if row.record.status == status),
            key=lambda r: (r.record.updated_at, r.moved),
        )
        return [_record_out(row.record) for row in rows[:limit]]

    def _move(
        self,
        tenant_id: str,
        execution_id: str,
        expected: ExecutionRecordStatus,
        new: ExecutionRecordStatus,
        outcome: JsonValue | None,
        with_outcome: bool,
    ) -> bool:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        new = checked_choice("new", ExecutionRecordStatus, new)
        row = self.memory.records.get((tenant_id, execution_id))
        if row is None or row.record.status != expected or row.record.status in TERMINAL_STATUSES:
            return False
        row.record = dataclasses.replace(
            row.record,
            status=new,
            updated_at=self.clock.now(),
            outcome=outcome if with_outcome else row.record.outcome,
        )
        row.moved = self.memory.next_sequence()
        return True

    async def transition(
        self,
        tenant_id: str,
        execution_id: str,
        expected: ExecutionRecordStatus,
        new: ExecutionRecordStatus,
    ) -> bool:
        return self._move(tenant_id, execution_id, expected, new, None, with_outcome=False)

    async def complete(
        self,
        tenant_id: str,
        execution_id: str,
        expected: ExecutionRecordStatus,
        final: ExecutionRecordStatus,
        outcome: JsonValue,
    ) -> bool:
        if checked_choice("final", ExecutionRecordStatus, final) not in TERMINAL_STATUSES:
            raise ValueError(f"a run completes as succeeded, failed or cancelled, not {final!r}")
        outcome = json_copy(outcome)
        if self._move(tenant_id, execution_id, expected, final, outcome, with_outcome=True):
            return True
        # A retry of a complete whose reply was lost: the run already has this outcome.
        row = self.memory.records.get((tenant_id, execution_id))
        return (
            row is not None
            and ExecutionRecordStatus(expected) not in TERMINAL_STATUSES
            and row.record.status == ExecutionRecordStatus(final)
            and row.record.outcome == outcome
        )


class InMemoryExecutionTreeRepository(ApplicationClockStore, ExecutionTreeRepository):
    """Request-scoped keys of a tree in an `InMemoryBackend`; the first write of a key wins."""

    async def save_if_absent(
        self, tenant_id: str, root_execution_id: str, key: str, value: JsonValue
    ) -> bool:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("root_execution_id", root_execution_id)
        checked_identifier("key", key)
        text = json_text(value)
        tree = self.memory.trees.setdefault((tenant_id, root_execution_id), {})
        if key in tree:
            return False
        tree[key] = text
        return True

    async def get(self, tenant_id: str, root_execution_id: str, key: str) -> JsonValue | None:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("root_execution_id", root_execution_id)
        checked_identifier("key", key)
        text = self.memory.trees.get((tenant_id, root_execution_id), {}).get(key)
        return None if text is None else json.loads(text)

    async def list(
        self, tenant_id: str, root_execution_id: str, prefix: str = ""
    ) -> dict[str, JsonValue]:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("root_execution_id", root_execution_id)
        checked_key_prefix(prefix)
        tree = self.memory.trees.get((tenant_id, root_execution_id), {})
        return {key: json.loads(tree[key]) for key in sorted(tree) if key.startswith(prefix)}

    async def delete_tree(self, tenant_id: str, root_execution_id: str) -> int:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("root_execution_id", root_execution_id)
        tree = self.memory.trees.pop((tenant_id, root_execution_id), {})
        return len(tree)


class InMemoryMeshRequestRepository(ApplicationClockStore, MeshRequestRepository):
    """Incoming requests in an `InMemoryBackend`, one run per tenant and idempotency key.

    Keys are per tenant: another tenant's request under the same key is another request.
    The same tenant and key with another fingerprint is `IdempotencyKeyConflictError`.
    """

    @staticmethod
    def _out(request: MeshRequest) -> MeshRequest:
        return dataclasses.replace(request, response=json_copy(request.response))

    async def save_if_absent(
        self, idempotency_key: str, tenant_id: str, fingerprint: str, received_at: int
    ) -> MeshRequestSaved:
        checked_mesh_request(idempotency_key, tenant_id, fingerprint, received_at)
        key = (tenant_id, idempotency_key)
        existing = self.memory.mesh_requests.get(key)
        if existing is not None:
            if existing.fingerprint != fingerprint:
                raise IdempotencyKeyConflictError(
                    f"idempotency key {idempotency_key!r} was used before with another "
                    "request: use a new key for new content"
                )
            return MeshRequestSaved(self._out(existing), False)
        request = MeshRequest(idempotency_key, tenant_id, fingerprint, received_at)
        self.memory.mesh_requests[key] = request
        return MeshRequestSaved(self._out(request), True)

    async def complete(self, tenant_id: str, idempotency_key: str, response: JsonValue) -> bool:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("idempotency_key", idempotency_key)
        response = json_copy(response)
        key = (tenant_id, idempotency_key)
        existing = self.memory.mesh_requests.get(key)
        if existing is None or existing.completed:
            return False
        self.memory.mesh_requests[key] = dataclasses.replace(
            existing, response=response, completed=True
        )
        return True

    async def get(self, tenant_id: str, idempotency_key: str) -> MeshRequest | None:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("idempotency_key", idempotency_key)
        request = self.memory.mesh_requests.get((tenant_id, idempotency_key))
        if request is None:
            return None
        return self._out(request)


def _snapshot_out(snapshot: ExecutionSnapshot) -> ExecutionSnapshot:
    return dataclasses.replace(snapshot, record=json_copy(snapshot.record))


class InMemoryExecutionHistoryRepository(ApplicationClockStore, ExecutionHistoryRepository):
    """Finished runs in an `InMemoryBackend`, listed newest first with keyset pages."""

    async def save(self, snapshot: ExecutionSnapshot) -> None:
        checked_snapshot(snapshot)
        stored = dataclasses.replace(snapshot, record=json_copy(snapshot.record))
        self.memory.history[(snapshot.tenant_id, snapshot.execution_id)] = stored

    async def get(self, tenant_id: str, execution_id: str) -> ExecutionSnapshot | None:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("execution_id", execution_id)
        snapshot = self.memory.history.get((tenant_id, execution_id))
        return None if snapshot is None else _snapshot_out(snapshot)

    async def list(
        self,
        tenant_id: str,
        *,
        since: int | None = None,
        until: int | None = None,
        limit: int = 100,
        after: HistoryCursor | None = None,
    ) -> Sequence[ExecutionSnapshot]:
        checked_identifier("tenant_id", tenant_id)
        checked_count("limit", limit)
        for what, time in (("since", since), ("until", until)):
            if time is not None:
                checked_time(what, time)
        if after is not None:
            checked_time("after.finished_at", after.finished_at)
            checked_identifier("after.execution_id", after.execution_id)
        found = [
            snapshot
            for snapshot in self.memory.history.values()
            if snapshot.tenant_id == tenant_id
            and (since is None or snapshot.finished_at >= since)
            and (until is None or snapshot.finished_at < until)
            and (
                after is None
                or (snapshot.finished_at, snapshot.execution_id)
                < (after.finished_at, after.execution_id)
            )
        ]
        found.sort(key=lambda s: (s.finished_at, s.execution_id), reverse=True)
        return [_snapshot_out(snapshot) for snapshot in found[:limit]]

    async def purge(self, older_than: int) -> int:
        checked_time("older_than", older_than)
        old = [key for key, s in self.memory.history.items() if s.finished_at < older_than]
        for key in old:
            del self.memory.history[key]
        return len(old)
