"""Errors with stable codes. Each class's docstring is its default message."""

from __future__ import annotations

from typing import Any, ClassVar


class AgbossError(Exception):
    """A store or framework error."""

    code: ClassVar[str] = "agboss.error"

    def __init__(self, message: str | None = None, **facts: Any) -> None:
        self.facts = facts
        text = message or (type(self).__doc__ or type(self).__name__).strip().splitlines()[0]
        super().__init__(f"[{self.code}] {text}")


class ExecutionFencedError(AgbossError):
    """The write was refused: its lease token is not the lease's current one.

    Another instance owns this execution now; stop and let it continue.
    """

    code = "execution.fenced"

    def __init__(self, scope_key: str, token: int, reason: str, message: str | None = None) -> None:
        self.scope_key = scope_key
        self.token = token
        self.reason = reason
        super().__init__(
            message
            or f"write at token {token} of {scope_key} refused ({reason}): another instance "
            "owns this execution now; stop and let the new holder continue",
            scope_key=scope_key,
            token=token,
            reason=reason,
        )


class ExecutionLeaseLostError(AgbossError):
    """This instance no longer holds the execution's lease: start no further call."""

    code = "execution.lease-lost"


class ExecutionCancelledError(AgbossError):
    """The execution was cancelled (possibly from another instance)."""

    code = "execution.cancelled"


class IdempotencyKeyConflictError(AgbossError):
    """The key was used before with another fingerprint: use a new key for new content."""

    code = "idempotency.key-conflict"


class InvalidFencedEffectNameError(AgbossError):
    """An effect name must be 1-100 characters of [A-Za-z0-9._-]."""

    code = "fenced-effect.invalid-name"


class InvalidBusinessKeyError(AgbossError):
    """A business key must be 1-255 characters, not blank, with no control characters."""

    code = "fenced-effect.invalid-business-key"


class InvalidStepError(AgbossError):
    """A step is a StepRef: an execution id (an identifier), an idempotency key and a name."""

    code = "fenced-effect.invalid-step"


class InvalidFingerprintError(AgbossError):
    """A fingerprint is a text (or None) a database can store: no NUL character."""

    code = "fenced-effect.invalid-fingerprint"


class InvalidIdentifierError(AgbossError):
    """An identifier must be a non-empty text of at most 255 characters."""

    code = "store.invalid-identifier"


class InvalidNumberError(AgbossError, ValueError):
    """A number is out of what every backend stores (see `contracts.rules`: whole numbers
    fit a signed 64-bit column, a queue depth or an attempt a signed 32-bit one, a duration
    at most `MAX_DURATION_MS`)."""

    code = "store.invalid-number"


class InvalidPayloadError(AgbossError, TypeError, ValueError):
    """A payload (a result, an outcome, a request, a checkpoint's JSON) must be JSON every
    backend stores: no NaN or infinity, no object JSON has no form for, no cycle or nesting
    deeper than Python's JSON encoder goes, no lone surrogate, at most `MAX_PAYLOAD_BYTES`
    of UTF-8 text."""

    code = "store.invalid-payload"


class InvalidValueError(AgbossError, ValueError):
    """An argument a store cannot keep as it is: a text over its limit or holding what a
    database cannot store (a NUL character, a lone surrogate), or a value outside its
    choices (a status, a scope). `facts["limit"]`, when set, names the limit
    (`contracts.limits`)."""

    code = "store.invalid-value"


class StoreRefusedError(AgbossError):
    """The database refused a store's statement (a constraint, a trigger, a server setting):
    the driver's error is its cause (`__cause__`, and `orig`). Nothing of the statement was
    applied; the transaction it was part of was rolled back."""

    code = "store.refused"

    def __init__(self, message: str | None = None, *, orig: BaseException | None = None) -> None:
        self.orig = orig
        AgbossError.__init__(self, message)


class FencedEffectStoreMismatchError(AgbossError):
    """The fencing store is not on the lease store's backend: list one on the same backend."""

    code = "fenced-effect.store-mismatch"


class DuplicateExecutionError(AgbossError):
    """An execution with this id already exists."""

    code = "execution.duplicate"


class DuplicateChildError(AgbossError):
    """A child with this id is already queued."""

    code = "child.duplicate"


class DuplicatePauseError(AgbossError):
    """A pause with this id already exists."""

    code = "pause.duplicate"


class NotPausedError(AgbossError):
    """The pause is not pending (already answered, taken, cancelled or unknown)."""

    code = "pause.not-paused"


class CorruptStoredRowError(AgbossError):
    """A stored row lacks facts it must have: the store's data is damaged."""

    code = "store.corrupt-row"


class StoreUnavailableError(AgbossError):
    """The store's database could not be reached or kept failing.

    Nothing of the failed call was applied: it is safe to call again.
    """

    code = "store.unavailable"


class StoreTimeoutError(StoreUnavailableError):
    """A bounded wait ended: connecting, a statement, a lock or a pooled connection.

    `what` names the wait (`connect`, `statement`, `lock`, `pool`, `retry`) and `bound_ms`
    its configured bound (`Timeouts`). Unless it is a `CommitOutcomeUnknownError`, nothing
    of the call was applied: it is safe to call again.
    """

    code = "store.timeout"

    def __init__(self, what: str, bound_ms: int, message: str | None = None) -> None:
        self.what = what
        self.bound_ms = bound_ms
        AgbossError.__init__(
            self,
            message or f"the {what} wait passed its bound of {bound_ms} ms",
            what=what,
            bound_ms=bound_ms,
        )


class ServerSettingError(StoreUnavailableError):
    """A server setting is below what the stores need (`setting`, its `value` and the
    `required` minimum): MySQL/MariaDB's `max_allowed_packet` under
    `contracts.limits.MIN_MAX_ALLOWED_PACKET`. No connection is handed out until it is
    raised on the server."""

    code = "store.server-setting"

    def __init__(self, setting: str, value: int, required: int) -> None:
        self.setting = setting
        self.value = value
        self.required = required
        AgbossError.__init__(
            self,
            f"the server's {setting} is {value} bytes, under the {required} bytes the stores "
            f"need to send their largest statement (limit MIN_MAX_ALLOWED_PACKET): raise it "
            f"(SET GLOBAL {setting} = {required}, or in the server's configuration)",
            setting=setting,
            value=value,
            required=required,
            limit="MIN_MAX_ALLOWED_PACKET",
        )


class StoreReadOnlyError(StoreUnavailableError):
    """The server refused a write because it takes none now: a standby (a replica in
    recovery, or a primary demoted by a failover), or a session read-only by default
    (PostgreSQL's `default_transaction_read_only`, SQLSTATE 25006; a MySQL/MariaDB server
    run `--read-only`). Nothing of the call was applied.

    Call again once the instance reaches the primary: with a URL naming every server and
    `target_session_attrs=read-write` (PostgreSQL), a new connection skips the standbys
    and finds the one promoted."""

    code = "store.read-only"


class BoundsDroppedError(StoreUnavailableError):
    """The server session did not get the bounds sent as startup options: something between
    the client and the server (a pooler, e.g. PgBouncer with `ignore_startup_parameters =
    options`) dropped them. No connection is handed out: add `?agboss_pooling=transaction`
    to the URL (the bounds are then set in every transaction), or connect to the server
    directly."""

    code = "store.bounds-dropped"


class CommitOutcomeUnknownError(StoreUnavailableError):
    """The write was sent and its answer never came: it may or may not have committed.

    The store does not retry it blindly. Call the same operation again once the database
    answers: a fenced effect replays its stored result if the first commit landed and runs
    the work once if it did not; a compare-and-set answers from the row as it now is.
    """

    code = "store.commit-outcome-unknown"


class AssemblyError(AgbossError):
    """The application's store layout is invalid."""

    code = "application.assembly"


class SchemaNotReadyError(AgbossError):
    """The database's agboss schema is not at the revision this code needs: migrate it.

    `revision` is the database's revision (`None`: no agboss revision at all) and `head`
    the one the stores need; the message names the command to run.
    """

    code = "schema.not-ready"

    def __init__(self, revision: str | None, head: str, message: str | None = None) -> None:
        self.revision = revision
        self.head = head
        AgbossError.__init__(
            self,
            message
            or f"the database's agboss schema is at {revision or 'base (no schema)'}, the "
            f"stores need {head}: run `agboss-sql upgrade --url URL`",
            revision=revision,
            head=head,
        )


class SchemaUnversionedError(AgbossError):
    """The agboss tables exist but carry no revision (no `agboss_alembic_version` row).

    An upgrade would try to create them again. If the tables match a revision, record it
    with `agboss-sql stamp --url URL [--revision REV]`, then upgrade.
    """

    code = "schema.unversioned"
