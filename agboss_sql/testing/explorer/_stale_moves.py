"""The explorer's out-of-turn moves: what an instance does with a context it should no longer
trust (a zombie, a buggy runtime, a replayed message), and the lease-closing world's steps,
checked against the epochs `lease_state_of` answered over."""

from __future__ import annotations

from agboss_sql.contracts.types import ExecutionLease, LeaseState
from agboss_sql.testing.explorer._call_moves import CallMoves
from agboss_sql.testing.explorer._lease_moves import LeaseMoves
from agboss_sql.testing.explorer._model import Inst
from agboss_sql.testing.explorer._world import (
    _COMPLETED,
    _PENDING,
    CLAIM,
    CLOSED_EPOCH_NEVER_MOVES,
    EFFECT,
    END,
    FINISH,
    LEASE_STATE_OF,
    RECLAIM,
    RECORD,
    RELEASE,
    RENEW,
    STALE,
    STALE_LEASE_MOVES,
    YIELD,
    Action,
    Broken,
)

_MOVED = frozenset(
    {"renew: renewed", "yield: yielded", "reclaim: granted", "release: done", "finish: done"}
)
"""The answers of a lease move the store accepted."""

_OVER = frozenset({LeaseState.SUPERSEDED, LeaseState.RELEASED, LeaseState.FINISHED})


class StaleMoves(LeaseMoves, CallMoves):
    """The stale moves and the closing world's steps, over the lease and call moves."""

    async def _step(
        self, inst: Inst, op: str, param: int, check: bool, log: list[str] | None
    ) -> None:
        raise NotImplementedError  # the sim's own dispatch of one step

    def _stale_moves(self, inst: Inst, out: list[Action]) -> None:
        """What `inst` may do out of turn, as a zombie, a buggy runtime or a replayed
        message would: with every context it ever held, every lease move of the world, the
        fenced effect, and the call's record, claim and end, but those it makes in good
        faith (with the lease it holds, every move but reclaim; with the lease it yielded,
        reclaim and release)."""
        i = inst.index
        world = self.world
        view = inst.view
        acting = inst.acting()
        for epoch, lease in inst.contexts.items():
            moves: list[str] = [m for m in STALE_LEASE_MOVES if m in world.lease_ops]
            if world.effect:
                moves.append(EFFECT)
            if world.call:
                moves.append(RECORD)
                if isinstance(view, tuple) and view[0] != _COMPLETED:
                    moves.append(CLAIM)
                    if view[0] == _PENDING and view[1] > 0:
                        moves.append(END)
            if lease is acting:
                if inst.holding:
                    good = {RENEW, YIELD, RELEASE, FINISH, RECORD, CLAIM, END}
                    if not inst.effect_done:
                        good.add(EFFECT)
                else:
                    good = {RECLAIM, RELEASE}
                moves = [m for m in moves if m not in good]
            out.extend((i, STALE + move, epoch) for move in moves)

    async def _closing_step(
        self, inst: Inst, op: str, param: int, check: bool, log: list[str] | None
    ) -> None:
        """A step of the lease-closing world: checked against the epochs `lease_state_of`
        answered over, which never move again."""
        tree = inst.tree
        if op == LEASE_STATE_OF:
            expected = tree.state_at(param, self.now)
            state = await self._lease_state_of(inst, tree, param, check, log)
            decided = tree.decided.get(param)
            if check and state is not expected:
                raise Broken(
                    CLOSED_EPOCH_NEVER_MOVES,
                    f"{inst.name}'s lease_state_of {tree.name} at {param} answered "
                    f"{state.value} where the contract answers {expected.value}"
                    + (
                        f", after {decided[1]} was answered {decided[0].value} there"
                        if decided
                        else ""
                    )
                    + ": an epoch answered over never moves again",
                )
            if state in _OVER and decided is None:
                tree.decided[param] = (state, inst.name)
            return
        epoch = param if op.startswith(STALE) else (inst.lease.lease_epoch if inst.lease else 0)
        await self._step(inst, op, param, check, log)
        moved = self.outcome[len(STALE) :] if self.outcome.startswith(STALE) else self.outcome
        decided = tree.decided.get(epoch)
        if check and moved in _MOVED and decided is not None:
            raise Broken(
                CLOSED_EPOCH_NEVER_MOVES,
                f"{inst.name}'s {moved.split(':')[0]} of epoch {epoch} of {tree.name} was "
                f"accepted after {decided[1]} was answered {decided[0].value} there by "
                "lease_state_of: a closed epoch never moves again",
            )

    async def _stale_step(
        self,
        inst: Inst,
        op: str,
        lease: ExecutionLease,
        check: bool,
        log: list[str] | None,
    ) -> None:
        """`op` made with `lease`, a context `inst` should no longer trust. The store's
        answer is checked against the model as for any move; a refusal changes nothing of
        what the instance believes (it acted as a zombie would, and goes on)."""
        if op == RENEW:
            await self._renew(inst, check, log, lease)
        elif op == YIELD:
            await self._yield(inst, check, log, lease)
        elif op == RECLAIM:
            await self._reclaim(inst, check, log, lease)
        elif op in (RELEASE, FINISH):
            await self._let_go(inst, op == FINISH, check, log, lease)
        elif op == EFFECT:
            await self._effect(inst, check, log, lease)
        elif op == RECORD:
            await self._record(inst, check, log, lease)
        elif op == CLAIM:
            await self._claim(inst, check, log, lease)
        elif op == END:
            await self._end(inst, check, log, lease)
        else:
            raise ValueError(f"unknown stale operation {op!r}")
        self.outcome = f"stale {self.outcome}"
