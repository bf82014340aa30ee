"""In-memory human-in-the-loop pauses."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from agboss_sql.contracts.clocks import Clock
from agboss_sql.contracts.errors import DuplicatePauseError, NotPausedError
from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.stores import PausedExecutionRepository
from agboss_sql.contracts.types import (
    ApplicationContext,
    JsonValue,
    PausedExecution,
    PauseStatus,
)
from agboss_sql.memory._fencing import checked_application, checked_clock
from agboss_sql.memory.backend import InMemoryBackend, PauseRow, json_copy

_PURGEABLE = frozenset({PauseStatus.TAKEN, PauseStatus.CANCELLED})


def _pause_out(pause: PausedExecution) -> PausedExecution:
    return dataclasses.replace(
        pause, request=json_copy(pause.request), decision=json_copy(pause.decision)
    )


class InMemoryPausedExecutionRepository(PausedExecutionRepository):
    """Pauses in an `InMemoryBackend`, answered once whichever instance answers.

    A pause id is unique whatever the tenant; a pause of another tenant reads as absent.
    `resolved_at` is when the pause was answered or cancelled; `purge` measures a taken or
    cancelled pause's age from it (from `created_at` when it has none).
    """

    backend: str | None = "in-memory"

    def __init__(
        self, backend: InMemoryBackend, clock: Clock, application: ApplicationContext
    ) -> None:
        self.memory = backend
        self.clock = checked_clock(clock)
        self.application = checked_application(application)

    async def ping(self) -> None:
        return None

    def _row(self, tenant_id: str, pause_id: str) -> PauseRow | None:
        row = self.memory.pauses.get(pause_id)
        if row is None or row.pause.tenant_id != tenant_id:
            return None
        return row

    async def save(self, pause: PausedExecution) -> None:
        checked_identifier("tenant_id", pause.tenant_id)
        checked_identifier("pause_id", pause.pause_id)
        checked_identifier("execution_id", pause.execution_id)
        checked_identifier("root_execution_id", pause.root_execution_id)
        stored = dataclasses.replace(
            pause,
            status=PauseStatus(pause.status),
            request=json_copy(pause.request),
            decision=json_copy(pause.decision),
        )
        if pause.pause_id in self.memory.pauses:
            raise DuplicatePauseError(f"pause {pause.pause_id!r} already exists")
        self.memory.pauses[pause.pause_id] = PauseRow(stored, self.memory.next_sequence())

    async def get(self, tenant_id: str, pause_id: str) -> PausedExecution | None:
        row = self._row(tenant_id, pause_id)
        return None if row is None else _pause_out(row.pause)

    async def resolve(self, tenant_id: str, pause_id: str, decision: JsonValue) -> PausedExecution:
        decision = json_copy(decision)
        row = self._row(tenant_id, pause_id)
        if row is None or row.pause.status is not PauseStatus.PENDING:
            found = "unknown" if row is None else row.pause.status.value
            raise NotPausedError(
                f"pause {pause_id!r} is not pending ({found}): it was answered, taken or "
                "cancelled already; read it with get()"
            )
        row.pause = dataclasses.replace(
            row.pause,
            status=PauseStatus.RESOLVED,
            decision=decision,
            resolved_at=self.clock.now(),
        )
        return _pause_out(row.pause)

    async def resolved(self, tenant_id: str, root_execution_id: str) -> Sequence[PausedExecution]:
        rows = sorted(
            (
                row
                for row in self.memory.pauses.values()
                if row.pause.tenant_id == tenant_id
                and row.pause.root_execution_id == root_execution_id
                and row.pause.status is PauseStatus.RESOLVED
            ),
            key=lambda r: (r.pause.created_at, r.sequence),
        )
        return [_pause_out(row.pause) for row in rows]

    async def take(self, tenant_id: str, pause_id: str) -> bool:
        row = self._row(tenant_id, pause_id)
        if row is None or row.pause.status is not PauseStatus.RESOLVED:
            return False
        row.pause = dataclasses.replace(row.pause, status=PauseStatus.TAKEN)
        return True

    async def cancel(self, tenant_id: str, pause_id: str) -> bool:
        row = self._row(tenant_id, pause_id)
        if row is None or row.pause.status is not PauseStatus.PENDING:
            return False
        row.pause = dataclasses.replace(
            row.pause, status=PauseStatus.CANCELLED, resolved_at=self.clock.now()
        )
        return True

    async def purge(self, older_than: int) -> int:
        old = [
            pause_id
            for pause_id, row in self.memory.pauses.items()
            if row.pause.status in _PURGEABLE
            and (
                row.pause.resolved_at if row.pause.resolved_at is not None else row.pause.created_at
            )
            < older_than
        ]
        for pause_id in old:
            del self.memory.pauses[pause_id]
        return len(old)
