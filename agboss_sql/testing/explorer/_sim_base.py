"""The sim's state and the helpers every kind of step shares: the keys and owners of
the world's call, how steps are logged, and what an instance does when it lost its lease."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agboss_sql.contracts.clocks import VirtualClock
from agboss_sql.contracts.keys import (
    attempt_owner_of,
    business_identity_of,
    fenced_effect_key_of,
    fenced_key_identity_of,
    parse_attempt_owner,
)
from agboss_sql.contracts.stores import ExecutionLeaseRepository
from agboss_sql.contracts.types import (
    ExecutionContext,
    ExecutionLease,
    FencedEffectKey,
    LeaseState,
    StepRef,
)
from agboss_sql.testing._case import BusinessRows
from agboss_sql.testing.explorer._model import (
    ChildModel,
    Inst,
    InstanceStores,
    LedgerModel,
    PauseModel,
    TreeModel,
)
from agboss_sql.testing.explorer._world import (
    BUSINESS_KEY,
    EFFECT_NAME,
    FINGERPRINT,
    ONE_LIVE_HOLDER,
    STEP_KEY,
    STEP_NAME,
    STORE_ERROR,
    Broken,
    View,
    World,
)


def article(reason: str) -> str:
    return f"an {reason}" if reason[0] in "aeiou" else f"a {reason}"


class SimBase:
    """The instances and the model of one run: the state the steps of each kind share."""

    def __init__(
        self,
        world: World,
        stores: Sequence[InstanceStores],
        clock: VirtualClock,
        business_rows: BusinessRows | None,
        *,
        lease_state_of: bool,
    ) -> None:
        self.world = world
        self.stores = list(stores)
        self.clock = clock
        self.business_rows = business_rows
        self.has_state = lease_state_of and any(s.calls is not None for s in stores)
        self.tenant = "tenant-1"
        self.prefix = ""
        self.trees: list[TreeModel] = []
        self.insts: list[Inst] = []
        self.effect_by: str | None = None
        self.effect_value: Any = None
        self.rows: dict[str, View] = {}
        self.charges: list[tuple[str, int, str, str]] = []
        self.children: list[ChildModel] = []
        self.woken_by: dict[int, str] = {}
        self.other_finished = False
        """The child-queue world's child of the other tenant was finished (by a batch). Not
        part of the state: its entry is answered alike either way (finished, none left)."""
        """By parent (-1: the root): which finish answered that no sibling is left (the
        last child's wake)."""
        self.pauses: list[PauseModel] = []
        self.ledgers: list[LedgerModel] = []
        self.setup_log: list[str] = []
        """The world's set-up steps, each with the store's answer, as last made."""
        self.suffix = ""
        self.last = ""
        self.outcome = ""
        self.outcomes: dict[str, int] = {}
        """How often each kind of answer was seen in checked steps (what the search
        reached)."""
        self._keys: dict[tuple[str, int, str], FencedEffectKey] = {}
        self._owners: dict[tuple[str, int, int], str] = {}
        self._short: dict[str, tuple[str, int] | str] = {}
        self._identities: dict[str, str] = {}

    def child_id(self, index: int) -> str:
        return f"child-{index + 1}{self.suffix}"

    def child_index(self, child_execution_id: str) -> int | None:
        for child in self.children:
            if self.child_id(child.index) == child_execution_id:
                return child.index
        return None

    @property
    def now(self) -> int:
        """The run's time: what the store decides by."""
        return self.clock.now()

    # --- keys -----------------------------------------------------------------------

    def key_of(self, tree: TreeModel, epoch: int, holder: str = "instance-1") -> FencedEffectKey:
        """The step's key under `tree`'s lease at `epoch`, granted to `holder` (the holder
        is no part of the key's identity, nor of its attempt owner)."""
        cache = (tree.name, epoch, holder)
        key = self._keys.get(cache)
        if key is None:
            lease = ExecutionLease(self.tenant, tree.name, holder, epoch, 0)
            ctx = ExecutionContext(
                tenant_id=self.tenant,
                root_execution_id=tree.name,
                execution_id=tree.name,
                lease=lease,
                step=StepRef(tree.name, STEP_KEY, STEP_NAME),
            )
            business = self.world.business_key
            key = fenced_effect_key_of(
                ctx,
                EFFECT_NAME,
                business_key=BUSINESS_KEY if business else None,
                fingerprint=FINGERPRINT if business else None,
            )
            self._keys[cache] = key
        return key

    def owner_of(self, tree: TreeModel, epoch: int) -> str:
        """The attempt owner text of `tree`'s lease at `epoch`."""
        cache = (tree.name, epoch, 1)
        owner = self._owners.get(cache)
        if owner is None:
            owner = self._owners[cache] = attempt_owner_of(self.key_of(tree, epoch))
        return owner

    def identity_of(self, tree: TreeModel) -> str:
        """What the other system charges once: the business key, else the call's key."""
        found = self._identities.get(tree.name)
        if found is None:
            key = self.key_of(tree, 0)
            found = business_identity_of(key) or fenced_key_identity_of(key)
            self._identities[tree.name] = found
        return found

    def short(self, owner: str) -> tuple[str, int] | str:
        """An owner text as (tree, token), the same whatever the tenant."""
        found = self._short.get(owner)
        if found is None:
            parsed = parse_attempt_owner(owner)
            found = owner if parsed is None else (parsed.execution_id, parsed.token)
            self._short[owner] = found
        return found

    def owner_text(self, owner: str) -> str:
        """An owner text as printed: `tree-1 at 2`."""
        short = self.short(owner)
        if isinstance(short, str):
            return f"owner {short!r}"
        return f"{short[0]} at {short[1]}"

    def view_text(self, view: View | str | None) -> str:
        """A call as an instance saw it, as printed."""
        if view is None:
            return "unread"
        if isinstance(view, str):
            return view
        status, attempt, owner = view
        return f"{status} attempt {attempt} of {self.owner_text(owner)}"

    def call_text(self) -> str:
        """The world's outbound call, as printed."""
        return (
            f"{EFFECT_NAME} (business key {BUSINESS_KEY})"
            if self.world.business_key
            else f"{EFFECT_NAME} of {self.trees[0].name} {STEP_KEY}"
        )

    @staticmethod
    def _with(lease: ExecutionLease, stale: bool) -> str:
        """How a step made out of turn names the context it was made with."""
        return f" (out of turn, with its context at {lease.lease_epoch})" if stale else ""

    def _said(self, log: list[str] | None, text: str, answer: str) -> None:
        if log is not None:
            self.last = answer
            log.append(f"{text} → {answer}")

    def _error(self, inst: Inst, what: str, exc: BaseException) -> Broken:
        return Broken(
            STORE_ERROR,
            f"{inst.name} {what} raised {type(exc).__name__}: {exc}: a store operation throws "
            "nothing but the fence's refusal (ExecutionFencedError)",
        )

    @staticmethod
    def _leases(inst: Inst) -> ExecutionLeaseRepository:
        leases = inst.stores.leases
        assert leases is not None
        return leases

    def _lost(self, inst: Inst) -> None:
        """The store told it its lease is over: it stops, keeping the lease as a zombie's."""
        inst.holding = False
        inst.yielded = False
        inst.expiry = None

    def _after_state(
        self, inst: Inst, tree: TreeModel, token: int, state: LeaseState, check: bool
    ) -> None:
        if check and state is not LeaseState.LIVE:
            now = self.now
            for other in self.insts:
                if other.tree is tree and other.lease and other.lease.lease_epoch == token:
                    left = other.trust_left(now)
                    if left > 0:
                        raise Broken(
                            ONE_LIVE_HOLDER,
                            f"{inst.name} was told epoch {token} of {tree.name} is "
                            f"{state.value} while {other.name} still trusts it for {left} "
                            "ms: two live holders",
                        )
        if (
            state is LeaseState.SUPERSEDED
            and token == tree.epoch
            and not tree.released
            and not tree.finished
        ):
            # The store closed it in the step that read it.
            tree.closed = True
            tree.released = True
