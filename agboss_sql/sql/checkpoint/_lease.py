"""The writer's lease that a fenced saver's writes carry in their config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from langchain_core.runnables import RunnableConfig

from agboss_sql.contracts.keys import checked_identifier, scope_key_of
from agboss_sql.contracts.rules import checked_token
from agboss_sql.contracts.types import ExecutionLease

LEASE_KEY = "agboss_lease"
"""The `configurable` key that carries the writer's lease to a fenced saver: an
`ExecutionLease`, or a dict with `tenant_id`, `execution_id` and `lease_epoch`."""


@dataclass(frozen=True, slots=True)
class CheckpointLease:
    """The lease a fenced checkpoint write is made under: what the fence (`_fence`) checks."""

    tenant_id: str
    lease_execution_id: str
    token: int
    scope_key: str


def lease_of(config: RunnableConfig) -> CheckpointLease:
    """The lease in `config["configurable"][LEASE_KEY]`, its identifiers and epoch checked;
    `ValueError` when it is missing or incomplete."""
    lease = (config.get("configurable") or {}).get(LEASE_KEY)
    if isinstance(lease, ExecutionLease):
        tenant_id, execution_id, token = lease.tenant_id, lease.execution_id, lease.lease_epoch
    elif isinstance(lease, Mapping):
        try:
            tenant_id = lease["tenant_id"]
            execution_id = lease["execution_id"]
            token = lease["lease_epoch"]
        except KeyError as missing:
            raise ValueError(
                f"configurable[{LEASE_KEY!r}] lacks {missing}: give tenant_id, "
                "execution_id and lease_epoch (or the ExecutionLease itself)"
            ) from None
    else:
        raise ValueError(
            f"this saver is fenced: every write needs the writer's lease in "
            f"configurable[{LEASE_KEY!r}] (an ExecutionLease, or a dict of tenant_id, "
            f"execution_id and lease_epoch), got {type(lease).__name__}"
        )
    tenant_id = checked_identifier("tenant_id", tenant_id)
    execution_id = checked_identifier("execution_id", execution_id)
    return CheckpointLease(
        tenant_id, execution_id, checked_token(token), scope_key_of(tenant_id, execution_id)
    )
