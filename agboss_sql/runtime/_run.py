"""What a run of one execution is, and the keys its calls are stored under."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agboss_sql.contracts.errors import ExecutionFencedError, ExecutionLeaseLostError
from agboss_sql.contracts.types import ExecutionLease, JsonValue
from agboss_sql.runtime.errors import StepConflictError
from agboss_sql.runtime.keeper import LeaseKeeper

INPUT_KEY = "@agboss/workflow"
"""The tree key a root run's workflow name and input are stored under at `start`."""
END_DECISION_KEY = "@agboss/end"
"""The tree key that decides between a cancel and the root's close: whichever writes it
first wins, so a cancel either ends the tree cancelled or is told it came too late."""
PAUSE_PREFIX = "@agboss/pause/"
"""Tree keys naming each pause of the root (`PAUSE_PREFIX + step key` -> its pause id)."""

REGISTRY_TENANT = "@agboss"
REGISTRY_ROOT = "@agboss/workflows"
"""Where each worker writes the names of the workflows its app knows (tree keys), so a
`start` anywhere can tell a name no worker knows from a workflow of another app."""

STEP_EFFECT = "wf.step"
EFFECT_EFFECT = "wf.effect"
UNDO_EFFECT = "wf.undo"
OUTBOUND_EFFECT = "wf.call"

HANDOVER = (ExecutionLeaseLostError, ExecutionFencedError)
"""Errors that mean another instance owns the execution now: stop, undo nothing."""

Emit = Callable[[dict[str, Any]], None]
MAX_KEY = 255


class Suspended(Exception):
    """The run waits (a pause, or its children) holding no lease: it ends here, and
    resumes from its stored steps when woken."""


class StoreGaveUpError(ExecutionLeaseLostError):
    """A store call kept failing on this instance for a whole lease: the run stops as if its
    lease were lost (nothing is undone) and another instance runs the execution on."""


def bounded(text: str) -> str:
    """`text` if it fits a key, else a prefix of it and its digest (unambiguous)."""
    if len(text) <= MAX_KEY:
        return text
    return text[:180] + "~" + hashlib.sha256(text.encode()).hexdigest()


def child_id_of(parent: str, key: str, index: int) -> str:
    """The id of child `index` of a parent's children call `key`."""
    return bounded(f"{parent}/{key}.{index}")


@dataclass
class Run:
    """One run of one execution on this instance."""

    tenant_id: str
    root: str
    execution: str
    depth: int
    keeper: LeaseKeeper
    workflow: str
    attempt: int | None = None
    """The child's queue attempt (`None` for a root)."""
    counters: dict[str, int] = field(default_factory=dict)
    steps: int = 0

    @property
    def lease(self) -> ExecutionLease:
        lease = self.keeper.lease
        assert lease is not None
        return lease

    @property
    def fresh(self) -> bool:
        """The first lease ever granted for this execution: nothing can be stored under its
        scope yet, so steps need not look for a stored result first."""
        return self.lease.lease_epoch == 1 and self.lease.taken_over_from is None


def value_of(stored: JsonValue) -> JsonValue:
    return stored.get("v") if isinstance(stored, dict) else stored


def check_fingerprint(run: Run, key: str, fingerprint: str, stored: JsonValue) -> None:
    found = stored.get("fp") if isinstance(stored, dict) else None
    if found is not None and found != fingerprint:
        raise StepConflictError(
            f"step {key!r} of {run.execution} was stored with other arguments: the "
            "workflow's code or input changed under a running tree, or two calls share one "
            "name; give each distinct call its own name",
            execution_id=run.execution,
            step=key,
        )


__all__ = [
    "REGISTRY_ROOT",
    "REGISTRY_TENANT",
    "EFFECT_EFFECT",
    "END_DECISION_KEY",
    "HANDOVER",
    "INPUT_KEY",
    "OUTBOUND_EFFECT",
    "PAUSE_PREFIX",
    "STEP_EFFECT",
    "UNDO_EFFECT",
    "Emit",
    "Run",
    "StoreGaveUpError",
    "Suspended",
    "bounded",
    "check_fingerprint",
    "child_id_of",
    "value_of",
]
