"""Key helpers: the rules of a fenced effect's key. Store authors call these; never copy them."""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from agboss_sql.contracts.errors import (
    CorruptStoredRowError,
    IdempotencyKeyConflictError,
    InvalidBusinessKeyError,
    InvalidFencedEffectNameError,
    InvalidFingerprintError,
    InvalidIdentifierError,
    InvalidStepError,
)
from agboss_sql.contracts.limits import (
    MAX_BUSINESS_KEY_LENGTH,
    MAX_EFFECT_NAME_LENGTH,
    MAX_FINGERPRINT_LENGTH,
    MAX_IDEMPOTENCY_KEY_LENGTH,
    MAX_STEP_NAME_LENGTH,
    over_limit,
)
from agboss_sql.contracts.limits import MAX_IDENTIFIER_LENGTH as MAX_IDENTIFIER_LENGTH
from agboss_sql.contracts.limits import unstorable_text_rule_of as unstorable_text_rule_of
from agboss_sql.contracts.types import (
    AttemptOwner,
    ExecutionContext,
    FencedEffectKey,
    JsonValue,
    OutboundCall,
    OutboundCallStatus,
    StepRef,
    StoredKeyFacts,
)

_EFFECT_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")
EFFECT_NAME_RULE = "an effect name is 1-100 characters of [A-Za-z0-9._-]"
KEY_TEXT_RULE = "a key's text is 1-255 characters, not blank, with no control characters"
STEP_RULE = (
    "a step is a StepRef of an execution id (an identifier), an idempotency key and a name "
    f"(non-empty texts of at most {MAX_IDEMPOTENCY_KEY_LENGTH} and {MAX_STEP_NAME_LENGTH} "
    "characters a database can store: no NUL character, no lone surrogate)"
)
FINGERPRINT_RULE = (
    f"a fingerprint is None or a text of at most {MAX_FINGERPRINT_LENGTH} characters a "
    "database can store (no NUL character, no lone surrogate)"
)


def _joined(*parts: object) -> str:
    # A JSON array escapes every separator inside a part: no two part lists share a text.
    return json.dumps(parts, ensure_ascii=False, separators=(",", ":"))


def checked_identifier(what: str, value: object) -> str:
    """`value` if it is an identifier (1-255 characters of text a database can store, not
    ending with a space), else `InvalidIdentifierError`."""
    if not isinstance(value, str) or not value or len(value) > MAX_IDENTIFIER_LENGTH:
        raise InvalidIdentifierError(
            f"{what} must be a non-empty text of at most {MAX_IDENTIFIER_LENGTH} characters "
            f"(MAX_IDENTIFIER_LENGTH), got {value!r:.80}",
            limit="MAX_IDENTIFIER_LENGTH",
        )
    unstorable = unstorable_text_rule_of(value)
    if unstorable is not None:
        raise InvalidIdentifierError(f"{what} must not hold {unstorable}, got {value!r:.80}")
    if value[-1] == " ":
        # MySQL and MariaDB compare texts with trailing spaces as equal ("e" = "e "): refused
        # on every backend, so a key never means one row here and two rows there.
        raise InvalidIdentifierError(f"{what} must not end with a space, got {value!r:.80}")
    return value


def checked_effect_name(name: object) -> str:
    """`name` if it is 1-100 of `[A-Za-z0-9._-]`, else `InvalidFencedEffectNameError`."""
    if not isinstance(name, str) or _EFFECT_NAME.fullmatch(name) is None:
        if isinstance(name, str) and len(name) > MAX_EFFECT_NAME_LENGTH:
            raise InvalidFencedEffectNameError(
                f"{EFFECT_NAME_RULE} (MAX_EFFECT_NAME_LENGTH); got {len(name)} characters",
                limit="MAX_EFFECT_NAME_LENGTH",
            )
        raise InvalidFencedEffectNameError(f"{EFFECT_NAME_RULE}; got {name!r:.120}")
    return name


def key_text_rule_of(text: object) -> str | None:
    """The rule `text` breaks as a key's text, or `None` when it is a valid key text."""
    if not isinstance(text, str):
        return f"{KEY_TEXT_RULE}; got a {type(text).__name__}"
    if not 1 <= len(text) <= MAX_BUSINESS_KEY_LENGTH:
        return f"{KEY_TEXT_RULE} (MAX_BUSINESS_KEY_LENGTH); got {len(text)} characters"
    if not text.strip():
        return f"{KEY_TEXT_RULE}; got a blank text"
    if any(unicodedata.category(ch) == "Cc" for ch in text):
        return f"{KEY_TEXT_RULE}; got a control character"
    unstorable = unstorable_text_rule_of(text)
    if unstorable is not None:
        return f"{KEY_TEXT_RULE}; got {unstorable}"
    return None


def checked_business_key(key: FencedEffectKey) -> FencedEffectKey:
    """`key` if its business key, when present, is a key's text, else `InvalidBusinessKeyError`."""
    if key.business_key is not None:
        rule = key_text_rule_of(key.business_key)
        if rule is not None:
            over = isinstance(key.business_key, str) and (
                len(key.business_key) > MAX_BUSINESS_KEY_LENGTH
            )
            raise InvalidBusinessKeyError(
                f"business key refused: {rule}",
                **({"limit": "MAX_BUSINESS_KEY_LENGTH"} if over else {}),
            )
    return key


_STEP_LIMITS = {
    "idempotency key": ("MAX_IDEMPOTENCY_KEY_LENGTH", MAX_IDEMPOTENCY_KEY_LENGTH),
    "name": ("MAX_STEP_NAME_LENGTH", MAX_STEP_NAME_LENGTH),
}


def checked_step(step: object) -> StepRef:
    """`step` if it is a `StepRef` whose parts a stored row can give back (`replayed_from_of`
    requires three non-empty texts), else `InvalidStepError`."""
    if not isinstance(step, StepRef):
        raise InvalidStepError(f"{STEP_RULE}; got a {type(step).__name__}")
    execution_id = step.execution_id
    if (
        not isinstance(execution_id, str)
        or not execution_id
        or len(execution_id) > MAX_IDENTIFIER_LENGTH
        or execution_id[-1] == " "
    ):
        raise InvalidStepError(f"{STEP_RULE}; got the execution id {execution_id!r:.80}")
    for what, part in (
        ("execution id", execution_id),
        ("idempotency key", step.idempotency_key),
        ("name", step.name),
    ):
        if not isinstance(part, str) or not part:
            raise InvalidStepError(f"{STEP_RULE}; got the {what} {part!r:.80}")
        limit, maximum = _STEP_LIMITS.get(what, ("MAX_IDENTIFIER_LENGTH", MAX_IDENTIFIER_LENGTH))
        if len(part) > maximum:
            raise InvalidStepError(
                over_limit(f"the step's {what}", len(part), limit, maximum), limit=limit
            )
        unstorable = unstorable_text_rule_of(part)
        if unstorable is not None:
            raise InvalidStepError(f"{STEP_RULE}; got {unstorable} in the {what} {part!r:.80}")
    return step


def checked_fingerprint(fingerprint: object) -> str | None:
    """`fingerprint` if it is `None` or a text a database can store (a stored row gives it
    back as the same text), else `InvalidFingerprintError`."""
    if fingerprint is None:
        return None
    if not isinstance(fingerprint, str):
        raise InvalidFingerprintError(f"{FINGERPRINT_RULE}; got a {type(fingerprint).__name__}")
    if len(fingerprint) > MAX_FINGERPRINT_LENGTH:
        raise InvalidFingerprintError(
            over_limit(
                "a fingerprint", len(fingerprint), "MAX_FINGERPRINT_LENGTH", MAX_FINGERPRINT_LENGTH
            ),
            limit="MAX_FINGERPRINT_LENGTH",
        )
    unstorable = unstorable_text_rule_of(fingerprint)
    if unstorable is not None:
        raise InvalidFingerprintError(f"{FINGERPRINT_RULE}; got {unstorable}")
    return fingerprint


def scope_key_of(tenant_id: str, execution_id: str) -> str:
    """The scope of a lease: its `(tenant, execution)` as one unambiguous text."""
    return _joined(tenant_id, execution_id)


def fenced_effect_key_of(
    ctx: ExecutionContext,
    name: str,
    *,
    business_key: str | None = None,
    fingerprint: str | None = None,
) -> FencedEffectKey:
    """The key of effect `name` of the running step, fenced by the step's lease."""
    lease = ctx.lease
    key = FencedEffectKey(
        tenant_id=ctx.tenant_id,
        lease_execution_id=lease.execution_id,
        token=lease.lease_epoch,
        scope_key=scope_key_of(lease.tenant_id, lease.execution_id),
        step=checked_step(ctx.step),
        name=checked_effect_name(name),
        business_key=business_key,
        fingerprint=checked_fingerprint(fingerprint),
        holder_instance_id=checked_identifier("holder_instance_id", lease.holder_instance_id),
    )
    return checked_business_key(key)


def fenced_key_identity_of(key: FencedEffectKey) -> str:
    """The key's row identity: the scope, the step's idempotency key and the name;
    or, with a business key, the tenant, the name and the business key."""
    if key.business_key is not None:
        return _joined("business", key.tenant_id, key.name, key.business_key)
    return _joined("step", key.scope_key, key.step.idempotency_key, key.name)


def business_identity_of(key: FencedEffectKey) -> str | None:
    """The business identity of a key (tenant, name, business key), or `None`."""
    if key.business_key is None:
        return None
    return _joined("business", key.tenant_id, key.name, key.business_key)


def stored_key_facts_of(key: FencedEffectKey) -> StoredKeyFacts:
    """What a row keeps of its key: the fingerprint and the step."""
    return StoredKeyFacts(fingerprint=key.fingerprint, step=key.step)


def _stored_step(stored: StoredKeyFacts | Mapping[str, Any]) -> tuple[str | None, object]:
    if isinstance(stored, StoredKeyFacts):
        step: object = stored.step
        fingerprint = stored.fingerprint
    else:
        fingerprint = stored.get("fingerprint")
        step = stored.get("step")
        if step is None and "step_execution_id" in stored:
            step = (
                stored.get("step_execution_id"),
                stored.get("step_idempotency_key"),
                stored.get("step_name"),
            )
    if isinstance(step, StepRef):
        step = (step.execution_id, step.idempotency_key, step.name)
    if fingerprint is not None and not isinstance(fingerprint, str):
        raise CorruptStoredRowError(f"stored fingerprint is not a text: {fingerprint!r:.80}")
    return fingerprint, step


def replayed_from_of(
    key: FencedEffectKey, stored: StoredKeyFacts | Mapping[str, Any]
) -> StepRef | None:
    """On a stored row for `key`: the step that wrote it when it is another step, else `None`.

    Another fingerprint under a business key is `IdempotencyKeyConflictError`,
    never a replay. A row is never trusted: a stored step that is not three
    non-empty texts is `CorruptStoredRowError`.
    """
    fingerprint, step = _stored_step(stored)
    if key.business_key is not None and fingerprint != key.fingerprint:
        raise IdempotencyKeyConflictError(
            f"business key {key.business_key!r} of effect {key.name!r} was used with another "
            "fingerprint: the same business key must carry the same content"
        )
    if (
        not isinstance(step, (tuple, list))
        or len(step) != 3
        or not all(isinstance(part, str) and part for part in step)
    ):
        raise CorruptStoredRowError(f"stored step is not a step reference: {step!r:.120}")
    stored_step = StepRef(execution_id=step[0], idempotency_key=step[1], name=step[2])
    return None if stored_step == key.step else stored_step


def attempt_owner_of(key: FencedEffectKey) -> str:
    """The owner text of an attempt made under `key`'s lease and token."""
    return _joined(key.tenant_id, key.lease_execution_id, key.token)


def parse_attempt_owner(owner: str) -> AttemptOwner | None:
    """The lease behind an owner text, or `None` for an owner that is not one."""
    try:
        tenant_id, execution_id, token = json.loads(owner)
    except (ValueError, TypeError):
        return None
    if not (
        isinstance(tenant_id, str)
        and isinstance(execution_id, str)
        and isinstance(token, int)
        and not isinstance(token, bool)
    ):
        return None
    return AttemptOwner(tenant_id, execution_id, token)


def pending_outbound_call_of(
    key: FencedEffectKey, intent: JsonValue, recorded_at: int
) -> OutboundCall:
    """The record `save_if_absent` writes: the intent, pending at attempt 0, under the key's
    lease and token."""
    return OutboundCall(
        key_identity=fenced_key_identity_of(key),
        business_identity=business_identity_of(key),
        tenant_id=key.tenant_id,
        name=key.name,
        intent=intent,
        status=OutboundCallStatus.PENDING,
        attempt=0,
        attempt_owner=attempt_owner_of(key),
        lease_execution_id=key.lease_execution_id,
        token=key.token,
        fingerprint=key.fingerprint,
        step=key.step,
        recorded_at=recorded_at,
        updated_at=recorded_at,
    )
