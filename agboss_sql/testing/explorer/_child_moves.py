"""The sim's child-queue steps: claim, running, restart and finish of a parent's queued
children, each checked against the contract's model of the child."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agboss_sql.contracts.stores import ChildExecutionQueueRepository
from agboss_sql.contracts.types import ChildFinish, ChildStatus, FinishResult, QueuedChild
from agboss_sql.testing.explorer._model import Inst
from agboss_sql.testing.explorer._sim_base import SimBase
from agboss_sql.testing.explorer._world import (
    NO_STALE_WRITE,
    ONE_EFFECT_PER_KEY,
    ONE_LIVE_HOLDER,
    OTHER_TENANT_CHILD,
    PARENT_WOKEN_ONCE,
    STORE_ERROR,
    Broken,
)


class ChildMoves(SimBase):
    """The child-queue steps of the sim."""

    # --- the child queue ------------------------------------------------------------

    def _queue(self, inst: Inst) -> ChildExecutionQueueRepository:
        queue = inst.stores.queue
        assert queue is not None
        return queue

    def _child_seen(self, inst: Inst, found: Any, how: str, check: bool) -> int | None:
        """The model's child of a claimed child `found`, its attempt checked: an attempt
        is given to one claimer."""
        index = self.child_index(found.child_execution_id)
        if index is None:
            if check and found.child_execution_id == self.other_child_id():
                raise Broken(
                    ONE_LIVE_HOLDER,
                    f"{inst.name}'s {how} took {found.child_execution_id} at attempt "
                    f"{found.attempt}, the other tenant's child running since the set-up: a "
                    "claim takes queued children only",
                )
            if check:
                raise Broken(
                    ONE_LIVE_HOLDER,
                    f"{inst.name}'s {how} returned {found.child_execution_id!r}, a child this "
                    "schedule never queued",
                )
            return None
        inst.attempts.add((index, int(found.attempt)))
        return index

    async def _claim_child(self, inst: Inst, check: bool, log: list[str] | None) -> None:
        queue = self._queue(inst)
        try:
            found = await queue.claim(inst.name)
        except Exception as exc:
            raise self._error(inst, "claim a child", exc) from exc
        answer = (
            "none queued"
            if found is None
            else (f"{found.child_execution_id} attempt {found.attempt}")
        )
        self._said(log, f"{inst.name} claim a child", answer)
        self.outcome = "claim-child: none" if found is None else "claim-child: claimed"
        if found is None:
            if check and self.world.deep:
                self._check_none_left_behind(inst, "claim")
            return
        index = self._child_seen(inst, found, "claim", check)
        if index is None:
            return
        child = self.children[index]
        if check and self.world.deep:
            self._check_not_waiting(inst, index, "claim")
        if check and (child.status is not ChildStatus.QUEUED or found.attempt != child.attempt + 1):
            raise Broken(
                ONE_LIVE_HOLDER,
                f"{inst.name} claimed {found.child_execution_id} at attempt {found.attempt} "
                f"while it was {child.status.value} at attempt {child.attempt}: a queued child "
                "is claimed once, at its next attempt",
            )
        child.status = ChildStatus.RUNNING
        child.attempt = int(found.attempt)

    async def _claim_children(self, inst: Inst, n: int, check: bool, log: list[str] | None) -> None:
        """A batch claim of up to `n`: each child it answers was queued and is claimed at its
        next attempt, in claim order, and it leaves none queued while it had room."""
        queue = self._queue(inst)
        try:
            found = list(await queue.claim_many(inst.name, n))
        except Exception as exc:
            raise self._error(inst, f"claim up to {n} children", exc) from exc
        answer = ", ".join(f"{c.child_execution_id} attempt {c.attempt}" for c in found)
        self._said(log, f"{inst.name} claim up to {n} children", answer or "none queued")
        self.outcome = f"claim-children: {len(found)}"
        queued_before = [
            c.index for c in self.children if c.queued and c.status is ChildStatus.QUEUED
        ]
        got: list[int] = []
        for claimed in found:
            index = self._child_seen(inst, claimed, "batch claim", check)
            if index is None:
                continue
            child = self.children[index]
            if check and self.world.deep:
                self._check_not_waiting(inst, index, "batch claim")
            if check and (
                child.status is not ChildStatus.QUEUED
                or claimed.attempt != child.attempt + 1
                or index in got
            ):
                raise Broken(
                    ONE_LIVE_HOLDER,
                    f"{inst.name}'s batch claim took {claimed.child_execution_id} at attempt "
                    f"{claimed.attempt} while it was {child.status.value} at attempt "
                    f"{child.attempt}: a queued child is claimed once, at its next attempt",
                )
            got.append(index)
            child.status = ChildStatus.RUNNING
            child.attempt = int(claimed.attempt)
        if check and self.world.deep:
            # Deepest first, then oldest: which of a level's queued children comes first is
            # the store's; how many it takes is not.
            if len(got) < min(n, len(queued_before)):
                self._check_none_left_behind(inst, f"batch claim of up to {n}", got)
        elif check and (got != queued_before[:n]):
            raise Broken(
                ONE_LIVE_HOLDER,
                f"{inst.name}'s batch claim of up to {n} took children {got} while "
                f"{queued_before} were queued: it takes the first {n} queued, in claim order",
            )

    async def _running(self, inst: Inst, log: list[str] | None) -> None:
        queue = self._queue(inst)
        try:
            rows = await queue.running(10)
        except Exception as exc:
            raise self._error(inst, "list the running children", exc) from exc
        seen = []
        listed: set[tuple[int, int]] = set()
        for row in rows:
            index = self.child_index(row.child_execution_id)
            if index is not None:
                inst.attempts.add((index, int(row.attempt)))
                listed.add((index, int(row.attempt)))
                seen.append(f"{row.child_execution_id} attempt {row.attempt}")
        self.outcome = f"running: {len(seen)}"
        self._said(log, f"{inst.name} list the running children", ", ".join(seen) or "none")
        if self.world.deep:
            running = {
                (c.index, c.attempt) for c in self.children if c.status is ChildStatus.RUNNING
            }
            if listed != running:
                waiting = [
                    self.child_id(c.index)
                    for c in self.children
                    if c.status is ChildStatus.WAITING and any(i == c.index for i, _ in listed)
                ]
                raise Broken(
                    PARENT_WOKEN_ONCE if waiting else ONE_LIVE_HOLDER,
                    f"{inst.name}'s list of the running children answered "
                    f"{', '.join(seen) or 'none'} where the running ones are "
                    + (
                        ", ".join(f"{self.child_id(i)} attempt {a}" for i, a in sorted(running))
                        or "none"
                    )
                    + (
                        f": {', '.join(waiting)} waits for its children, and a waiting child "
                        "is never rescued"
                        if waiting
                        else ""
                    ),
                )

    async def _restart(
        self, inst: Inst, index: int, attempt: int, check: bool, log: list[str] | None
    ) -> None:
        queue = self._queue(inst)
        name = self.child_id(index)
        try:
            found = await queue.restart(name, attempt)
        except Exception as exc:
            raise self._error(inst, f"restart {name} at attempt {attempt}", exc) from exc
        self._said(
            log,
            f"{inst.name} restart {name} at attempt {attempt}",
            "refused" if found is None else f"attempt {found.attempt}",
        )
        self.outcome = "restart: refused" if found is None else "restart: restarted"
        if found is None:
            return
        child = self.children[index]
        if check and (
            child.status is not ChildStatus.RUNNING
            or child.attempt != attempt
            or found.attempt != attempt + 1
        ):
            raise Broken(
                NO_STALE_WRITE,
                f"{inst.name}'s restart of {name} at attempt {attempt} was accepted (attempt "
                f"{found.attempt}) while it was {child.status.value} at attempt "
                f"{child.attempt}: a restart compares the attempt",
            )
        self._child_seen(inst, found, "restart", check)
        child.attempt = int(found.attempt)

    async def _finish_child(
        self, inst: Inst, index: int, attempt: int, check: bool, log: list[str] | None
    ) -> None:
        queue = self._queue(inst)
        name = self.child_id(index)
        try:
            result = await queue.finish(name, {"by": inst.name}, attempt=attempt)
        except Exception as exc:
            raise self._error(inst, f"finish {name} at attempt {attempt}", exc) from exc
        finished, remaining = bool(result.finished), int(result.remaining)
        self._said(
            log,
            f"{inst.name} finish {name} at attempt {attempt}",
            f"finished, {remaining} left" if finished else f"refused, {remaining} left",
        )
        child = self.children[index]
        replay = child.status is ChildStatus.FINISHED and child.finished_attempt == attempt
        self.outcome = (
            "finish-child: refused"
            if not finished
            else "finish-child: replayed"
            if replay
            else f"finish-child: finished, {'none' if remaining == 0 else 'some'} left"
        )
        if not finished:
            return
        if replay:
            if check and remaining != child.remaining:
                raise Broken(
                    ONE_EFFECT_PER_KEY,
                    f"{inst.name}'s retry of the finish of {name} at attempt {attempt} "
                    f"answered {remaining} left where the finish answered {child.remaining}: "
                    "a retried finish answers what it answered",
                )
            return
        if check and (child.status is not ChildStatus.RUNNING or child.attempt != attempt):
            raise Broken(
                NO_STALE_WRITE,
                f"{inst.name}'s finish of {name} at attempt {attempt} was accepted while it "
                f"was {child.status.value} at attempt {child.attempt}: a finish compares the "
                "attempt",
            )
        child.status = ChildStatus.FINISHED
        child.finished_attempt = attempt
        child.remaining = remaining
        wake = PARENT_WOKEN_ONCE if self.world.deep else ONE_EFFECT_PER_KEY
        parent = child.parent
        left = sum(
            1
            for c in self.children
            if c.parent == parent and c.queued and c.status is not ChildStatus.FINISHED
        )
        if check and remaining != left:
            raise Broken(
                wake,
                f"{inst.name}'s finish of {name} at attempt {attempt} answered {remaining} "
                f"left where {left} of the parent's children are unfinished: exactly one "
                "finisher of the last child wakes the parent",
            )
        if remaining == 0:
            woken = self.woken_by.get(parent)
            if check and woken:
                raise Broken(
                    wake,
                    f"{inst.name}'s finish of {name} at attempt {attempt} answered none left "
                    f"after {woken} had: the parent is woken twice",
                )
            self.woken_by[parent] = f"{inst.name}'s finish of {name} at attempt {attempt}"
            inst.wakes.add(index)
            if parent >= 0 and self.children[parent].status is ChildStatus.WAITING:
                # The finish of the last child it waits for makes the parent claimable.
                self.children[parent].status = ChildStatus.QUEUED

    # --- the batch finish -----------------------------------------------------------

    def other_child_id(self) -> str:
        """The other tenant's child of the child-queue world."""
        return f"{OTHER_TENANT_CHILD}{self.suffix}"

    async def _other_tenant_child(self, queue: ChildExecutionQueueRepository) -> None:
        """The child-queue world's other tenant: its child, under a parent of the same id
        as this tenant's children's, queued and claimed by instance-1 at attempt 1."""
        other = self.other_child_id()
        await queue.enqueue(
            QueuedChild(
                tenant_id=f"{self.tenant}-b",
                root_execution_id=f"root{self.suffix}",
                parent_execution_id=f"parent{self.suffix}",
                child_execution_id=other,
                depth=1,
                payload={"child": "b"},
            )
        )
        found = await queue.claim(self.insts[0].name)
        if found is None or found.child_execution_id != other or found.attempt != 1:
            raise Broken(
                STORE_ERROR,
                f"the world's set-up claimed {found!r} where the other tenant's {other}, "
                "the only child queued, is claimed at attempt 1",
            )

    def batch_of(self, inst: Inst, first: int, attempt: int) -> list[tuple[int, int]]:
        """The entries of `inst`'s batch finish led by `first` at `attempt`: then every
        other child it saw at the latest attempt it saw, and in the child-queue world the
        other tenant's child (index -1) at its attempt 1. A child that waits on children
        still running is finished by no runtime at its own attempt: left out."""
        latest: dict[int, int] = {}
        for child, seen in inst.attempts:
            latest[child] = max(seen, latest.get(child, 0))
        entries = [(first, attempt)]
        for child in sorted(latest):
            if child != first and not self._waits_on_children(child, latest[child]):
                entries.append((child, latest[child]))
        if not self.world.deep:
            entries.insert(1, (-1, 1))
        return entries

    def _waits_on_children(self, child: int, attempt: int) -> bool:
        model = self.children[child]
        return (
            model.attempt == attempt
            and model.status is ChildStatus.RUNNING
            and any(
                c.parent == child and c.queued and c.status is not ChildStatus.FINISHED
                for c in self.children
            )
        )

    async def _finish_children(
        self, inst: Inst, first: int, attempt: int, check: bool, log: list[str] | None
    ) -> None:
        """A batch finish: each entry answers what `finish` one after another in the order
        given would (a live attempt finished with its parent's count at its turn, a
        superseded one refused with that count and changing nothing, a retry answered as
        its finish was), exactly one finish of a parent's last child answers none left,
        and the other tenant's child is counted under its own tenant's parent."""
        entries = self.batch_of(inst, first, attempt)
        names = [self.other_child_id() if c < 0 else self.child_id(c) for c, _ in entries]
        text = ", ".join(f"{n} at attempt {a}" for n, (_, a) in zip(names, entries, strict=True))
        batch = [
            ChildFinish(name, a, {"by": inst.name})
            for name, (_, a) in zip(names, entries, strict=True)
        ]
        try:
            results = list(await self._queue(inst).finish_many(batch))
        except Exception as exc:
            raise self._error(inst, f"finish {text} in one batch", exc) from exc
        answers = [
            f"finished, {r.remaining} left" if r.finished else f"refused, {r.remaining} left"
            for r in results
        ]
        self._said(log, f"{inst.name} finish {text} in one batch", "; ".join(answers))
        if check and len(results) != len(entries):
            raise Broken(
                ONE_EFFECT_PER_KEY,
                f"{inst.name}'s batch finish of {len(entries)} entries answered "
                f"{len(results)}: one answer per entry",
            )
        kinds: set[str] = set()
        for (child, at), name, result in zip(entries, names, results, strict=False):
            kinds.add(self._batch_entry(inst, child, at, name, result, check))
        order = ("finished", "none left", "replayed", "refused")
        self.outcome = "finish-children: " + ", ".join(k for k in order if k in kinds)

    def _batch_entry(
        self, inst: Inst, index: int, attempt: int, name: str, got: FinishResult, check: bool
    ) -> str:
        """One entry of a batch finish checked against the model at its turn, the model
        moved on; what kind of answer it was."""
        wake = PARENT_WOKEN_ONCE if self.world.deep else ONE_EFFECT_PER_KEY
        said = f"{inst.name}'s batch finish of {name} at attempt {attempt}"
        answered = f"answered {'finished' if got.finished else 'refused'}, {got.remaining} left"
        if index < 0:
            # The other tenant's parent has this child alone: none left once it finished.
            kind = "replayed" if self.other_finished else "finished"
            self.other_finished = True
            if check and (not got.finished or got.remaining != 0):
                raise Broken(
                    wake,
                    f"{said} {answered} where the contract answers finished, 0 left: it is "
                    "its own tenant's parent's only child, counted apart from the parent of "
                    "the same id in this tenant",
                )
            return kind
        child = self.children[index]
        left = self._unfinished_of_parent(child.parent)
        if child.status is ChildStatus.FINISHED and child.finished_attempt == attempt:
            if check and (not got.finished or got.remaining != child.remaining):
                raise Broken(
                    ONE_EFFECT_PER_KEY,
                    f"{said} {answered} where its finish answered {child.remaining} left: a "
                    "retried finish answers what it answered",
                )
            return "replayed"
        live = child.status is ChildStatus.RUNNING and child.attempt == attempt
        if not live:
            if check and got.finished:
                raise Broken(
                    NO_STALE_WRITE,
                    f"{said} was accepted while it was {child.status.value} at attempt "
                    f"{child.attempt}: a batch finish compares each entry's attempt",
                )
            if check and got.remaining != left:
                raise Broken(
                    wake,
                    f"{said} {answered} where {left} of the parent's children are "
                    "unfinished: a superseded entry changes nothing and answers the "
                    "parent's count at its turn",
                )
            return "refused"
        if check and (not got.finished or got.remaining != left - 1):
            raise Broken(
                wake,
                f"{said} {answered} where the contract answers finished, {left - 1} left "
                f"({name} running at attempt {attempt}, {left} of the parent's children "
                "unfinished at its turn): each entry is finished as one finish after another",
            )
        self._finished(inst, index, attempt, int(got.remaining), said, check)
        return "none left" if got.remaining == 0 else "finished"

    def _unfinished_of_parent(self, parent: int) -> int:
        return sum(
            1
            for c in self.children
            if c.parent == parent and c.queued and c.status is not ChildStatus.FINISHED
        )

    def _finished(
        self, inst: Inst, index: int, attempt: int, remaining: int, said: str, check: bool
    ) -> None:
        """The model's child finished at `attempt`, answered `remaining` left: the finish
        that answers none left owes the parent its wake, once."""
        child = self.children[index]
        child.status = ChildStatus.FINISHED
        child.finished_attempt = attempt
        child.remaining = remaining
        if remaining:
            return
        parent = child.parent
        woken = self.woken_by.get(parent)
        if check and woken:
            raise Broken(
                PARENT_WOKEN_ONCE if self.world.deep else ONE_EFFECT_PER_KEY,
                f"{said} answered none left after {woken} had: the parent is woken twice",
            )
        self.woken_by[parent] = said
        inst.wakes.add(index)
        if parent >= 0 and self.children[parent].status is ChildStatus.WAITING:
            # The finish of the last child it waits for makes the parent claimable.
            self.children[parent].status = ChildStatus.QUEUED

    # --- checks of the child-tree world --------------------------------------------

    def _check_not_waiting(self, inst: Inst, index: int, how: str) -> None:
        child = self.children[index]
        if child.status is ChildStatus.WAITING:
            unfinished = [
                self.child_id(c.index)
                for c in self.children
                if c.parent == index and c.status is not ChildStatus.FINISHED
            ]
            raise Broken(
                PARENT_WOKEN_ONCE,
                f"{inst.name}'s {how} took {self.child_id(index)} while it waits for "
                f"{', '.join(unfinished)}: a parent is woken only when the last child it "
                "waits for is done",
            )

    def _check_none_left_behind(self, inst: Inst, how: str, got: Sequence[int] = ()) -> None:
        queued = [
            c.index
            for c in self.children
            if c.queued and c.status is ChildStatus.QUEUED and c.index not in got
        ]
        if queued:
            names = ", ".join(self.child_id(i) for i in queued)
            woken = [i for i in queued if any(c.parent == i for c in self.children)]
            raise Broken(
                PARENT_WOKEN_ONCE if woken else ONE_LIVE_HOLDER,
                f"{inst.name}'s {how} left {names} queued"
                + (
                    ": a parent woken by its last child's finish is claimable again, never "
                    "left behind"
                    if woken
                    else ": a claim takes a queued child while there is one"
                ),
            )
