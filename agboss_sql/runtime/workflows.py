"""What a user writes: workflows registered on a `Workflows` app, and the values that
describe a run.

    from agboss_sql.runtime import Child, WorkflowContext, Workflows

    app = Workflows("shop")

    @app.workflow
    async def order(ctx: WorkflowContext, order: dict) -> dict:
        stock = await ctx.step("reserve", reserve, order, undo=release)
        charge = await ctx.effect("charge", charge_card, order, business_key=order["id"])
        shipped = await ctx.children("ship", [Child("ship", item) for item in order["items"]])
        await ctx.pause("approval", {"total": charge["cents"]})
        return {"charged": charge, "shipped": shipped}

A worker runs the app (`agboss-sql worker --url URL --app shop.app:app`, or
`Engine(app, url=...)` in your own process); any instance starts, resumes, cancels and
reads runs. A workflow is re-run from its start whenever it resumes (after a crash, a
pause, its children): every call through the context answers what it stored the first
time, so the workflow's own code between those calls must be deterministic.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar, overload

from agboss_sql.contracts.keys import key_text_rule_of
from agboss_sql.contracts.types import JsonValue
from agboss_sql.runtime.errors import (
    InvalidStepNameError,
    NotJsonError,
    WorkflowDefinitionError,
)

WorkflowFunction = Callable[..., Awaitable[Any]]
F = TypeVar("F", bound=WorkflowFunction)

MAX_NAME_LENGTH = 100
"""The longest step, child, pause or outbound-call name."""


@dataclass(frozen=True, slots=True)
class WorkflowDefinition:
    """A registered workflow: its name and its function `(ctx, input) -> result`."""

    name: str
    function: WorkflowFunction
    takes_input: bool = True
    """Whether the function takes an input after the context (`(ctx, input)`, else `(ctx)`)."""


@dataclass(frozen=True, slots=True)
class Child:
    """A child workflow to run on any instance: the workflow's name and its input (JSON)."""

    workflow: str
    input: JsonValue = None


class WorkflowState(StrEnum):
    """Where a run is. `queued`: waiting for its children (no lease, no slot held);
    `paused`: waiting for a decision any instance gives (`Engine.resume`)."""

    RUNNING = "running"
    QUEUED = "queued"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in (WorkflowState.SUCCEEDED, WorkflowState.FAILED, WorkflowState.CANCELLED)


@dataclass(frozen=True, slots=True)
class PauseInfo:
    """A pause of a run: its name, what it asked, its status and decision."""

    name: str
    request: JsonValue
    status: str
    decision: JsonValue


@dataclass(frozen=True, slots=True)
class WorkflowStatus:
    """A run as the database holds it (read by any instance)."""

    tenant_id: str
    workflow_id: str
    workflow: str
    state: WorkflowState
    input: JsonValue
    result: JsonValue
    """The workflow's return value once `succeeded`, else `None`."""
    error: JsonValue
    """`{"type", "code", "message"}` once `failed`; the cancel's facts once `cancelled`."""
    pauses: tuple[PauseInfo, ...]
    created_at: int
    updated_at: int

    @property
    def pending_pause(self) -> PauseInfo | None:
        """The pause a `resume` would answer now, if exactly one waits."""
        pending = [p for p in self.pauses if p.status == "pending"]
        return pending[0] if len(pending) == 1 else None


class Workflows:
    """The workflows of one application: what `agboss-sql worker --app module:attr` loads.

    Register with `@app.workflow` (the function's name) or `@app.workflow(name="...")`. A
    name is registered once per app; the same app is loaded by every worker that should run
    these workflows (a worker that lacks one leaves its runs to a worker that has it)."""

    def __init__(self, name: str = "app") -> None:
        self.name = name
        self._definitions: dict[str, WorkflowDefinition] = {}

    @overload
    def workflow(self, function: F, /) -> F: ...

    @overload
    def workflow(
        self, function: None = None, /, *, name: str | None = None
    ) -> Callable[[F], F]: ...

    def workflow(
        self, function: F | None = None, /, *, name: str | None = None
    ) -> F | Callable[[F], F]:
        """Register `function` (an `async def (ctx, input)`) as a workflow."""

        def register(fn: F) -> F:
            self.register(fn, name=name)
            return fn

        return register(function) if function is not None else register

    def register(self, function: WorkflowFunction, *, name: str | None = None) -> None:
        """Register `function` under `name` (default: its `__name__`)."""
        if not inspect.iscoroutinefunction(function):
            raise WorkflowDefinitionError(
                f"workflow {getattr(function, '__name__', function)!r} must be an `async def "
                "(ctx, input)`"
            )
        parameters = list(inspect.signature(function).parameters.values())
        positional = [
            p
            for p in parameters
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
        if not 1 <= len(positional) <= 2:
            raise WorkflowDefinitionError(
                f"workflow {function.__name__!r} must take the context and at most one input "
                f"(`async def {function.__name__}(ctx, input)`), got {len(positional)} "
                "required parameters"
            )
        chosen = checked_name("workflow name", name if name is not None else function.__name__)
        if chosen in self._definitions:
            raise WorkflowDefinitionError(
                f"workflow {chosen!r} is registered twice in app {self.name!r}: give one of "
                "them another name"
            )
        accepted = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self._definitions[chosen] = WorkflowDefinition(chosen, function, len(accepted) >= 2)

    def get(self, name: str) -> WorkflowDefinition | None:
        """The definition registered under `name`, or `None`."""
        return self._definitions.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._definitions

    def __iter__(self) -> Iterator[WorkflowDefinition]:
        return iter(self._definitions.values())

    def __len__(self) -> int:
        return len(self._definitions)

    @property
    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._definitions)

    def __repr__(self) -> str:
        return f"Workflows({self.name!r}, {self.names!r})"


def checked_name(what: str, name: object) -> str:
    """`name` if it can name a step, child, pause or workflow, else `InvalidStepNameError`."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise InvalidStepNameError(
            f"{what} must be 1-{MAX_NAME_LENGTH} characters of text, got {name!r:.120}"
        )
    rule = key_text_rule_of(name)
    if rule is not None or "/" in name or "#" in name:
        raise InvalidStepNameError(
            f"{what} {name!r:.120} is not allowed: "
            + (rule or "`/` and `#` separate the parts of a step key")
        )
    return name


def checked_json(what: str, value: Any) -> JsonValue:
    """`value` if it is JSON (what the stores keep), else `NotJsonError` naming `what`."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise NotJsonError(f"{what} must be JSON: {error}") from None
    return value


def fingerprint_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A step call's arguments as one short text: a replay compares it with the stored one."""
    try:
        text = json.dumps([list(args), kwargs], sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise NotJsonError(f"a step's arguments must be JSON: {error}") from None
    return hashlib.sha256(text.encode()).hexdigest()[:32]


__all__ = [
    "Child",
    "MAX_NAME_LENGTH",
    "PauseInfo",
    "WorkflowDefinition",
    "WorkflowFunction",
    "WorkflowState",
    "WorkflowStatus",
    "Workflows",
    "checked_json",
    "checked_name",
    "fingerprint_of",
]
