"""The simulated instances, the reference model of the contracts, and the invariants.

A `Sim` drives the stores of two or three instances over one store set, one
operation at a time: each operation is sent only once the store answered the
one before, so the order the explorer chose is the order the store sees. The
sim keeps, beside the stores, what the instances believe (the lease each holds
and until when it trusts it, the outbound call as it last saw it) and the
contract's model of each lease built from the store's answers (the epoch, the
holder, the expiry the contract gives, released / yielded / finished /
closed). After every checked step it compares the two and raises `Broken` on
the first invariant the store broke.

Time is the run's `VirtualClock`: the store decides by it (`StoreClock(run)`),
an instance's own wall clock is that time off by its skew, and every
instance's monotonic clock is the run's (an instance measures its trust window
on its monotonic clock, from the moment it sent the request).

The worlds, their steps and the invariants are in `_world`; what the instances believe and
the contract's model in `_model`; the steps themselves in `_lease_moves`, `_call_moves` and
`_child_moves`, over the state of `_sim_base`. This module re-exports the names it always
had.
"""

from __future__ import annotations

from typing import Any

from agboss_sql.contracts.types import QueuedChild
from agboss_sql.testing.explorer._model import (
    ChildModel,
    Inst,
    InstanceStores,
    LedgerModel,
    PauseModel,
    TreeModel,
)
from agboss_sql.testing.explorer._stale_moves import StaleMoves
from agboss_sql.testing.explorer._store_moves import StoreMoves
from agboss_sql.testing.explorer._tree_moves import TreeMoves
from agboss_sql.testing.explorer._world import (
    _FAILED,
    _PENDING,
    ABSENT,
    ACQUIRE,
    ATTEMPTS,
    BUSINESS_KEY,
    BUSINESS_KEY_WORLD,
    CANCEL,
    CHILD_QUEUE_WORLD,
    CHILDREN,
    CLAIM,
    CLAIM_CHILD,
    CLAIM_CHILDREN,
    CLAIM_WAKE,
    EFFECT,
    END,
    FENCED_EFFECT_WORLD,
    FINISH,
    FINISH_CHILD,
    FINISH_CHILDREN,
    GET,
    HANDOVER_WORLD,
    INVARIANTS,
    LEASE_MS,
    LEASE_STATE_OF,
    LEASE_WORLD,
    MARK_WOKEN,
    NO_STALE_WRITE,
    NO_TAKEOVER_OF_FINISHED_WORK,
    ONE_EFFECT_PER_KEY,
    ONE_LIVE_HOLDER,
    ONE_SEND_PER_BUSINESS_KEY,
    READ,
    RECLAIM,
    RECONCILE,
    RECORD,
    RECORD_COST,
    RELEASE,
    RENEW,
    RESERVATIONS,
    RESERVE,
    RESERVE_TOGETHER,
    RESOLVE,
    RESTART,
    RUNNING,
    SEND,
    SEND_REFUSED,
    SKEWS,
    STALE,
    START_MS,
    STORE_ERROR,
    TAKE,
    TAKEOVER_WORLD,
    TIME,
    TOTAL,
    TREE,
    UNWOKEN,
    WAIT_1MS,
    WAIT_CHILDREN,
    WAIT_EXPIRY,
    WAIT_HALF,
    WORLDS,
    YIELD,
    Action,
    Broken,
    World,
)


def _rel(time_ms: int | None, now: int) -> int | None:
    """A deadline relative to now: any time already past is alike (-1)."""
    if time_ms is None:
        return None
    return time_ms - now if time_ms >= now else -1


SPAWN = "spawn"
"""The child-tree world's set-up step: a child queues its own children."""


class Sim(StaleMoves, TreeMoves, StoreMoves):
    """The instances and the model of one run, over the stores of one skew."""

    # --- a schedule -----------------------------------------------------------------

    def start(self, tenant: str, prefix: str) -> None:
        """Begin a schedule: time at the start, nobody holding anything, nothing sent."""
        self.clock.set(START_MS)
        if tenant != self.tenant:
            self._keys.clear()
            self._owners.clear()
            self._short.clear()
            self._identities.clear()
        self.tenant = tenant
        self.prefix = prefix
        self.trees = [TreeModel(t) for t in range(self.world.trees)]
        self.insts = [
            Inst(i, stores, self.trees[i % self.world.trees])
            for i, stores in enumerate(self.stores)
        ]
        self.effect_by = None
        self.effect_value = None
        self.rows = {}
        self.charges = []
        if self.world.deep:
            self.children = [ChildModel(c, parent, depth) for c, (parent, depth) in enumerate(TREE)]
            for child in self.children:
                child.queued = child.parent < 0
        else:
            self.children = [ChildModel(c) for c in range(CHILDREN if self.world.queue else 0)]
        self.woken_by = {}
        self.other_finished = False
        self.suffix = "" if tenant == "tenant-1" else f"-{tenant}"
        store = self.world.store
        tenants = (tenant, f"{tenant}-b")
        self.pauses = [PauseModel(t) for t in tenants] if store == "paused_execution" else []
        self.ledgers = [LedgerModel(t) for t in tenants] if store == "cost_ledger" else []

    async def setup(self) -> None:
        """What a schedule starts from: the world's set-up steps made and checked (`Broken`
        when a store breaks an invariant there, or answers otherwise than the contract
        does); the child-queue world's parent has its children queued."""
        if self.world.setup:
            log: list[str] = []
            self.setup_log = log
            for action in self.world.setup:
                try:
                    await self.run(action, True, log)
                except Broken as broken:
                    raise Broken(
                        broken.invariant,
                        f"in the world's set-up ({'; '.join(log)}): {broken.message}",
                    ) from None
            first = self.insts[0]
            if first.claimed is None or not all(i.holding for i in self.insts[:2]):
                raise Broken(
                    STORE_ERROR,
                    f"the world's set-up did not reach its start ({'; '.join(log)}): the "
                    "contract grants each of these steps",
                )
        if self.pauses:
            await self._save_pauses()
        if not self.world.queue:
            return
        queue = self.insts[0].stores.queue
        assert queue is not None
        if self.world.batch_finish and not self.world.deep:
            await self._other_tenant_child(queue)
        for child in self.children:
            if not child.queued:
                continue
            await queue.enqueue(
                QueuedChild(
                    tenant_id=self.tenant,
                    root_execution_id=f"root{self.suffix}",
                    parent_execution_id=f"parent{self.suffix}",
                    child_execution_id=self.child_id(child.index),
                    depth=1,
                    payload={"child": child.index + 1},
                )
            )
        if self.world.deep:
            # child-1 is claimed, queues its own children and waits for them.
            log = []
            self.setup_log = log
            for action in ((0, CLAIM_CHILD, 0), (0, SPAWN, 0), (0, WAIT_CHILDREN, 1)):
                try:
                    await self.run(action, True, log)
                except Broken as broken:
                    raise Broken(
                        broken.invariant,
                        f"in the world's set-up ({'; '.join(log)}): {broken.message}",
                    ) from None
            if self.children[0].status.value != "waiting":
                raise Broken(
                    STORE_ERROR,
                    f"the world's set-up did not reach its start ({'; '.join(log)}): the "
                    "contract grants each of these steps",
                )

    # --- the state ------------------------------------------------------------------

    def key(self) -> tuple[Any, ...]:
        """The state: the contract's model built from the store's answers, and what each
        instance believes, with times relative to now."""
        now = self.now
        trees = tuple(
            (
                t.epoch,
                t.holder,
                _rel(t.expires_at, now) if t.epoch else None,
                t.released,
                t.yielded,
                t.finished,
                t.closed,
            )
            for t in self.trees
        )
        short = self.short
        insts = tuple(
            (
                inst.lease.lease_epoch if inst.lease and (inst.holding or inst.yielded) else 0,
                inst.holding,
                inst.yielded,
                _rel(inst.expiry, now) if inst.holding else None,
                inst.effect_done,
                (inst.view[0], inst.view[1], short(inst.view[2]))
                if isinstance(inst.view, tuple)
                else inst.view,
                (inst.claimed.attempt, short(inst.claimed.attempt_owner)) if inst.claimed else None,
                inst.sent,
                inst.reconciled,
                inst.done,
                tuple(sorted(inst.contexts)),
                tuple(sorted(inst.attempts)),
            )
            for inst in self.insts
        )
        rows = tuple(sorted((s, a, short(o)) for s, a, o in self.rows.values()))
        charges = tuple((a, short(o)) for _, a, o, _ in self.charges)
        children = tuple(child.key() for child in self.children)
        extra = (
            tuple(sorted(self.woken_by)),
            tuple(p.key() for p in self.pauses),
            tuple(g.key() for g in self.ledgers),
            tuple((tuple(sorted(i.wakes)), tuple(sorted(i.wake_claims))) for i in self.insts),
            tuple(tuple(sorted(t.decided)) for t in self.trees),
        )
        return (trees, insts, self.effect_by, rows, charges, children, extra)

    def deadlines(self) -> list[int]:
        """The instants a lease ends: the contract's expiries and the ones instances
        were answered."""
        found = [t.expires_at for t in self.trees if t.open()]
        found.extend(i.expiry for i in self.insts if i.holding and i.expiry is not None)
        if self.world.deep:
            found.extend(self.wake_deadlines())
        return found

    # --- what may happen next -------------------------------------------------------

    def enabled(self) -> list[Action]:
        """Every step the scheduler may choose now."""
        world = self.world
        ops = world.lease_ops
        now = self.now
        out: list[Action] = []
        for inst in self.insts:
            i = inst.index
            if world.store:
                self._store_steps(inst, out)
                continue
            if world.deep:
                self._tree_steps(inst, out)
                continue
            if world.queue:
                # The first instance claims one child at a time, the others in batches of
                # up to every child (one claim move each: the search stays as large).
                if i == 0:
                    out.append((i, CLAIM_CHILD, 0))
                else:
                    out.append((i, CLAIM_CHILDREN, CHILDREN))
                out.append((i, RUNNING, 0))
                finish = FINISH_CHILDREN if world.batch_finish and i else FINISH_CHILD
                for child, attempt in sorted(inst.attempts):
                    out.append((i, RESTART, child * ATTEMPTS + attempt))
                    out.append((i, finish, child * ATTEMPTS + attempt))
                continue
            if ACQUIRE in ops and inst.trust_left(now) == 0:
                out.append((i, ACQUIRE, 0))
            if inst.holding:
                if RENEW in ops:
                    out.append((i, RENEW, 0))
                if YIELD in ops:
                    out.append((i, YIELD, 0))
                if RELEASE in ops:
                    out.append((i, RELEASE, 0))
                if FINISH in ops:
                    out.append((i, FINISH, 0))
                if world.effect and not inst.effect_done:
                    out.append((i, EFFECT, 0))
            elif inst.yielded:
                if RECLAIM in ops:
                    out.append((i, RECLAIM, 0))
                if RELEASE in ops:
                    out.append((i, RELEASE, 0))
            if LEASE_STATE_OF in ops and self.has_state and world.tokens:
                # Every token granted, and the next one (never granted yet).
                for token in range(1, inst.tree.epoch + 2):
                    out.append((i, LEASE_STATE_OF, token))
            elif LEASE_STATE_OF in ops and self.has_state and inst.tree.epoch:
                out.append((i, LEASE_STATE_OF, 0))
            if world.call and not inst.done:
                self._protocol(inst, now, out)
            self._stale_moves(inst, out)
        deadlines = self.deadlines()
        if any(d > now for d in deadlines):
            out.append((TIME, WAIT_EXPIRY, 0))
            out.append((TIME, WAIT_HALF, 0))
        if now in deadlines:
            out.append((TIME, WAIT_1MS, 0))
        return out

    def _store_steps(self, inst: Inst, out: list[Action]) -> None:
        """The steps of a world of pauses or of the cost ledger, on either tenant."""
        i = inst.index
        for t in range(2):
            if self.pauses:
                out.extend(((i, RESOLVE, t), (i, TAKE, t), (i, CANCEL, t), (i, GET, t)))
            else:
                out.extend((i, RESERVE, t * ATTEMPTS + amount) for amount in RESERVATIONS)
                out.extend(((i, RECORD_COST, t), (i, TOTAL, t)))
                if i == 0:
                    # Made by every instance at once; scheduled as the first one's step.
                    out.append((i, RESERVE_TOGETHER, t * ATTEMPTS + RESERVATIONS[0]))

    def _tree_steps(self, inst: Inst, out: list[Action]) -> None:
        """The child-tree world's steps of `inst`: claim, list the running children, restart,
        finish and wait with any attempt it saw, and the wakes it saw owed or claimed."""
        i = inst.index
        out.append((i, CLAIM_CHILD, 0) if i == 0 else (i, CLAIM_CHILDREN, CHILDREN))
        out.append((i, RUNNING, 0))
        finish = FINISH_CHILDREN if self.world.batch_finish and i else FINISH_CHILD
        for child, attempt in sorted(inst.attempts):
            param = child * ATTEMPTS + attempt
            out.append((i, RESTART, param))
            # A runtime finishes a child with children only once none of them is left to
            # wait for: at its own attempt, while one runs, it waits instead.
            if not self._waits_on_children(child, attempt):
                out.append((i, finish, param))
            if any(c.parent == child for c in self.children):
                out.append((i, WAIT_CHILDREN, param))
        out.append((i, UNWOKEN, 0))
        for child in sorted(inst.wakes):
            out.append((i, CLAIM_WAKE, child))
        for child in sorted(inst.wake_claims):
            out.append((i, MARK_WOKEN, child))

    def _protocol(self, inst: Inst, now: int, out: list[Action]) -> None:
        """The outbound-call protocol's next steps for `inst`: read the intent, record it,
        reconcile another owner's pending attempt, claim the next attempt, send, end it."""
        i = inst.index
        view = inst.view
        if view is None or inst.reconciled == "live":
            # Read when it has not seen the row (at first, or after a compare-and-set it
            # lost), or while it waits for another owner's live lease.
            out.append((i, READ, 0))
        if not inst.holding or inst.lease is None:
            return
        mine = self.owner_of(inst.tree, inst.lease.lease_epoch)
        ends = False
        if view is None or view == ABSENT:
            out.append((i, RECORD, 0))
        elif isinstance(view, tuple):
            status, attempt, owner = view
            if status == _PENDING:
                if attempt == 0:
                    # Attempt 0 is the recorded intent, never sent: a compare-and-set claim
                    # of it is safe whoever recorded it.
                    out.append((i, CLAIM, 0))
                elif owner != mine:
                    if inst.reconciled in (None, "live"):
                        out.append((i, RECONCILE, 0))
                    elif inst.reconciled == "not-landed":
                        out.append((i, CLAIM, 0))
                    elif inst.reconciled == "landed":
                        ends = True
            elif status == _FAILED:
                out.append((i, CLAIM, 0))
        claimed = inst.claimed
        if claimed is not None:
            if inst.sent is None:
                # A send only under the lease it was claimed by, and only while trusted.
                if claimed.attempt_owner == mine and inst.trust_left(now) > 0:
                    out.append((i, SEND, 0))
                    out.append((i, SEND_REFUSED, 0))
            else:
                ends = True
        if ends:
            out.append((i, END, 0))

    # --- one step -------------------------------------------------------------------

    async def run(self, action: Action, check: bool, log: list[str] | None) -> None:
        """Make one step; with `check`, raise `Broken` on the first invariant it broke.
        With `log`, append the step and the store's answer, and keep the answer's summary
        in `last`."""
        index, op, param = action
        self.outcome = op
        if index == TIME:
            self._time(op, log)
        elif self.world.tokens:
            await self._closing_step(self.insts[index], op, param, check, log)
        else:
            await self._step(self.insts[index], op, param, check, log)
        if check:
            seen = self.outcomes
            seen[self.outcome] = seen.get(self.outcome, 0) + 1

    async def _step(
        self, inst: Inst, op: str, param: int, check: bool, log: list[str] | None
    ) -> None:
        if op.startswith(STALE):
            await self._stale_step(inst, op[len(STALE) :], inst.contexts[param], check, log)
        elif op == CLAIM_CHILD:
            await self._claim_child(inst, check, log)
        elif op == CLAIM_CHILDREN:
            await self._claim_children(inst, param, check, log)
        elif op == WAIT_CHILDREN:
            await self._wait(inst, *divmod(param, ATTEMPTS), check, log)
        elif op == SPAWN:
            await self._spawn(inst, param, log)
        elif op == UNWOKEN:
            await self._unwoken(inst, check, log)
        elif op == CLAIM_WAKE:
            await self._claim_wake(inst, param, check, log)
        elif op == MARK_WOKEN:
            await self._mark_woken(inst, param, check, log)
        elif op == RESOLVE:
            await self._resolve(inst, param, check, log)
        elif op == TAKE:
            await self._take(inst, param, check, log)
        elif op == CANCEL:
            await self._cancel(inst, param, check, log)
        elif op == GET:
            await self._get_pause(inst, param, check, log)
        elif op == RESERVE:
            await self._reserve(inst, *divmod(param, ATTEMPTS), check, log)
        elif op == RESERVE_TOGETHER:
            await self._reserve_together(*divmod(param, ATTEMPTS), check, log)
        elif op == RECORD_COST:
            await self._record_cost(inst, param, check, log)
        elif op == TOTAL:
            await self._total(inst, param, check, log)
        elif op == RUNNING:
            await self._running(inst, log)
        elif op == RESTART:
            await self._restart(inst, *divmod(param, ATTEMPTS), check, log)
        elif op == FINISH_CHILD:
            await self._finish_child(inst, *divmod(param, ATTEMPTS), check, log)
        elif op == FINISH_CHILDREN:
            await self._finish_children(inst, *divmod(param, ATTEMPTS), check, log)
        elif op == ACQUIRE:
            await self._acquire(inst, check, log)
        elif op == RENEW:
            await self._renew(inst, check, log)
        elif op == YIELD:
            await self._yield(inst, check, log)
        elif op == RECLAIM:
            await self._reclaim(inst, check, log)
        elif op in (RELEASE, FINISH):
            await self._let_go(inst, op == FINISH, check, log)
        elif op == LEASE_STATE_OF:
            tree = inst.tree
            await self._lease_state_of(inst, tree, param or tree.epoch, check, log)
        elif op == EFFECT:
            await self._effect(inst, check, log)
        elif op == READ:
            await self._read(inst, log)
        elif op == RECORD:
            await self._record(inst, check, log)
        elif op == RECONCILE:
            await self._reconcile(inst, check, log)
        elif op == CLAIM:
            await self._claim(inst, check, log)
        elif op in (SEND, SEND_REFUSED):
            self._send(inst, op == SEND, check, log)
        elif op == END:
            await self._end(inst, check, log)
        else:
            raise ValueError(f"unknown operation {op!r}")

    # --- time -----------------------------------------------------------------------

    def _time(self, op: str, log: list[str] | None) -> None:
        now = self.now
        why = ""
        if op == WAIT_EXPIRY:
            target = min(d for d in self.deadlines() if d > now)
            ends = [
                f"{t.name} at {t.epoch}" for t in self.trees if t.open() and t.expires_at == target
            ]
            ends += [
                f"{i.name}'s answered lease"
                for i in self.insts
                if i.holding and i.expiry == target and not ends
            ]
            ends += [
                f"the claim of the wake {self.child_id(c.index)} owes"
                for c in self.children
                if c.wake_by and not c.woken_by and c.wake_until == target and not ends
            ]
            why = f" (to the expiry of {', '.join(ends)})"
        elif op == WAIT_1MS:
            target = now + 1
        else:
            target = now + LEASE_MS // 2
        self.clock.set(target)
        self.outcome = f"time: {op}"
        if log is not None:
            self.last = f"+{target - now} ms"
            log.append(f"time +{target - now} ms{why}, now start +{target - START_MS} ms")


__all__ = [
    "ABSENT",
    "ACQUIRE",
    "BUSINESS_KEY",
    "BUSINESS_KEY_WORLD",
    "CHILD_QUEUE_WORLD",
    "TAKEOVER_WORLD",
    "CLAIM_CHILD",
    "CLAIM_CHILDREN",
    "FINISH_CHILD",
    "FINISH_CHILDREN",
    "RESTART",
    "RUNNING",
    "CLAIM",
    "EFFECT",
    "END",
    "FENCED_EFFECT_WORLD",
    "FINISH",
    "HANDOVER_WORLD",
    "INVARIANTS",
    "LEASE_MS",
    "LEASE_STATE_OF",
    "LEASE_WORLD",
    "NO_STALE_WRITE",
    "NO_TAKEOVER_OF_FINISHED_WORK",
    "ONE_EFFECT_PER_KEY",
    "ONE_LIVE_HOLDER",
    "ONE_SEND_PER_BUSINESS_KEY",
    "READ",
    "RECLAIM",
    "RECONCILE",
    "RECORD",
    "RELEASE",
    "RENEW",
    "SEND",
    "SEND_REFUSED",
    "SKEWS",
    "START_MS",
    "STORE_ERROR",
    "TIME",
    "WAIT_1MS",
    "WAIT_EXPIRY",
    "WAIT_HALF",
    "WORLDS",
    "YIELD",
    "Action",
    "Broken",
    "InstanceStores",
    "Sim",
    "World",
]
