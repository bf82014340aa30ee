"""The writer's lease that a fenced saver's writes carry in their config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from langchain_core.runnables import RunnableConfig

from agboss_sql.contracts.errors import InvalidIdentifierError
from agboss_sql.contracts.keys import checked_identifier, scope_key_of
from agboss_sql.contracts.rules import checked_token
from agboss_sql.contracts.types import ExecutionLease

LEASE_KEY = "agboss_lease"
"""The `configurable` key that carries the writer's lease to a fenced saver: an
`ExecutionLease`, or a dict with `tenant_id`, `execution_id`, `lease_epoch` and
`holder_instance_id` (the instance the epoch was granted to: the fence checks it)."""


@dataclass(frozen=True, slots=True)
class CheckpointLease:
    """The lease a fenced checkpoint write is made under: what the fence (`_fence`) checks."""

    tenant_id: str
    lease_execution_id: str
    token: int
    scope_key: str
    holder_instance_id: str


def lease_of(config: RunnableConfig) -> CheckpointLease:
    """The lease in `config["configurable"][LEASE_KEY]`, its identifiers, epoch and holder
    checked; `ValueError` when it is missing or incomplete (a lease that names no holder
    included: the fence checks the holder as it checks the epoch)."""
    lease = (config.get("configurable") or {}).get(LEASE_KEY)
    if isinstance(lease, ExecutionLease):
        tenant_id, execution_id, token = lease.tenant_id, lease.execution_id, lease.lease_epoch
        holder = lease.holder_instance_id
    elif isinstance(lease, Mapping):
        try:
            tenant_id = lease["tenant_id"]
            execution_id = lease["execution_id"]
            token = lease["lease_epoch"]
            holder = lease["holder_instance_id"]
        except KeyError as missing:
            raise ValueError(
                f"configurable[{LEASE_KEY!r}] lacks {missing}: give tenant_id, "
                "execution_id, lease_epoch and holder_instance_id (or the ExecutionLease "
                "itself)"
            ) from None
    else:
        raise ValueError(
            f"this saver is fenced: every write needs the writer's lease in "
            f"configurable[{LEASE_KEY!r}] (an ExecutionLease, or a dict of tenant_id, "
            f"execution_id, lease_epoch and holder_instance_id), got {type(lease).__name__}"
        )
    tenant_id = checked_identifier("tenant_id", tenant_id)
    execution_id = checked_identifier("execution_id", execution_id)
    try:
        holder = checked_identifier("holder_instance_id", holder)
    except InvalidIdentifierError as exc:
        raise ValueError(
            f"configurable[{LEASE_KEY!r}] names no holder the fence can check: {exc}"
        ) from None
    return CheckpointLease(
        tenant_id,
        execution_id,
        checked_token(token),
        scope_key_of(tenant_id, execution_id),
        holder,
    )
