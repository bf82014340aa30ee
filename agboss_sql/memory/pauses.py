"""In-memory human-in-the-loop pauses."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from agboss_sql.contracts.errors import DuplicatePauseError, NotPausedError
from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import checked_pause, checked_payloads_together, checked_time
from agboss_sql.contracts.stores import PausedExecutionRepository
from agboss_sql.contracts.types import (
    JsonValue,
    PausedExecution,
    PauseStatus,
)
from agboss_sql.memory._fencing import ApplicationClockStore
from agboss_sql.memory.backend import PauseRow, json_copy, json_text

_PURGEABLE = frozenset({PauseStatus.TAKEN, PauseStatus.CANCELLED})


def _pause_out(pause: PausedExecution) -> PausedExecution:
    return dataclasses.replace(
        pause, request=json_copy(pause.request), decision=json_copy(pause.decision)
    )


class InMemoryPausedExecutionRepository(ApplicationClockStore, PausedExecutionRepository):
    """Pauses in an `InMemoryBackend`, keyed by `(tenant_id, pause_id)`, answered once
    whichever instance answers.

    `resolved_at` is when the pause was answered or cancelled. `purge` measures a pause's
    age from when it was saved or last moved (resolved, taken, cancelled), on the
    application's clock.
    """

    def _row(self, tenant_id: str, pause_id: str) -> PauseRow | None:
        return self.memory.pauses.get((tenant_id, pause_id))

    async def save(self, pause: PausedExecution) -> None:
        checked_pause(pause)
        request, decision = json_text(pause.request), json_text(pause.decision)
        checked_payloads_together("a pause's request and decision", request, decision)
        stored = dataclasses.replace(
            pause,
            status=PauseStatus(pause.status),
            request=json.loads(request),
            decision=json.loads(decision),
        )
        key = (pause.tenant_id, pause.pause_id)
        if key in self.memory.pauses:
            raise DuplicatePauseError(
                f"pause {pause.pause_id!r} of tenant {pause.tenant_id!r} already exists"
            )
        self.memory.pauses[key] = PauseRow(stored, self.clock.now())

    async def get(self, tenant_id: str, pause_id: str) -> PausedExecution | None:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("pause_id", pause_id)
        row = self._row(tenant_id, pause_id)
        return None if row is None else _pause_out(row.pause)

    async def resolve(self, tenant_id: str, pause_id: str, decision: JsonValue) -> PausedExecution:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("pause_id", pause_id)
        decision = json_copy(decision)
        row = self._row(tenant_id, pause_id)
        if row is None or row.pause.status is not PauseStatus.PENDING:
            found = "unknown" if row is None else row.pause.status.value
            raise NotPausedError(
                f"pause {pause_id!r} is not pending ({found}): it was answered, taken or "
                "cancelled already; read it with get()"
            )
        now = self.clock.now()
        row.pause = dataclasses.replace(
            row.pause, status=PauseStatus.RESOLVED, decision=decision, resolved_at=now
        )
        row.updated_at = now
        return _pause_out(row.pause)

    async def resolved(self, tenant_id: str, root_execution_id: str) -> Sequence[PausedExecution]:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("root_execution_id", root_execution_id)
        rows = sorted(
            (
                row
                for row in self.memory.pauses.values()
                if row.pause.tenant_id == tenant_id
                and row.pause.root_execution_id == root_execution_id
                and row.pause.status is PauseStatus.RESOLVED
            ),
            key=lambda r: (r.pause.created_at, r.pause.pause_id),
        )
        return [_pause_out(row.pause) for row in rows]

    async def take(self, tenant_id: str, pause_id: str, *, taker: str | None = None) -> bool:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("pause_id", pause_id)
        if taker is not None:
            checked_identifier("taker", taker)
        row = self._row(tenant_id, pause_id)
        if row is None:
            return False
        if row.pause.status is PauseStatus.TAKEN:
            return taker is not None and row.taken_by == taker
        if row.pause.status is not PauseStatus.RESOLVED:
            return False
        row.pause = dataclasses.replace(row.pause, status=PauseStatus.TAKEN)
        row.taken_by = taker
        row.updated_at = self.clock.now()
        return True

    async def cancel(self, tenant_id: str, pause_id: str) -> bool:
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("pause_id", pause_id)
        row = self._row(tenant_id, pause_id)
        if row is None or row.pause.status is not PauseStatus.PENDING:
            return False
        now = self.clock.now()
        row.pause = dataclasses.replace(row.pause, status=PauseStatus.CANCELLED, resolved_at=now)
        row.updated_at = now
        return True

    async def purge(self, older_than: int) -> int:
        checked_time("older_than", older_than)
        old = [
            key
            for key, row in self.memory.pauses.items()
            if row.pause.status in _PURGEABLE and row.updated_at < older_than
        ]
        for key in old:
            del self.memory.pauses[key]
        return len(old)
