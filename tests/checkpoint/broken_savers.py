"""Fenced savers broken one rule each, for `test_saver_contract.py`: the reusable contract
must fail each at the case that names its mistake (`BROKEN`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import sqlalchemy as sa

from agboss_sql.contracts.errors import ExecutionFencedError
from agboss_sql.contracts.keys import scope_key_of
from agboss_sql.contracts.rules import fence_refusal_of
from agboss_sql.contracts.types import ExecutionLease
from agboss_sql.sql.checkpoint import LEASE_KEY, SqlCheckpointSaver
from agboss_sql.sql.checkpoint._lease import lease_of
from agboss_sql.sql.schema import execution_leases

L = execution_leases.c


class _WithUnfencedTwin(SqlCheckpointSaver):
    """A fenced saver with an unfenced twin on its connection, to hand some writes to."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.twin = SqlCheckpointSaver(self.connection, serde=self.serde)

    async def aclose(self) -> None:
        await self.twin.aclose()
        await super().aclose()


class SaverSkippingTheLeaseOnWrites(_WithUnfencedTwin):
    """Checkpoints are fenced, pending writes are not (async and sync)."""

    async def aput_writes(self, config: Any, *args: Any, **kwargs: Any) -> None:
        await self.twin.aput_writes(config, *args, **kwargs)

    def put_writes(self, config: Any, *args: Any, **kwargs: Any) -> None:
        self.twin.put_writes(config, *args, **kwargs)


class SaverWithUnfencedSyncMethods(_WithUnfencedTwin):
    """The async methods are fenced, the sync ones (a sync graph's) are not."""

    def put(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        return self.twin.put(config, *args, **kwargs)

    def put_writes(self, config: Any, *args: Any, **kwargs: Any) -> None:
        self.twin.put_writes(config, *args, **kwargs)


class SaverCheckingThenWriting(_WithUnfencedTwin):
    """Reads the lease and decides as the fence would, then writes in a step of its own: a
    takeover between the two goes unseen."""

    async def _check(self, config: Any) -> None:
        lease = lease_of(config)
        row = (
            await self.connection.execute(
                sa.select(
                    L.lease_epoch, L.holder_instance_id, L.released, L.yielded, L.finished,
                    L.closed_reason, L.expires_at, L.fence_token,
                ).where(L.tenant_id == lease.tenant_id, L.execution_id == lease.lease_execution_id)
            )
        ).first()  # fmt: skip
        scope = scope_key_of(lease.tenant_id, lease.lease_execution_id)
        if row is None:
            raise ExecutionFencedError(scope, lease.token, "lease-absent")
        epoch, granted_to, released, yielded, finished, closed, expires_at, mark = row
        reason = fence_refusal_of(
            lease.token,
            holder=lease.holder_instance_id,
            epoch=epoch,
            granted_to=granted_to,
            released=bool(released),
            yielded=bool(yielded),
            finished=bool(finished),
            closed_reason=closed,
            expires_at=expires_at,
            now=self.store_clock.now(),
            mark=mark,
        )
        if reason is not None:
            raise ExecutionFencedError(scope, lease.token, str(reason))

    async def aput(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        await self._check(config)
        return await self.twin.aput(config, *args, **kwargs)

    async def aput_writes(self, config: Any, *args: Any, **kwargs: Any) -> None:
        await self._check(config)
        await self.twin.aput_writes(config, *args, **kwargs)


class SaverTrustingTheEpoch(SqlCheckpointSaver):
    """The fence checks the epoch alone (each write goes under the name of whoever holds the
    lease now), as the saver did before writes named their holder."""

    async def _as_holder(self, config: Any) -> Any:
        lease = config["configurable"].get(LEASE_KEY)
        if isinstance(lease, dict) and "tenant_id" in lease and "execution_id" in lease:
            lease = dict(lease)
            tenant, execution = lease["tenant_id"], lease["execution_id"]
        elif isinstance(lease, ExecutionLease):
            tenant, execution = lease.tenant_id, lease.execution_id
        else:
            return config  # refused as the sound saver refuses it
        row = await self.connection.execute(
            sa.select(L.holder_instance_id).where(
                L.tenant_id == tenant, L.execution_id == execution
            )
        )
        holder = row.scalar()
        if holder is None:
            return config
        if isinstance(lease, dict):
            lease["holder_instance_id"] = holder
        else:
            lease = dataclasses.replace(lease, holder_instance_id=holder)
        return {**config, "configurable": {**config["configurable"], LEASE_KEY: lease}}

    async def aput(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        return await super().aput(await self._as_holder(config), *args, **kwargs)

    async def aput_writes(self, config: Any, *args: Any, **kwargs: Any) -> None:
        await super().aput_writes(await self._as_holder(config), *args, **kwargs)


BROKEN: dict[str, tuple[type[SqlCheckpointSaver], set[str]]] = {
    "skips the lease on put_writes": (
        SaverSkippingTheLeaseOnWrites,
        {
            "a_late_writer_is_refused_after_a_takeover",
            "a_late_sync_writer_is_refused_after_a_takeover",
            "the_fence_decides_by_the_store_s_time_at_the_expiry",
            "a_write_without_a_lease_or_its_holder_is_refused",
            "a_lease_under_another_holder_s_name_is_refused",
            "the_lease_check_and_the_write_are_one_step",
            # the zombie's answer is stored as a pending write, and the new holder runs it
            "a_graph_stops_at_its_first_write_after_a_takeover",
        },
    ),
    "unfenced sync methods": (
        SaverWithUnfencedSyncMethods,
        {"a_late_sync_writer_is_refused_after_a_takeover"},
    ),
    "checks the lease, then writes": (
        SaverCheckingThenWriting,
        {
            "the_lease_check_and_the_write_are_one_step",
            # its read of the lease is sent before the size is checked
            "max_checkpoint_write_bytes_bounds_a_put_with_its_metadata",
            "max_checkpoint_write_bytes_bounds_put_writes_with_its_channel_names",
        },
    ),
    "trusts the epoch": (
        SaverTrustingTheEpoch,
        {
            "a_lease_under_another_holder_s_name_is_refused",
            # a lease that names no holder is given the holder's name, and writes
            "a_write_without_a_lease_or_its_holder_is_refused",
            # its read of the holder is sent before the write's own step
            "the_lease_check_and_the_write_are_one_step",
            "max_checkpoint_write_bytes_bounds_a_put_with_its_metadata",
            "max_checkpoint_write_bytes_bounds_put_writes_with_its_channel_names",
        },
    ),
}
"""Each broken saver, and the cases (by method name, without `test_checkpoint_saver__`)
the contract fails it at: every other case passes."""
