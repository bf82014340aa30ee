"""The key helpers keep the rules of a fenced effect's key (docs/limits.md)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from agboss_sql.contracts import (
    EFFECT_NAME_RULE,
    KEY_TEXT_RULE,
    AttemptOwner,
    CorruptStoredRowError,
    ExecutionContext,
    ExecutionLease,
    FencedEffectKey,
    IdempotencyKeyConflictError,
    InvalidBusinessKeyError,
    InvalidFencedEffectNameError,
    InvalidIdentifierError,
    OutboundCallStatus,
    StepRef,
    StoredKeyFacts,
    attempt_owner_of,
    business_identity_of,
    checked_business_key,
    checked_effect_name,
    checked_identifier,
    fenced_effect_key_of,
    fenced_key_identity_of,
    key_text_rule_of,
    parse_attempt_owner,
    pending_outbound_call_of,
    replayed_from_of,
    scope_key_of,
    stored_key_facts_of,
)

STEP = StepRef("exec-1", "idem-1", "step-name")
OTHER_STEP = StepRef("exec-2", "idem-9", "other-step")

# Texts that contain what a naive join would use as a separator or quote.
TRICKY = ["a", "a,b", "b", "a:b", '"', '","', "[", "]", "\\", '\\"', "a|b", " ", "null", "1"]


def lease(tenant: str = "tenant-1", execution: str = "exec-1", epoch: int = 3) -> ExecutionLease:
    return ExecutionLease(tenant, execution, "instance-1", epoch, 30_000)


def context(step: StepRef = STEP, **lease_args: Any) -> ExecutionContext:
    held = lease(**lease_args)
    return ExecutionContext(held.tenant_id, held.execution_id, held.execution_id, held, step)


def key(
    name: str = "charge",
    *,
    step: StepRef = STEP,
    business_key: str | None = None,
    fingerprint: str | None = None,
    **lease_args: Any,
) -> FencedEffectKey:
    return fenced_effect_key_of(
        context(step, **lease_args), name, business_key=business_key, fingerprint=fingerprint
    )


# effect names


@pytest.mark.parametrize("name", ["a", "charge", "A-z_0.9", "x" * 100, "...", "-"])
def test_an_effect_name_of_1_to_100_allowed_characters_passes(name: str) -> None:
    assert checked_effect_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "x" * 101, "has space", "a/b", "naïve", "tab\t", "a\n", "é", None, 5, b"ab"]
)
def test_any_other_effect_name_is_refused_naming_the_rule(name: Any) -> None:
    with pytest.raises(InvalidFencedEffectNameError) as refused:
        checked_effect_name(name)
    assert EFFECT_NAME_RULE in str(refused.value)
    assert refused.value.code == "fenced-effect.invalid-name"


def test_fenced_effect_key_of_checks_the_name() -> None:
    with pytest.raises(InvalidFencedEffectNameError):
        key("no spaces")


# business keys


@pytest.mark.parametrize("text", ["a", "order-7", "k" * 255, "ключ", "a b", " padded ", "😀"])
def test_a_key_text_of_1_to_255_printable_characters_passes(text: str) -> None:
    assert key_text_rule_of(text) is None
    assert checked_business_key(key(business_key=text)).business_key == text


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "0 characters"),
        ("k" * 256, "256 characters"),
        (" ", "blank"),
        ("   \u3000 ", "blank"),
        ("a\nb", "control"),
        ("a\x00b", "control"),
        ("a\x1bb", "control"),
        ("a\x7fb", "control"),
        ("a\x85b", "control"),
        (7, "int"),
        (None, "NoneType"),
    ],
)
def test_any_other_key_text_breaks_the_rule_and_says_how(text: Any, why: str) -> None:
    rule = key_text_rule_of(text)
    assert rule is not None
    assert rule.startswith(KEY_TEXT_RULE)
    assert why in rule


@pytest.mark.parametrize("text", ["", "\t", "a\rb", "k" * 256, "  "])
def test_an_invalid_business_key_is_refused_naming_the_rule(text: str) -> None:
    with pytest.raises(InvalidBusinessKeyError) as refused:
        key(business_key=text)
    assert KEY_TEXT_RULE in str(refused.value)
    assert refused.value.code == "fenced-effect.invalid-business-key"


def test_no_business_key_passes() -> None:
    built = key()
    assert checked_business_key(built) is built


# identifiers


@pytest.mark.parametrize("value", ["a", "x" * 255, "a b", "\n"])
def test_an_identifier_is_a_non_empty_text_of_at_most_255_characters(value: str) -> None:
    assert checked_identifier("tenant_id", value) == value


@pytest.mark.parametrize("value", ["", "x" * 256, None, 1, b"a"])
def test_any_other_identifier_is_refused_naming_what_it_is(value: Any) -> None:
    with pytest.raises(InvalidIdentifierError, match="tenant_id"):
        checked_identifier("tenant_id", value)


# the key


def test_fenced_effect_key_of_holds_the_lease_the_step_and_the_name() -> None:
    built = key(business_key="order-7", fingerprint="fp")
    assert built == FencedEffectKey(
        tenant_id="tenant-1",
        lease_execution_id="exec-1",
        token=3,
        scope_key=scope_key_of("tenant-1", "exec-1"),
        step=STEP,
        name="charge",
        business_key="order-7",
        fingerprint="fp",
    )


def test_scope_keys_are_unambiguous() -> None:
    scopes = {(a, b): scope_key_of(a, b) for a, b in itertools.product(TRICKY, repeat=2)}
    assert len(set(scopes.values())) == len(scopes)


def test_a_step_keys_identity_is_its_scope_its_idempotency_key_and_its_name() -> None:
    base = fenced_key_identity_of(key())
    # The step's execution id and name are not part of it: only its idempotency key.
    assert fenced_key_identity_of(key(step=StepRef("x", "idem-1", "y"))) == base
    assert fenced_key_identity_of(key(fingerprint="fp")) == base
    assert fenced_key_identity_of(key(step=StepRef("exec-1", "idem-2", "step-name"))) != base
    assert fenced_key_identity_of(key("refund")) != base
    assert fenced_key_identity_of(key(execution="exec-2")) != base
    assert fenced_key_identity_of(key(tenant="tenant-2")) != base
    # The token is not part of it: the next holder finds the previous holder's row.
    assert fenced_key_identity_of(key(epoch=4)) == base


def test_a_business_keys_identity_is_the_tenant_the_name_and_the_business_key() -> None:
    base = fenced_key_identity_of(key(business_key="order-7"))
    assert fenced_key_identity_of(key(business_key="order-7", execution="exec-2")) == base
    assert fenced_key_identity_of(key(business_key="order-7", step=OTHER_STEP)) == base
    assert fenced_key_identity_of(key(business_key="order-7", epoch=9)) == base
    assert fenced_key_identity_of(key(business_key="order-8")) != base
    assert fenced_key_identity_of(key("refund", business_key="order-7")) != base
    assert fenced_key_identity_of(key(business_key="order-7", tenant="tenant-2")) != base
    assert business_identity_of(key(business_key="order-7")) == base
    assert business_identity_of(key()) is None


def test_identities_never_collide_whatever_the_parts_contain() -> None:
    identities: dict[str, tuple[str, ...]] = {}
    for tenant, execution, idem in itertools.product(TRICKY, repeat=3):
        parts = ("step", tenant, execution, idem)
        built = key(step=StepRef("e", idem, "n"), tenant=tenant, execution=execution)
        identity = fenced_key_identity_of(built)
        assert identities.setdefault(identity, parts) == parts
    for tenant, business in itertools.product(TRICKY, repeat=2):
        parts = ("business", tenant, business)
        if key_text_rule_of(business) is not None:
            continue
        identity = fenced_key_identity_of(key(business_key=business, tenant=tenant))
        assert identities.setdefault(identity, parts) == parts


def test_a_step_identity_never_equals_a_business_identity() -> None:
    # A step key crafted from the parts of a business identity stays a step identity.
    business = key(business_key="order-7")
    crafted = key(step=StepRef("e", "order-7", "n"), tenant="business", execution="tenant-1")
    assert fenced_key_identity_of(crafted) != fenced_key_identity_of(business)


# stored facts and replays


def test_stored_key_facts_are_the_fingerprint_and_the_step() -> None:
    assert stored_key_facts_of(key(fingerprint="fp")) == StoredKeyFacts("fp", STEP)
    assert stored_key_facts_of(key()) == StoredKeyFacts(None, STEP)


def test_a_row_of_the_same_step_is_a_replay_from_nowhere_else() -> None:
    built = key(fingerprint="fp")
    assert replayed_from_of(built, stored_key_facts_of(built)) is None


def test_a_row_another_step_wrote_names_that_step() -> None:
    writer = key(business_key="order-7", fingerprint="fp", step=OTHER_STEP, execution="exec-2")
    reader = key(business_key="order-7", fingerprint="fp")
    assert replayed_from_of(reader, stored_key_facts_of(writer)) == OTHER_STEP


@pytest.mark.parametrize(("stored", "mine"), [("fp-1", "fp-2"), (None, "fp"), ("fp", None)])
def test_another_fingerprint_under_a_business_key_is_a_conflict(
    stored: str | None, mine: str | None
) -> None:
    reader = key(business_key="order-7", fingerprint=mine)
    with pytest.raises(IdempotencyKeyConflictError) as conflict:
        replayed_from_of(reader, StoredKeyFacts(stored, OTHER_STEP))
    assert conflict.value.code == "idempotency.key-conflict"


def test_no_fingerprint_on_either_side_of_a_business_key_is_no_conflict() -> None:
    reader = key(business_key="order-7")
    assert replayed_from_of(reader, StoredKeyFacts(None, OTHER_STEP)) == OTHER_STEP


def test_without_a_business_key_the_fingerprint_is_not_compared() -> None:
    reader = key(fingerprint="new")
    assert replayed_from_of(reader, StoredKeyFacts("old", STEP)) is None


@pytest.mark.parametrize(
    "row",
    [
        {"fingerprint": "fp", "step": OTHER_STEP},
        {"fingerprint": "fp", "step": ["exec-2", "idem-9", "other-step"]},
        {"fingerprint": "fp", "step": ("exec-2", "idem-9", "other-step")},
        {
            "fingerprint": "fp",
            "step_execution_id": "exec-2",
            "step_idempotency_key": "idem-9",
            "step_name": "other-step",
        },
    ],
)
def test_a_rows_step_is_read_from_any_row_shape(row: dict[str, Any]) -> None:
    reader = key(business_key="order-7", fingerprint="fp")
    assert replayed_from_of(reader, row) == OTHER_STEP


@pytest.mark.parametrize(
    "row",
    [
        {},
        {"fingerprint": None},
        {"step": None},
        {"step": "exec-2/idem-9/other-step"},
        {"step": ["exec-2", "idem-9"]},
        {"step": ["exec-2", "idem-9", "other-step", "extra"]},
        {"step": ["exec-2", "", "other-step"]},
        {"step": ["exec-2", 9, "other-step"]},
        {"step": {"execution_id": "exec-2"}},
        {"step_execution_id": None, "step_idempotency_key": "i", "step_name": "n"},
        {"step_execution_id": "e", "step_idempotency_key": None, "step_name": "n"},
        {"fingerprint": 5, "step": ["e", "i", "n"]},
    ],
)
def test_a_garbage_row_is_never_trusted(row: dict[str, Any]) -> None:
    with pytest.raises(CorruptStoredRowError) as corrupt:
        replayed_from_of(key(), row)
    assert corrupt.value.code == "store.corrupt-row"


def test_stored_facts_without_a_step_are_corrupt() -> None:
    with pytest.raises(CorruptStoredRowError):
        replayed_from_of(key(), StoredKeyFacts(None, None))


# attempt owners and outbound calls


@pytest.mark.parametrize(
    ("tenant", "execution", "epoch"),
    [("tenant-1", "exec-1", 3), ('a","b', "c", 1), ("[", "]", 0), ("ключ", "\\", 2**40)],
)
def test_an_attempt_owner_round_trips(tenant: str, execution: str, epoch: int) -> None:
    owner = attempt_owner_of(key(tenant=tenant, execution=execution, epoch=epoch))
    assert parse_attempt_owner(owner) == AttemptOwner(tenant, execution, epoch)


def test_attempt_owners_of_different_leases_differ() -> None:
    owners = {
        attempt_owner_of(key(tenant=t, execution=e, epoch=n))
        for t, e in itertools.product(TRICKY[:6], repeat=2)
        for n in (1, 2)
    }
    assert len(owners) == 6 * 6 * 2


@pytest.mark.parametrize(
    "owner",
    [
        "",
        "instance-1",
        "not json",
        "null",
        "[]",
        '["t", "e"]',
        '["t", "e", 1, 2]',
        '["t", "e", "1"]',
        '["t", "e", 1.5]',
        '["t", "e", true]',
        '["t", 2, 1]',
        '{"t": 1, "e": 2, "n": 3}',
        '"abc"',
    ],
)
def test_an_owner_that_is_not_a_lease_parses_to_none(owner: str) -> None:
    assert parse_attempt_owner(owner) is None


def test_pending_outbound_call_of_is_the_intent_pending_at_attempt_zero() -> None:
    built = key("pay", business_key="order-7", fingerprint="fp")
    call = pending_outbound_call_of(built, {"amount": 5}, 1_000)
    assert call.key_identity == fenced_key_identity_of(built)
    assert call.business_identity == business_identity_of(built)
    assert (call.tenant_id, call.name, call.intent) == ("tenant-1", "pay", {"amount": 5})
    assert (call.status, call.attempt, call.attempt_owner) == (
        OutboundCallStatus.PENDING,
        0,
        attempt_owner_of(built),
    )
    assert (call.lease_execution_id, call.token, call.fingerprint, call.step) == (
        "exec-1",
        3,
        "fp",
        STEP,
    )
    assert (call.recorded_at, call.updated_at, call.response, call.error) == (
        1_000,
        1_000,
        None,
        None,
    )
    assert call.attempt_ref.attempt_owner == attempt_owner_of(built)


def test_a_step_keyed_call_has_no_business_identity() -> None:
    assert pending_outbound_call_of(key("pay"), None, 0).business_identity is None


def test_identifiers_never_end_with_a_space() -> None:
    """MySQL compares "e" and "e " as equal: such identifiers are refused everywhere."""
    import pytest

    from agboss_sql.contracts.errors import InvalidIdentifierError
    from agboss_sql.contracts.keys import checked_identifier

    assert checked_identifier("tenant_id", " e") == " e"
    with pytest.raises(InvalidIdentifierError, match="must not end with a space"):
        checked_identifier("tenant_id", "e ")
