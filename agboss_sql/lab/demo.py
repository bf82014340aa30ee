"""The demo: two instances on one database keep both promises through a takeover.

Instance A takes a tree's lease and charges an order in a fenced effect, then
freezes. Its lease expires; instance B takes the tree over at the next epoch
and runs the step again: the charge is replayed, not repeated. A wakes up as a
zombie and tries to charge again at its old epoch: refused. The lease log
tells the takeover from the zombie.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from agboss_sql.application import Application, DatabaseUrl, sql_stores
from agboss_sql.contracts import (
    ExecutionContext,
    ExecutionFencedError,
    ExecutionLease,
    ExecutionLeaseEvent,
    ExecutionLeaseEventRepository,
    ExecutionLeaseRepository,
    ExecutionTreeRepository,
    FencedEffectRepository,
    LeaseEventKind,
    StepRef,
    SystemClock,
    fenced_effect_key_of,
)
from agboss_sql.sql.schema import execution_tree_keys

LEASE_MS = 1_500


async def run_demo(url: str, *, out: Callable[[str], None] = print) -> int:
    """Run the demo on `url` (migrated first). 0 when both promises held."""
    from agboss_sql.sql.migrate import upgrade

    await asyncio.to_thread(upgrade, url)
    tenant, tree = "demo", f"tree-{uuid.uuid4().hex[:8]}"
    order = f"order-{uuid.uuid4().hex[:6]}"
    a = Application("demo", sql_stores(), {DatabaseUrl: DatabaseUrl(url)}, instance_id="pod-a")
    b = Application("demo", sql_stores(), {DatabaseUrl: DatabaseUrl(url)}, instance_id="pod-b")
    await a.start()
    await b.start()
    clock = SystemClock()
    try:
        log = a.store(ExecutionLeaseEventRepository)

        async def record(
            app: Application, lease: ExecutionLease, kind: LeaseEventKind, reason: str | None = None
        ) -> None:
            taken = lease.taken_over_from if kind is LeaseEventKind.TAKEN_OVER else None
            await log.save(
                ExecutionLeaseEvent(
                    tenant,
                    tree,
                    app.instance_id,
                    lease.lease_epoch,
                    kind,
                    clock.now(),
                    taken,
                    reason,
                )
            )

        async def charge(app: Application, lease: ExecutionLease) -> Any:
            step = StepRef(tree, "step-1:charge", "charge-card")
            key = fenced_effect_key_of(
                ExecutionContext(tenant, tree, tree, lease, step),
                "charge",
                business_key=order,
                fingerprint="amount=4200",
            )

            async def work(tx: Any) -> dict[str, Any]:
                # The business row, in the effect's own transaction.
                await tx.execute(
                    sa.insert(execution_tree_keys).values(
                        tenant_id=tenant,
                        root_execution_id=tree,
                        key=f"charged/{order}",
                        value=f'{{"by": "{app.instance_id}", "epoch": {lease.lease_epoch}}}',
                    )
                )
                return {"charged": 4200, "by": app.instance_id}

            return await app.store(FencedEffectRepository).save_result_if_absent(key, work)

        leases_a = a.store(ExecutionLeaseRepository)
        leases_b = b.store(ExecutionLeaseRepository)
        await leases_a.save_execution_id_if_absent(tenant, tree)
        first = await leases_a.acquire(tenant, tree, LEASE_MS)
        assert first is not None, "a fresh tree's lease is free"
        await record(a, first, LeaseEventKind.ACQUIRED)
        out(f"pod-a  acquired {tree} at epoch {first.lease_epoch} ({first.remaining_ms} ms)")
        result = await charge(a, first)
        out(f"pod-a  charged {order}: {result.value} (replayed: {result.replayed})")

        out(f"pod-a  freezes; its lease runs out in {LEASE_MS} ms ...")
        await asyncio.sleep((LEASE_MS + 200) / 1000)

        second = await leases_b.acquire(tenant, tree, 30_000)
        assert second is not None, "an expired lease is free"
        await record(b, second, LeaseEventKind.TAKEN_OVER)
        taken = second.taken_over_from
        out(
            f"pod-b  took {tree} over at epoch {second.lease_epoch}"
            f" (from {taken.instance_id} at {taken.lease_epoch})"
            if taken
            else ""
        )
        replay = await charge(b, second)
        out(f"pod-b  runs the step again: {replay.value} (replayed: {replay.replayed})")

        try:
            await charge(a, first)
            zombie = "accepted"
        except ExecutionFencedError as refused:
            zombie = f"refused ({refused.reason})"
            await record(a, first, LeaseEventKind.LOST, refused.reason)
        out(f"pod-a  wakes up as a zombie and charges again at epoch {first.lease_epoch}: {zombie}")

        await leases_b.finish(second)
        await record(b, second, LeaseEventKind.FINISHED)
        rows = await a.store(ExecutionTreeRepository).list(tenant, tree, "charged/")
        out(f"charges committed for {order}: {len(rows)}")
        out("lease log:")
        for event in await log.list(tenant, tree):
            frm = event.taken_over_from
            extra = f" from {frm.instance_id}@{frm.lease_epoch}" if frm else ""
            extra += f" ({event.reason})" if event.reason else ""
            out(f"  {event.instance_id} epoch {event.lease_epoch} {event.kind}{extra}")
        ok = len(rows) == 1 and replay.replayed and zombie.startswith("refused")
        out("one owner at a time, one effect per key: " + ("held" if ok else "BROKEN"))
        return 0 if ok else 1
    finally:
        await a.close()
        await b.close()
