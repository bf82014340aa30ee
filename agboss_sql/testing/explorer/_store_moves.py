"""The sim's steps on the stores that fence nothing: the pauses (resolve, take, cancel,
read a tenant's pause) and the cost ledger (reserve, record, read a budget's total), each
checked against the contract's model built from the store's answers."""

from __future__ import annotations

import asyncio

from agboss_sql.contracts.errors import NotPausedError
from agboss_sql.contracts.stores import CostLedgerRepository, PausedExecutionRepository
from agboss_sql.contracts.types import (
    BudgetScope,
    CostEntry,
    PausedExecution,
    PauseStatus,
)
from agboss_sql.testing.explorer._model import Inst
from agboss_sql.testing.explorer._sim_base import SimBase
from agboss_sql.testing.explorer._world import (
    BUDGET_MICROS,
    ENTRY_MICROS,
    PAUSE_ANSWERED_ONCE,
    SPEND_WITHIN_BUDGET,
    Broken,
)

PAUSE_ID = "pause-1"
EXECUTION = "tree-1"
ENTRY_ID = "entry-1"


def _decision(inst: Inst) -> dict[str, str]:
    return {"by": inst.name}


class StoreMoves(SimBase):
    """The pause and cost-ledger steps of the sim."""

    # --- pauses ---------------------------------------------------------------------

    def _pauses(self, inst: Inst) -> PausedExecutionRepository:
        pauses = inst.stores.pauses
        assert pauses is not None
        return pauses

    async def _save_pauses(self) -> None:
        """The world's set-up: one pending pause of the same id in each tenant."""
        pauses = self._pauses(self.insts[0])
        for model in self.pauses:
            await pauses.save(
                PausedExecution(
                    tenant_id=model.tenant,
                    pause_id=PAUSE_ID,
                    execution_id=EXECUTION,
                    root_execution_id=EXECUTION,
                    thread_id=None,
                    status=PauseStatus.PENDING,
                    request={"ask": "approve?"},
                    decision=None,
                    created_at=self.now,
                )
            )

    def _pause_broken(self, inst: Inst, what: str, answer: str, expected: str) -> Broken:
        return Broken(
            PAUSE_ANSWERED_ONCE,
            f"{inst.name}'s {what} answered {answer} where the contract answers {expected}: "
            "a pause is answered once, taken by one taker, and one tenant's pause never "
            "moves another's",
        )

    async def _resolve(self, inst: Inst, t: int, check: bool, log: list[str] | None) -> None:
        model = self.pauses[t]
        what = f"resolve of {PAUSE_ID} in {model.tenant}"
        try:
            found: PausedExecution | None = await self._pauses(inst).resolve(
                model.tenant, PAUSE_ID, _decision(inst)
            )
        except NotPausedError:
            found = None
        except Exception as exc:
            raise self._error(inst, what, exc) from exc
        answer = "not pending" if found is None else "resolved"
        self._said(log, f"{inst.name} resolve {PAUSE_ID} of {model.tenant}", answer)
        self.outcome = f"resolve: {'resolved' if found else 'not pending'}"
        pending = model.status is PauseStatus.PENDING
        if check:
            if found is None and pending:
                raise self._pause_broken(inst, what, "not pending", "resolved")
            if found is not None and not pending:
                raise self._pause_broken(
                    inst,
                    what,
                    "resolved",
                    f"not pending (it was {model.status.value}"
                    + (f", answered by {model.decision})" if model.decision else ")"),
                )
            if found is not None and (
                PauseStatus(found.status) is not PauseStatus.RESOLVED
                or found.decision != _decision(inst)
                or found.tenant_id != model.tenant
            ):
                raise self._pause_broken(
                    inst,
                    what,
                    f"{found.status} with {found.decision!r} of {found.tenant_id}",
                    f"resolved with {_decision(inst)!r} of {model.tenant}",
                )
        if found is not None and pending:
            model.status = PauseStatus.RESOLVED
            model.decision = inst.name

    async def _take(self, inst: Inst, t: int, check: bool, log: list[str] | None) -> None:
        model = self.pauses[t]
        what = f"take of {PAUSE_ID} in {model.tenant}"
        try:
            took = bool(await self._pauses(inst).take(model.tenant, PAUSE_ID, taker=inst.name))
        except Exception as exc:
            raise self._error(inst, what, exc) from exc
        self._said(log, f"{inst.name} take {PAUSE_ID} of {model.tenant}", str(took))
        self.outcome = f"take: {took}"
        resolved = model.status is PauseStatus.RESOLVED
        expected = resolved or (model.status is PauseStatus.TAKEN and model.taker == inst.name)
        if check and took != expected:
            held = f"{model.status.value}" + (f" by {model.taker}" if model.taker else "")
            raise self._pause_broken(inst, f"{what} (it was {held})", str(took), str(expected))
        if took and resolved:
            model.status = PauseStatus.TAKEN
            model.taker = inst.name

    async def _cancel(self, inst: Inst, t: int, check: bool, log: list[str] | None) -> None:
        model = self.pauses[t]
        what = f"cancel of {PAUSE_ID} in {model.tenant}"
        try:
            done = bool(await self._pauses(inst).cancel(model.tenant, PAUSE_ID))
        except Exception as exc:
            raise self._error(inst, what, exc) from exc
        self._said(log, f"{inst.name} cancel {PAUSE_ID} of {model.tenant}", str(done))
        self.outcome = f"cancel: {done}"
        pending = model.status is PauseStatus.PENDING
        if check and done != pending:
            raise self._pause_broken(
                inst, f"{what} (it was {model.status.value})", str(done), str(pending)
            )
        if done and pending:
            model.status = PauseStatus.CANCELLED

    async def _get_pause(self, inst: Inst, t: int, check: bool, log: list[str] | None) -> None:
        model = self.pauses[t]
        what = f"read of {PAUSE_ID} in {model.tenant}"
        try:
            found = await self._pauses(inst).get(model.tenant, PAUSE_ID)
        except Exception as exc:
            raise self._error(inst, what, exc) from exc
        seen = (
            "absent" if found is None else f"{PauseStatus(found.status).value} {found.decision!r}"
        )
        self._said(log, f"{inst.name} get {PAUSE_ID} of {model.tenant}", seen)
        self.outcome = "get: read"
        decision = {"by": model.decision} if model.decision else None
        expected = f"{model.status.value} {decision!r}"
        if check and seen != expected:
            raise self._pause_broken(inst, what, seen, expected)

    # --- the cost ledger ------------------------------------------------------------

    def _costs(self, inst: Inst) -> CostLedgerRepository:
        costs = inst.stores.costs
        assert costs is not None
        return costs

    def _budget_broken(self, inst: Inst, what: str, answer: str, expected: str) -> Broken:
        return Broken(
            SPEND_WITHIN_BUDGET,
            f"{inst.name}'s {what} answered {answer} where the contract answers {expected}: "
            f"a reservation is granted exactly when the budget's total stays within "
            f"{BUDGET_MICROS} micros, and an entry counts once",
        )

    async def _reserve(
        self, inst: Inst, t: int, amount: int, check: bool, log: list[str] | None
    ) -> None:
        model = self.ledgers[t]
        spent = model.spent(ENTRY_MICROS)
        what = f"reservation of {amount} of {EXECUTION} in {model.tenant} (spent {spent})"
        try:
            granted = bool(
                await self._costs(inst).try_reserve(
                    BudgetScope.EXECUTION,
                    EXECUTION,
                    amount,
                    BUDGET_MICROS,
                    tenant_id=model.tenant,
                )
            )
        except Exception as exc:
            raise self._error(inst, what, exc) from exc
        self._said(
            log,
            f"{inst.name} reserve {amount} of {EXECUTION} in {model.tenant}, limit {BUDGET_MICROS}",
            "granted" if granted else "refused",
        )
        self.outcome = f"reserve: {'granted' if granted else 'refused'}"
        fits = spent + amount <= BUDGET_MICROS
        if check and granted != fits:
            raise self._budget_broken(
                inst, what, "granted" if granted else "refused", "granted" if fits else "refused"
            )
        if granted:
            model.reserved += amount

    async def _reserve_together(
        self, t: int, amount: int, check: bool, log: list[str] | None
    ) -> None:
        """Every instance reserves `amount` at once (each on its own store and connection,
        all sent before any answer): exactly as many are granted as fit, whatever order the
        store serialises them in."""
        model = self.ledgers[t]
        spent = model.spent(ENTRY_MICROS)
        answers = await asyncio.gather(
            *(
                self._costs(inst).try_reserve(
                    BudgetScope.EXECUTION,
                    EXECUTION,
                    amount,
                    BUDGET_MICROS,
                    tenant_id=model.tenant,
                )
                for inst in self.insts
            ),
            return_exceptions=True,
        )
        for inst, answer in zip(self.insts, answers, strict=True):
            if isinstance(answer, BaseException):
                raise self._error(
                    inst, f"reservation of {amount} at once with the others", answer
                ) from answer
        granted = sum(1 for answer in answers if answer is True)
        n = len(self.insts)
        self._said(
            log,
            f"{n} instances reserve {amount} of {EXECUTION} in {model.tenant} at once, "
            f"limit {BUDGET_MICROS}",
            f"{granted} granted",
        )
        self.outcome = f"reserve-together: {granted} granted"
        fits = max((k for k in range(n + 1) if spent + amount * k <= BUDGET_MICROS), default=0)
        if check and granted != fits:
            raise Broken(
                SPEND_WITHIN_BUDGET,
                f"{n} reservations of {amount} of {EXECUTION} in {model.tenant} made at once "
                f"(spent {spent}) were granted {granted} times where {fits} fit within "
                f"{BUDGET_MICROS} micros: a reservation is added atomically, never past the "
                "limit",
            )
        model.reserved += amount * granted

    async def _record_cost(self, inst: Inst, t: int, check: bool, log: list[str] | None) -> None:
        model = self.ledgers[t]
        what = f"record of {ENTRY_ID} in {model.tenant}"
        entry = CostEntry(
            entry_id=ENTRY_ID,
            tenant_id=model.tenant,
            execution_id=EXECUTION,
            application="explorer",
            tokens_in=10,
            tokens_out=5,
            cost_micros=ENTRY_MICROS,
            at=self.now,
        )
        try:
            recorded = bool(await self._costs(inst).record(entry))
        except Exception as exc:
            raise self._error(inst, what, exc) from exc
        self._said(
            log,
            f"{inst.name} record {ENTRY_ID} ({ENTRY_MICROS}) in {model.tenant}",
            "recorded" if recorded else "already recorded",
        )
        self.outcome = f"record-cost: {'recorded' if recorded else 'replayed'}"
        if check and recorded == model.entry:
            raise self._budget_broken(
                inst,
                what,
                str(recorded),
                str(not model.entry),
            )
        if recorded:
            model.entry = True

    async def _total(self, inst: Inst, t: int, check: bool, log: list[str] | None) -> None:
        model = self.ledgers[t]
        what = f"total of {EXECUTION} in {model.tenant}"
        try:
            found = await self._costs(inst).total(
                BudgetScope.EXECUTION, EXECUTION, tenant_id=model.tenant
            )
        except Exception as exc:
            raise self._error(inst, what, exc) from exc
        cost = int(found.cost_micros)
        self._said(log, f"{inst.name} total of {EXECUTION} in {model.tenant}", f"{cost} micros")
        self.outcome = "total: read"
        expected = model.spent(ENTRY_MICROS)
        if check and cost != expected:
            raise self._budget_broken(inst, what, f"{cost} micros", f"{expected} micros")
