"""The sim's lease steps: acquire, renew, yield, reclaim, release, finish and
`lease_state_of`, each checked against the contract's model of the tree's lease."""

from __future__ import annotations

from agboss_sql.contracts.rules import FenceRefusal
from agboss_sql.contracts.types import ExecutionLease, LeaseState
from agboss_sql.testing.explorer._model import Inst, TreeModel
from agboss_sql.testing.explorer._sim_base import SimBase, article
from agboss_sql.testing.explorer._world import (
    LEASE_MS,
    NO_STALE_WRITE,
    NO_TAKEOVER_OF_FINISHED_WORK,
    ONE_LIVE_HOLDER,
    Broken,
)


class LeaseMoves(SimBase):
    """The lease steps of the sim."""

    # --- leases ---------------------------------------------------------------------

    def _lease_answer(self, lease: ExecutionLease | None) -> str:
        if lease is None:
            return "refused"
        text = f"epoch {lease.lease_epoch}, {lease.remaining_ms} ms left"
        came = lease.taken_over_from
        if came is not None:
            text += f", taken over from {came.instance_id} at {came.lease_epoch}"
        return text

    def _check_grant(self, inst: Inst, tree: TreeModel, epoch: int, how: str) -> None:
        now = self.now
        if tree.finished:
            raise Broken(
                NO_TAKEOVER_OF_FINISHED_WORK,
                f"{inst.name} was granted epoch {epoch} of {tree.name} by {how} after its work "
                f"was finished ({tree.finished_by}): finished work is never granted again",
            )
        if epoch in tree.granted:
            raise Broken(
                ONE_LIVE_HOLDER,
                f"{inst.name} was granted epoch {epoch} of {tree.name} by {how}, an epoch "
                f"already granted to {tree.granted[epoch]}: an epoch granted twice",
            )
        for other in self.insts:
            if other is inst or other.tree is not tree or other.lease is None:
                continue
            left = other.trust_left(now)
            if left > 0 and other.lease.lease_epoch != epoch:
                raise Broken(
                    ONE_LIVE_HOLDER,
                    f"{inst.name} was granted epoch {epoch} of {tree.name} while {other.name} "
                    f"still trusts epoch {other.lease.lease_epoch} for {left} ms: two live "
                    "holders",
                )

    def _check_holders(self, tree: TreeModel, what: str) -> None:
        now = self.now
        trusting = [
            i
            for i in self.insts
            if i.tree is tree and i.lease is not None and i.trust_left(now) > 0
        ]
        for a in trusting:
            for b in trusting:
                if (
                    a.index < b.index
                    and a.lease
                    and b.lease
                    and a.lease.lease_epoch != b.lease.lease_epoch
                ):
                    raise Broken(
                        ONE_LIVE_HOLDER,
                        f"{what} while {a.name} trusts epoch {a.lease.lease_epoch} for "
                        f"{a.trust_left(now)} ms and {b.name} epoch "
                        f"{b.lease.lease_epoch} for {b.trust_left(now)} ms: two live "
                        "holders",
                    )

    def _grant(self, inst: Inst, tree: TreeModel, lease: ExecutionLease, how: str) -> None:
        now = self.now
        epoch = lease.lease_epoch
        tree.granted[epoch] = f"{inst.name} by {how}"
        tree.epoch = epoch
        tree.holder = inst.index
        tree.expires_at = now + LEASE_MS
        tree.released = tree.yielded = tree.closed = False
        inst.lease = lease
        inst.contexts[epoch] = lease
        inst.holding = True
        inst.yielded = False
        inst.expiry = now + lease.remaining_ms
        inst.effect_done = False
        inst.reconciled = None

    async def _acquire(self, inst: Inst, check: bool, log: list[str] | None) -> None:
        tree = inst.tree
        try:
            lease = await self._leases(inst).acquire(self.tenant, tree.name, LEASE_MS)
        except Exception as exc:
            raise self._error(inst, f"acquire {tree.name}", exc) from exc
        if log is not None:
            self._said(log, f"{inst.name} acquire {tree.name}", self._lease_answer(lease))
        if lease is None:
            self.outcome = "acquire: refused"
            return
        self.outcome = "acquire: taken over" if lease.taken_over_from else "acquire: granted"
        if check:
            self._check_grant(inst, tree, lease.lease_epoch, "acquire")
        self._grant(inst, tree, lease, "acquire")

    async def _renew(
        self,
        inst: Inst,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        tree = inst.tree
        lease = given or inst.lease
        assert lease is not None
        stale = given is not None
        epoch = lease.lease_epoch
        now = self.now
        try:
            remaining = await self._leases(inst).renew(lease, LEASE_MS)
        except Exception as exc:
            raise self._error(inst, f"renew {tree.name} at {epoch}", exc) from exc
        if log is not None:
            self._said(
                log,
                f"{inst.name} renew {tree.name} at {epoch}{self._with(lease, stale)}",
                "over" if remaining is None else f"{remaining} ms left",
            )
        if remaining is None:
            self.outcome = "renew: over"
            if not stale:
                self._lost(inst)
            return
        self.outcome = "renew: renewed"
        reason = tree.refusal(epoch, inst.index, now)
        if check and reason is not None:
            raise Broken(
                NO_STALE_WRITE,
                f"{inst.name}'s renewal of epoch {epoch} of {tree.name} was accepted "
                f"({remaining} ms left) at {article(reason)} token",
            )
        if reason is None:
            tree.expires_at = max(tree.expires_at, now + LEASE_MS)
        if stale and reason is not None:
            return
        inst.lease = lease
        inst.holding = True
        inst.expiry = now + remaining
        if check:
            self._check_holders(
                tree, f"{inst.name}'s renewal of epoch {epoch} of {tree.name} was accepted"
            )

    async def _yield(
        self,
        inst: Inst,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        tree = inst.tree
        lease = given or inst.lease
        assert lease is not None
        stale = given is not None
        epoch = lease.lease_epoch
        now = self.now
        try:
            done = await self._leases(inst).yield_lease(lease)
        except Exception as exc:
            raise self._error(inst, f"yield {tree.name} at {epoch}", exc) from exc
        if log is not None:
            self._said(
                log,
                f"{inst.name} yield {tree.name} at {epoch}{self._with(lease, stale)}",
                "yielded" if done else "refused",
            )
        self.outcome = "yield: yielded" if done else "yield: refused"
        if not done:
            if not stale:
                self._lost(inst)
            return
        reason = tree.refusal(epoch, inst.index, now, yielded_ok=True)
        if check and reason is not None:
            raise Broken(
                NO_STALE_WRITE,
                f"{inst.name}'s yield of epoch {epoch} of {tree.name} was accepted at "
                f"{article(reason)} token",
            )
        if reason is None:
            tree.yielded = True
        if stale and reason is not None:
            return
        inst.lease = lease
        inst.holding = False
        inst.yielded = True
        inst.expiry = None

    async def _reclaim(
        self,
        inst: Inst,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        tree = inst.tree
        lease = given or inst.lease
        assert lease is not None
        stale = given is not None
        epoch = lease.lease_epoch
        now = self.now
        try:
            new = await self._leases(inst).reclaim(lease, LEASE_MS)
        except Exception as exc:
            raise self._error(inst, f"reclaim {tree.name} at {epoch}", exc) from exc
        if log is not None:
            self._said(
                log,
                f"{inst.name} reclaim {tree.name} at {epoch}{self._with(lease, stale)}",
                self._lease_answer(new),
            )
        self.outcome = "reclaim: refused" if new is None else "reclaim: granted"
        if new is None:
            if not stale:
                self._lost(inst)
            return
        if check:
            reason = tree.refusal(epoch, inst.index, now, yielded_ok=True)
            if reason is None and not tree.yielded:
                reason = "unyielded"
            if reason is not None:
                raise Broken(
                    NO_STALE_WRITE,
                    f"{inst.name}'s reclaim of epoch {epoch} of {tree.name} was accepted at "
                    f"{article(reason)} token",
                )
            self._check_grant(inst, tree, new.lease_epoch, "reclaim")
        self._grant(inst, tree, new, "reclaim")

    async def _let_go(
        self,
        inst: Inst,
        finish: bool,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        tree = inst.tree
        lease = given or inst.lease
        assert lease is not None
        stale = given is not None
        epoch = lease.lease_epoch
        what = "finish" if finish else "release"
        try:
            leases = self._leases(inst)
            done = await (leases.finish(lease) if finish else leases.release(lease))
        except Exception as exc:
            raise self._error(inst, f"{what} {tree.name} at {epoch}", exc) from exc
        if log is not None:
            self._said(
                log,
                f"{inst.name} {what} {tree.name} at {epoch}{self._with(lease, stale)}",
                ("finished" if finish else "released") if done else "refused",
            )
        reason = (
            tree.refusal(epoch, inst.index, self.now, live=False, yielded_ok=True)
            if done
            else "refused"
        )
        if not stale or reason is None:
            inst.holding = False
            inst.yielded = False
            inst.expiry = None
        self.outcome = f"{what}: {'done' if done else 'refused'}"
        if not done:
            return
        if check and reason in (FenceRefusal.SUPERSEDED, "never granted"):
            raise Broken(
                NO_STALE_WRITE,
                f"{inst.name}'s {what} of epoch {epoch} of {tree.name} was accepted at "
                f"{article(str(reason))} token: a zombie lets go of the new holder's lease",
            )
        if reason is None:
            tree.released = True
            if finish:
                tree.finished = True
                tree.finished_by = f"by {inst.name} at {epoch}"

    async def _lease_state_of(
        self, inst: Inst, tree: TreeModel, token: int, check: bool, log: list[str] | None
    ) -> LeaseState:
        calls = inst.stores.calls
        assert calls is not None
        try:
            state = await calls.lease_state_of(self.tenant, tree.name, token)
        except Exception as exc:
            raise self._error(inst, f"lease_state_of {tree.name} at {token}", exc) from exc
        state = LeaseState(state)
        self.outcome = f"lease_state_of: {state.value}"
        if log is not None:
            self._said(log, f"{inst.name} lease_state_of {tree.name} at {token}", state.value)
        self._after_state(inst, tree, token, state, check)
        return state
