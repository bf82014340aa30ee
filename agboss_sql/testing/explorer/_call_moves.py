"""The sim's steps of the step's fenced effect and of the outbound call's protocol (read,
record, reconcile, claim, send, end), each checked against the invariants."""

from __future__ import annotations

from typing import Any

from agboss_sql.contracts.errors import ExecutionFencedError
from agboss_sql.contracts.keys import parse_attempt_owner
from agboss_sql.contracts.types import AttemptRef, ExecutionLease, LeaseState, OutboundCallStatus
from agboss_sql.testing.explorer._model import Inst, TreeModel
from agboss_sql.testing.explorer._sim_base import SimBase, article
from agboss_sql.testing.explorer._world import (
    _COMPLETED,
    _FAILED,
    _PENDING,
    ABSENT,
    BUSINESS_KEY,
    EFFECT_NAME,
    INTENT,
    NO_STALE_WRITE,
    ONE_EFFECT_PER_KEY,
    ONE_SEND_PER_BUSINESS_KEY,
    STEP_KEY,
    STORE_ERROR,
    Broken,
    View,
)


class CallMoves(SimBase):
    """The fenced-effect and outbound-call steps of the sim."""

    # --- the step's fenced effect ---------------------------------------------------

    def _stale_write(self, inst: Inst, what: str, epoch: int) -> None:
        reason = inst.tree.refusal(epoch, inst.index, self.now)
        if reason is not None:
            raise Broken(
                NO_STALE_WRITE,
                f"{inst.name}'s {what} at token {epoch} of {inst.tree.name} was accepted at "
                f"{article(reason)} token",
            )

    async def _effect(
        self,
        inst: Inst,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        tree = inst.tree
        lease = given or inst.lease
        stale = given is not None
        effects = inst.stores.effects
        assert lease is not None and effects is not None
        epoch = lease.lease_epoch
        key = self.key_of(tree, epoch, lease.holder_instance_id)
        row = f"{self.prefix}{tree.name}/{STEP_KEY}/{EFFECT_NAME} by {inst.name} at {epoch}"
        value = {"written_by": inst.name, "token": epoch}
        rows = self.business_rows

        async def work(tx: Any) -> Any:
            if rows is not None:
                await rows.insert(tx, row)
            return value

        text = (
            f"{inst.name} fenced effect {EFFECT_NAME} of {tree.name} {STEP_KEY} at {epoch}"
            f"{self._with(lease, stale)}"
            if log is not None
            else ""
        )
        try:
            result = await effects.save_result_if_absent(key, work)
        except ExecutionFencedError as exc:
            self.outcome = f"effect: refused ({exc.reason})"
            if log is not None:
                self._said(log, text, f"refused ({exc.reason})")
            if not stale:
                self._lost(inst)
            if check:
                await self._check_rows(tree)
            return
        except Exception as exc:
            raise self._error(inst, f"fenced effect at {epoch}", exc) from exc
        if log is not None:
            self._said(
                log,
                text,
                "replayed" if result.replayed else "written",
            )
        self.outcome = "effect: replayed" if result.replayed else "effect: written"
        if check:
            self._stale_write(inst, "fenced effect", epoch)
        if result.replayed:
            if check and result.value != self.effect_value:
                raise Broken(
                    ONE_EFFECT_PER_KEY,
                    f"{inst.name}'s fenced effect at token {epoch} replayed {result.value!r}, "
                    f"which no write stored (stored: {self.effect_value!r})",
                )
        else:
            if check and self.effect_by is not None:
                raise Broken(
                    ONE_EFFECT_PER_KEY,
                    f"the step's fenced effect {EFFECT_NAME} of {tree.name} ran again: "
                    f"{inst.name} at token {epoch} wrote it after {self.effect_by} had",
                )
            if self.effect_by is None:
                self.effect_by = f"{inst.name} at token {epoch}"
                self.effect_value = value
        if not stale:
            inst.effect_done = True
        if check:
            await self._check_rows(tree)

    async def _check_rows(self, tree: TreeModel) -> None:
        rows = self.business_rows
        if rows is None:
            return
        prefix = self.prefix
        mine = [r[len(prefix) :] for r in await rows.committed() if r.startswith(prefix)]
        if len(mine) > 1:
            raise Broken(
                ONE_EFFECT_PER_KEY,
                f"the step's fenced effect {EFFECT_NAME} of {tree.name} wrote {len(mine)} "
                f"business rows ({'; '.join(mine)}): one effect per key",
            )

    # --- the outbound call ----------------------------------------------------------

    def _see(self, inst: Inst, view: View | str) -> None:
        if view != inst.view:
            inst.reconciled = None
        inst.view = view
        if isinstance(view, tuple) and view[0] == _COMPLETED:
            inst.done = True

    @staticmethod
    def _view_of(call: Any) -> View:
        return (OutboundCallStatus(call.status).value, int(call.attempt), str(call.attempt_owner))

    async def _read(self, inst: Inst, log: list[str] | None) -> None:
        calls = inst.stores.calls
        assert calls is not None
        epoch = inst.lease.lease_epoch if inst.lease else 0
        try:
            call = await calls.get(self.key_of(inst.tree, epoch, inst.name))
        except Exception as exc:
            raise self._error(inst, "read the call", exc) from exc
        view: View | str = ABSENT if call is None else self._view_of(call)
        self.outcome = "read: absent" if call is None else f"read: {view[0]}"
        if log is not None:
            self._said(log, f"{inst.name} read the call {self.call_text()}", self.view_text(view))
        self._see(inst, view)

    async def _record(
        self,
        inst: Inst,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        calls = inst.stores.calls
        lease = given or inst.lease
        stale = given is not None
        assert calls is not None and lease is not None
        tree = inst.tree
        epoch = lease.lease_epoch
        text = (
            f"{inst.name} record the call {self.call_text()} at {tree.name} {epoch}"
            f"{self._with(lease, stale)}"
            if log is not None
            else ""
        )
        try:
            saved = await calls.save_if_absent(
                self.key_of(tree, epoch, lease.holder_instance_id), INTENT, self.now
            )
        except ExecutionFencedError as exc:
            self.outcome = f"record: refused ({exc.reason})"
            if log is not None:
                self._said(log, text, f"refused ({exc.reason})")
            if not stale:
                self._lost(inst)
            return
        except Exception as exc:
            raise self._error(inst, f"record the call at {epoch}", exc) from exc
        view = self._view_of(saved.call)
        self.outcome = "record: created" if saved.created else "record: found"
        if log is not None:
            self._said(
                log, text, f"{'created' if saved.created else 'found'}, {self.view_text(view)}"
            )
        if check:
            self._stale_write(inst, "record of the call", epoch)
        if saved.created:
            self.rows[self.identity_of(tree)] = view
        self._see(inst, view)

    async def _reconcile(self, inst: Inst, check: bool, log: list[str] | None) -> None:
        view = inst.view
        assert isinstance(view, tuple)
        _, attempt, owner = view
        parsed = parse_attempt_owner(owner)
        if parsed is None:
            raise Broken(
                STORE_ERROR,
                f"{inst.name} read attempt {attempt} of the call owned by {owner!r}, which "
                "names no lease",
            )
        tree = next((t for t in self.trees if t.name == parsed.execution_id), None)
        calls = inst.stores.calls
        assert calls is not None
        try:
            state = LeaseState(
                await calls.lease_state_of(parsed.tenant_id, parsed.execution_id, parsed.token)
            )
        except Exception as exc:
            raise self._error(
                inst, f"lease_state_of {parsed.execution_id} at {parsed.token}", exc
            ) from exc
        self.outcome = f"reconcile: {state.value}"
        if tree is not None:
            self._after_state(inst, tree, parsed.token, state, check)
        if state is LeaseState.LIVE:
            inst.reconciled = "live"
            found = "its owner may still send it: wait"
        else:
            identity = self.identity_of(inst.tree)
            landed = any(
                c[0] == identity and c[1] == attempt and c[2] == owner for c in self.charges
            )
            inst.reconciled = "landed" if landed else "not-landed"
            self.outcome = f"reconcile: {state.value}, {inst.reconciled}"
            found = "the other system has it" if landed else "the other system never got it"
        if log is not None:
            self._said(
                log,
                f"{inst.name} reconcile attempt {attempt} of {self.owner_text(owner)}",
                f"lease_state_of {parsed.execution_id} at {parsed.token}: {state.value}; {found}",
            )

    async def _claim(
        self,
        inst: Inst,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        calls = inst.stores.calls
        lease = given or inst.lease
        stale = given is not None
        view = inst.view
        assert calls is not None and lease is not None and isinstance(view, tuple)
        tree = inst.tree
        epoch = lease.lease_epoch
        status, attempt, owner = view
        mine = self.owner_of(tree, epoch)
        expected = AttemptRef(OutboundCallStatus(status), attempt, owner)
        text = (
            f"{inst.name} claim attempt {attempt + 1} after {self.view_text(view)}, at "
            f"{tree.name} {epoch}{self._with(lease, stale)}"
            if log is not None
            else ""
        )
        try:
            claimed = await calls.mark_pending(
                self.key_of(tree, epoch, lease.holder_instance_id), expected, mine
            )
        except ExecutionFencedError as exc:
            self.outcome = f"claim: refused ({exc.reason})"
            if log is not None:
                self._said(log, text, f"refused ({exc.reason})")
            if not stale:
                self._lost(inst)
            return
        except Exception as exc:
            raise self._error(inst, f"claim attempt {attempt + 1}", exc) from exc
        if log is not None:
            self._said(
                log, text, f"claimed attempt {attempt + 1}" if claimed else "lost (the row moved)"
            )
        self.outcome = f"claim: claimed after {status}" if claimed else "claim: lost"
        if not claimed:
            inst.view = None
            inst.reconciled = None
            return
        if check:
            self._stale_write(inst, f"claim of attempt {attempt + 1}", epoch)
        new: View = (_PENDING, attempt + 1, mine)
        self.rows[self.identity_of(tree)] = new
        inst.claimed = AttemptRef(OutboundCallStatus.PENDING, attempt + 1, mine)
        inst.sent = None
        self._see(inst, new)

    def _send(self, inst: Inst, charged: bool, check: bool, log: list[str] | None) -> None:
        claimed = inst.claimed
        assert claimed is not None
        identity = self.identity_of(inst.tree)
        if charged:
            self.charges.append((identity, claimed.attempt, claimed.attempt_owner, inst.name))
        inst.sent = "charged" if charged else "refused"
        self.outcome = f"send: {inst.sent}"
        if log is not None:
            self._said(
                log,
                f"{inst.name} send attempt {claimed.attempt} of the call",
                "charged" if charged else "refused by the other system (not charged)",
            )
        if check and charged:
            sends = [c for c in self.charges if c[0] == identity]
            if len(sends) > 1:
                what = (
                    f"business key {BUSINESS_KEY}"
                    if self.world.business_key
                    else f"the call {self.call_text()}"
                )
                detail = "; ".join(
                    f"attempt {a} sent by {who} under {self.owner_text(o)}"
                    for _, a, o, who in sends
                )
                raise Broken(
                    ONE_SEND_PER_BUSINESS_KEY,
                    f"the other system was charged {len(sends)} times for {what}: {detail}",
                )

    async def _end(
        self,
        inst: Inst,
        check: bool,
        log: list[str] | None,
        given: ExecutionLease | None = None,
    ) -> None:
        calls = inst.stores.calls
        lease = given or inst.lease
        stale = given is not None
        assert calls is not None and lease is not None
        tree = inst.tree
        epoch = lease.lease_epoch
        if inst.claimed is not None:
            ref = inst.claimed
            completed = inst.sent != "refused"
            whose = "its"
        else:
            view = inst.view
            assert isinstance(view, tuple)
            ref = AttemptRef(OutboundCallStatus.PENDING, view[1], view[2])
            completed = True
            whose = f"{self.owner_text(view[2])}'s"
        key = self.key_of(tree, epoch, lease.holder_instance_id)
        verb = "complete" if completed else "fail"
        text = (
            f"{inst.name} {verb} {whose} attempt {ref.attempt}, at {tree.name} {epoch}"
            f"{self._with(lease, stale)}"
            if log is not None
            else ""
        )
        try:
            if completed:
                ended = await calls.mark_completed(key, ref, {"charged": True})
            else:
                ended = await calls.mark_failed(key, ref, {"refused": True})
        except ExecutionFencedError as exc:
            self.outcome = f"end: refused ({exc.reason})"
            if log is not None:
                self._said(log, text, f"refused ({exc.reason})")
            if not stale:
                self._lost(inst)
            return
        except Exception as exc:
            raise self._error(inst, f"{verb} attempt {ref.attempt}", exc) from exc
        if log is not None:
            self._said(
                log,
                text,
                ("completed" if completed else "failed") if ended else "lost (the row moved)",
            )
        self.outcome = f"end: {'completed' if completed else 'failed'}" if ended else "end: lost"
        if whose != "its":
            self.outcome += " for another owner"
        inst.claimed = None
        inst.sent = None
        if not ended:
            inst.view = None
            inst.reconciled = None
            return
        if check:
            self._stale_write(inst, f"{verb} of attempt {ref.attempt}", epoch)
        new: View = (_COMPLETED if completed else _FAILED, ref.attempt, ref.attempt_owner)
        self.rows[self.identity_of(tree)] = new
        self._see(inst, new)
