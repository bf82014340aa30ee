"""`WorkflowHandle`: a started run, to read its status or wait for its result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from agboss_sql.contracts.types import JsonValue
from agboss_sql.runtime.workflows import WorkflowStatus


class RunReader(Protocol):
    """What a handle asks of its engine."""

    async def status(self, workflow_id: str, *, tenant_id: str = ...) -> WorkflowStatus: ...

    async def result(
        self, workflow_id: str, *, tenant_id: str = ..., timeout_s: float | None = ...
    ) -> JsonValue: ...


@dataclass(frozen=True, slots=True)
class WorkflowHandle:
    """A started run: read its status or wait for its result (`Engine.status`,
    `Engine.result`) from the instance that holds the handle."""

    engine: RunReader
    tenant_id: str
    workflow_id: str

    async def status(self) -> WorkflowStatus:
        return await self.engine.status(self.workflow_id, tenant_id=self.tenant_id)

    async def result(self, *, timeout_s: float | None = None) -> JsonValue:
        return await self.engine.result(
            self.workflow_id, tenant_id=self.tenant_id, timeout_s=timeout_s
        )


__all__ = ["RunReader", "WorkflowHandle"]
