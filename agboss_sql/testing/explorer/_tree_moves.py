"""The sim's steps of a tree deeper than one level in the child queue: queue a child's own
children, wait for them, and wake the parent a finish owes its wake to (list the unwoken,
claim the wake, mark it done), each checked against the contract's model."""

from __future__ import annotations

from agboss_sql.contracts.types import ChildStatus, QueuedChild, WaitResult
from agboss_sql.testing.explorer._child_moves import ChildMoves
from agboss_sql.testing.explorer._model import Inst
from agboss_sql.testing.explorer._world import PARENT_WOKEN_ONCE, WAKE_CLAIM_MS, Broken


class TreeMoves(ChildMoves):
    """The child-tree world's steps of the sim."""

    def _queued(self, index: int) -> QueuedChild:
        child = self.children[index]
        parent = "parent" if child.parent < 0 else self.child_id(child.parent)
        return QueuedChild(
            tenant_id=self.tenant,
            root_execution_id=f"root{self.suffix}",
            parent_execution_id=f"{parent}{self.suffix}" if child.parent < 0 else parent,
            child_execution_id=self.child_id(index),
            depth=child.depth,
            payload={"child": index + 1},
        )

    async def _spawn(self, inst: Inst, parent: int, log: list[str] | None) -> None:
        """Queue `parent`'s own children in one batch (the world's set-up)."""
        mine = [c.index for c in self.children if c.parent == parent]
        try:
            queued = await self._queue(inst).enqueue_many([self._queued(i) for i in mine])
        except Exception as exc:
            raise self._error(inst, f"queue {self.child_id(parent)}'s children", exc) from exc
        self._said(log, f"{inst.name} queue {self.child_id(parent)}'s children", ", ".join(queued))
        for i in mine:
            self.children[i].queued = True
        self.outcome = f"spawn: {len(queued)}"

    def _unfinished_of(self, parent: int) -> int:
        return sum(
            1
            for c in self.children
            if c.parent == parent and c.queued and c.status is not ChildStatus.FINISHED
        )

    async def _wait(
        self, inst: Inst, index: int, attempt: int, check: bool, log: list[str] | None
    ) -> None:
        name = self.child_id(index)
        try:
            found = await self._queue(inst).wait_for_children(name, attempt=attempt)
        except Exception as exc:
            raise self._error(inst, f"wait for {name}'s children", exc) from exc
        answer = "none" if found is None else f"waiting={found.waiting}, {found.remaining} left"
        self._said(log, f"{inst.name} wait for {name}'s children at attempt {attempt}", answer)
        self.outcome = (
            "wait: none" if found is None else f"wait: {'waiting' if found.waiting else 'go on'}"
        )
        child = self.children[index]
        left = self._unfinished_of(index)
        expected: WaitResult | None
        retry = False
        if child.attempt != attempt:
            expected = None
        elif child.status in (ChildStatus.WAITING, ChildStatus.QUEUED) and (
            child.wait_attempt == attempt
        ):
            expected, retry = WaitResult(True, left), True
        elif child.status is ChildStatus.RUNNING:
            expected = WaitResult(left > 0, left)
        else:
            expected = None
        same = (
            (found is None) == (expected is None)
            if found is None or expected is None
            else found.waiting == expected.waiting
            and (retry or int(found.remaining) == expected.remaining)
        )
        if check and not same:
            raise Broken(
                PARENT_WOKEN_ONCE,
                f"{inst.name}'s wait for {name}'s children at attempt {attempt} answered "
                f"{answer} where the contract answers "
                + (
                    "none"
                    if expected is None
                    else f"waiting={expected.waiting}, {expected.remaining} left"
                )
                + f" ({name} {child.status.value} at attempt {child.attempt}, {left} of its "
                "children unfinished): a parent waits exactly while a child it waits for runs",
            )
        if found is not None and found.waiting and child.status is ChildStatus.RUNNING:
            child.status = ChildStatus.WAITING
            child.wait_attempt = attempt

    def _owes(self, index: int) -> bool:
        child = self.children[index]
        return child.status is ChildStatus.FINISHED and child.remaining == 0

    async def _unwoken(self, inst: Inst, check: bool, log: list[str] | None) -> None:
        try:
            rows = await self._queue(inst).unwoken(10)
        except Exception as exc:
            raise self._error(inst, "list the unwoken", exc) from exc
        listed = set()
        for row in rows:
            index = self.child_index(row.child_execution_id)
            if index is not None:
                listed.add(index)
                inst.wakes.add(index)
        text = ", ".join(self.child_id(i) for i in sorted(listed)) or "none"
        self._said(log, f"{inst.name} list the children owing a wake", text)
        self.outcome = f"unwoken: {len(listed)}"
        now = self.now
        expected = {
            c.index
            for c in self.children
            if self._owes(c.index) and not c.woken_by and (not c.wake_by or c.wake_until <= now)
        }
        if check and listed != expected:
            raise Broken(
                PARENT_WOKEN_ONCE,
                f"{inst.name}'s list of the children owing a wake answered {text} where the "
                f"contract answers "
                f"{', '.join(self.child_id(i) for i in sorted(expected)) or 'none'}: a wake "
                "is owed by the finish that saw none left, until it is done",
            )

    async def _claim_wake(self, inst: Inst, index: int, check: bool, log: list[str] | None) -> None:
        name = self.child_id(index)
        try:
            got = bool(await self._queue(inst).claim_wake(name, inst.name, WAKE_CLAIM_MS))
        except Exception as exc:
            raise self._error(inst, f"claim {name}'s wake", exc) from exc
        self._said(log, f"{inst.name} claim the wake {name} owes", str(got))
        self.outcome = f"claim-wake: {got}"
        child = self.children[index]
        now = self.now
        free = not child.wake_by or child.wake_until <= now
        expected = self._owes(index) and not child.woken_by and (free or child.wake_by == inst.name)
        if check and got != expected:
            raise Broken(
                PARENT_WOKEN_ONCE,
                f"{inst.name}'s claim of the wake {name} owes answered {got} where the "
                f"contract answers {expected}"
                + (f" (claimed by {child.wake_by})" if child.wake_by else "")
                + (f" (done by {child.woken_by})" if child.woken_by else "")
                + ": of concurrent claimers of a wake exactly one holds it",
            )
        if got:
            inst.wake_claims.add(index)
            if free:
                child.wake_by = inst.name
                child.wake_until = now + WAKE_CLAIM_MS

    async def _mark_woken(self, inst: Inst, index: int, check: bool, log: list[str] | None) -> None:
        name = self.child_id(index)
        try:
            done = bool(await self._queue(inst).mark_woken(name, inst.name))
        except Exception as exc:
            raise self._error(inst, f"mark {name}'s wake done", exc) from exc
        self._said(log, f"{inst.name} mark the wake {name} owes done", str(done))
        self.outcome = f"mark-woken: {done}"
        child = self.children[index]
        expected = self._owes(index) and child.wake_by == inst.name
        if check and done != expected:
            raise Broken(
                PARENT_WOKEN_ONCE,
                f"{inst.name}'s mark of the wake {name} owes answered {done} where the "
                f"contract answers {expected}"
                + (f" (claimed by {child.wake_by})" if child.wake_by else " (never claimed)")
                + (f" (done by {child.woken_by})" if child.woken_by else "")
                + ": a parent's wake is done once, by the claimer holding it",
            )
        if done and not child.woken_by:
            child.woken_by = inst.name

    def wake_deadlines(self) -> list[int]:
        """When the live claims of wakes not done end."""
        return [c.wake_until for c in self.children if c.wake_by and not c.woken_by]
