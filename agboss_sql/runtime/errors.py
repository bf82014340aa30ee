"""The typed errors of the workflow runtime. Each says what happened and what to do; each
class's docstring is its default message."""

from __future__ import annotations

from agboss_sql.contracts.errors import AgbossError


class WorkflowDefinitionError(AgbossError, TypeError):
    """A workflow must be an `async def` taking the context first, under a unique name."""

    code = "workflow.invalid-definition"


class UnknownWorkflowError(AgbossError, LookupError):
    """No worker knows this workflow name: register it with `@workflows.workflow` in the app
    your workers load (`agboss-sql worker --app module:attr`), or fix the name."""

    code = "workflow.unknown"


class UnknownWorkflowRunError(AgbossError, LookupError):
    """No workflow run has this id (in this tenant): start it first, or fix the id."""

    code = "workflow.unknown-run"


class WorkflowIdConflictError(AgbossError):
    """A workflow run with this id was started with another workflow or input: an id names
    one run; start the new run under a new id."""

    code = "workflow.id-conflict"


class StepConflictError(AgbossError):
    """A step key was used again with other arguments: the workflow's code or input changed
    under a running tree, or two calls share one name. Give each distinct call its own step
    name; change a workflow's steps only once its running trees have ended."""

    code = "workflow.step-conflict"


class NotJsonError(AgbossError, TypeError):
    """A workflow input, step argument or result must be JSON (dict, list, str, int, float,
    bool, None): convert it before handing it over. Nothing was stored."""

    code = "workflow.not-json"


class InvalidStepNameError(AgbossError, ValueError):
    """A step, child, pause or outbound-call name must be 1-100 characters of text with no
    control characters and no `/` or `#` (they separate the parts of a step key)."""

    code = "workflow.invalid-step-name"


class WorkflowFailedError(AgbossError):
    """The workflow run ended failed: its error is in `error` (type, code, message)."""

    code = "workflow.failed"


class WorkflowCancelledError(AgbossError):
    """The workflow run was cancelled and its compensations ran."""

    code = "workflow.cancelled"


class ChildWorkflowFailedError(AgbossError):
    """A child workflow ended failed or cancelled: `failures` names each child and its
    error. Catch it in the parent to go on without them."""

    code = "workflow.child-failed"


class WorkflowTimeoutError(AgbossError, TimeoutError):
    """The workflow run did not end within the time the caller gave `result()`; it goes on.
    Ask again later, or with a longer timeout."""

    code = "workflow.result-timeout"


class PauseNotSupportedError(AgbossError):
    """A child workflow cannot pause (only a tree's root can): pause in the parent before or
    after its children run."""

    code = "workflow.pause-in-child"


class AmbiguousPauseError(AgbossError):
    """The run waits on more than one pause: name the one to answer (`pause=`)."""

    code = "workflow.ambiguous-pause"


class NoWorkflowContextError(AgbossError, RuntimeError):
    """This call needs a running workflow: call it from a workflow's code, through its context."""

    code = "workflow.no-context"


__all__ = [
    "AmbiguousPauseError",
    "ChildWorkflowFailedError",
    "InvalidStepNameError",
    "NoWorkflowContextError",
    "NotJsonError",
    "PauseNotSupportedError",
    "StepConflictError",
    "UnknownWorkflowError",
    "UnknownWorkflowRunError",
    "WorkflowCancelledError",
    "WorkflowDefinitionError",
    "WorkflowFailedError",
    "WorkflowIdConflictError",
    "WorkflowTimeoutError",
]
