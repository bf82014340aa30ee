"""The rules of `contracts.rules` and the key text rules of `contracts.keys`, on their own:
every store calls these, so each branch is pinned here once."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agboss_sql.contracts import (
    ExecutionContext,
    ExecutionLease,
    FencedEffectKey,
    InvalidFingerprintError,
    InvalidIdentifierError,
    InvalidStepError,
    LeaseState,
    StepRef,
    checked_fingerprint,
    checked_identifier,
    checked_step,
    fenced_effect_key_of,
    scope_key_of,
)
from agboss_sql.contracts.limits import (
    MAX_FINGERPRINT_LENGTH,
    MAX_IDEMPOTENCY_KEY_LENGTH,
    MAX_STEP_NAME_LENGTH,
)
from agboss_sql.contracts.rules import (
    FenceRefusal,
    LeaseClosedReason,
    checked_count,
    checked_fenced_key,
    checked_int,
    checked_lease,
    checked_positive_ms,
    checked_time,
    checked_token,
    fence_refusal_of,
    lease_state_at,
)

LIVE_ROW: dict[str, Any] = {
    "holder": "instance-1",
    "epoch": 3,
    "granted_to": "instance-1",
    "released": False,
    "yielded": False,
    "finished": False,
    "closed_reason": None,
    "expires_at": 1_000,
    "now": 999,
    "mark": 3,
}


def _refusal(token: int = 3, **change: Any) -> FenceRefusal | None:
    return fence_refusal_of(token, **{**LIVE_ROW, **change})


def test_the_refusal_vocabulary_is_the_one_the_errors_carry() -> None:
    assert {reason.value for reason in FenceRefusal} == {
        "lease-absent",
        "superseded",
        "token-not-granted",
        "finished",
        "released",
        "yielded",
        "expired",
        "mark-above-token",
    }
    assert FenceRefusal.SUPERSEDED == "superseded"
    assert FenceRefusal.SUPERSEDED.value == LeaseClosedReason.SUPERSEDED


def test_a_held_live_lease_at_its_token_is_not_refused() -> None:
    assert _refusal() is None
    assert _refusal(mark=None) is None
    assert _refusal(mark=2) is None


@pytest.mark.parametrize(
    ("token", "change", "reason"),
    [
        (2, {}, FenceRefusal.SUPERSEDED),
        (4, {}, FenceRefusal.TOKEN_NOT_GRANTED),
        (3, {"finished": True, "released": True}, FenceRefusal.FINISHED),
        (3, {"released": True}, FenceRefusal.RELEASED),
        (3, {"released": True, "closed_reason": "superseded"}, FenceRefusal.SUPERSEDED),
        (3, {"released": True, "closed_reason": "released"}, FenceRefusal.RELEASED),
        (3, {"yielded": True}, FenceRefusal.YIELDED),
        (3, {"now": 1_000}, FenceRefusal.EXPIRED),
        (3, {"now": 1_001}, FenceRefusal.EXPIRED),
        (3, {"mark": 4}, FenceRefusal.MARK_ABOVE_TOKEN),
        # The first reason in the documented order wins.
        (2, {"finished": True, "now": 5_000, "mark": 9}, FenceRefusal.SUPERSEDED),
        (3, {"yielded": True, "now": 5_000}, FenceRefusal.YIELDED),
        (3, {"now": 5_000, "mark": 9}, FenceRefusal.EXPIRED),
        # An epoch granted to another instance (a key built by hand) is superseded, before
        # anything the lease became since; a token above the epoch is still never granted.
        (3, {"granted_to": "instance-2"}, FenceRefusal.SUPERSEDED),
        (
            3,
            {"granted_to": "instance-2", "finished": True, "released": True},
            FenceRefusal.SUPERSEDED,
        ),
        (3, {"granted_to": "instance-2", "released": True}, FenceRefusal.SUPERSEDED),
        (3, {"granted_to": "instance-2", "yielded": True}, FenceRefusal.SUPERSEDED),
        (3, {"granted_to": "instance-2", "now": 5_000, "mark": 9}, FenceRefusal.SUPERSEDED),
        (4, {"granted_to": "instance-2"}, FenceRefusal.TOKEN_NOT_GRANTED),
    ],
)
def test_each_refusal(token: int, change: dict[str, Any], reason: FenceRefusal) -> None:
    assert _refusal(token, **change) is reason


@pytest.mark.parametrize(
    ("token", "row", "state", "close"),
    [
        (1, {"epoch": None}, LeaseState.ABSENT, False),
        (4, {}, LeaseState.ABSENT, False),
        (2, {}, LeaseState.SUPERSEDED, False),
        (3, {"finished": True, "released": True}, LeaseState.FINISHED, False),
        (3, {"released": True, "closed_reason": "superseded"}, LeaseState.SUPERSEDED, False),
        (3, {"released": True, "closed_reason": "released"}, LeaseState.RELEASED, False),
        (3, {"now": 1_000}, LeaseState.SUPERSEDED, True),
        (3, {"now": 999}, LeaseState.LIVE, False),
    ],
)
def test_each_lease_state(token: int, row: dict[str, Any], state: LeaseState, close: bool) -> None:
    fields = {
        k: v
        for k, v in {**LIVE_ROW, **row}.items()
        if k not in ("holder", "granted_to", "yielded", "mark")
    }
    found = lease_state_at(token, **fields)
    assert (found.state, found.close) == (state, close)


@pytest.mark.parametrize("bad", [True, 1.0, "1", None])
def test_numbers_are_ints_not_bools(bad: object) -> None:
    for check in (checked_int, checked_count, checked_positive_ms, checked_time):
        with pytest.raises(ValueError, match="what"):
            check("what", bad)
    with pytest.raises(ValueError):
        checked_token(bad)


def test_number_bounds() -> None:
    assert checked_int("n", -5) == -5
    assert checked_int("n", 5, minimum=5) == 5
    with pytest.raises(ValueError, match=">= 6"):
        checked_int("n", 5, minimum=6)
    assert checked_count("n", 0) == 0
    with pytest.raises(ValueError):
        checked_count("n", -1)
    assert checked_positive_ms("n", 1) == 1
    for bad in (0, -1):
        with pytest.raises(ValueError, match="positive"):
            checked_positive_ms("n", bad)
    assert checked_time("t", -1) == -1
    assert checked_token(0) == 0


@pytest.mark.parametrize("text", ["a\x00b", "\ud800", "x\udfff"])
def test_identifiers_refuse_what_no_database_stores(text: str) -> None:
    with pytest.raises(InvalidIdentifierError):
        checked_identifier("id", text)


def test_identifiers_keep_any_other_text() -> None:
    for text in ("a", "é-ü-漢字-🙂", "tab\there", "x" * 255):
        assert checked_identifier("id", text) == text


GOOD_STEP = StepRef("exec-1", "step-1", "charge-step")


@pytest.mark.parametrize(
    "step",
    [
        ("exec-1", "step-1", "charge-step"),
        None,
        StepRef("", "step-1", "n"),
        StepRef("exec-1 ", "step-1", "n"),
        StepRef("x" * 256, "step-1", "n"),
        StepRef("exec-1", "", "n"),
        StepRef("exec-1", "step-1", ""),
        StepRef("exec-1", 7, "n"),  # type: ignore[arg-type]
        StepRef("exec-1", "a\x00", "n"),
        StepRef("exec-1", "step-1", "\ud800"),
    ],
)
def test_a_step_a_row_could_not_give_back_is_refused(step: object) -> None:
    with pytest.raises(InvalidStepError, match="a step is a StepRef"):
        checked_step(step)


def test_a_step_of_any_storable_texts_is_kept() -> None:
    assert checked_step(GOOD_STEP) is GOOD_STEP
    long = StepRef("e", "k" * MAX_IDEMPOTENCY_KEY_LENGTH, " spaced name " * 1000)
    assert checked_step(long) is long


@pytest.mark.parametrize(
    ("step", "limit"),
    [
        (
            StepRef("e", "k" * (MAX_IDEMPOTENCY_KEY_LENGTH + 1), "name"),
            "MAX_IDEMPOTENCY_KEY_LENGTH",
        ),
        (StepRef("e", "k", "n" * (MAX_STEP_NAME_LENGTH + 1)), "MAX_STEP_NAME_LENGTH"),
    ],
)
def test_a_step_text_over_its_limit_is_refused(step: StepRef, limit: str) -> None:
    with pytest.raises(InvalidStepError, match=limit) as refused:
        checked_step(step)
    assert refused.value.facts["limit"] == limit


@pytest.mark.parametrize("fingerprint", [5, b"fp", 1.5, ["fp"], "fp\x00", "\ud800"])
def test_a_fingerprint_that_is_not_a_storable_text_is_refused(fingerprint: object) -> None:
    with pytest.raises(InvalidFingerprintError, match="a fingerprint is None or a text"):
        checked_fingerprint(fingerprint)


def test_none_and_texts_are_fingerprints() -> None:
    for fingerprint in (None, "", "sha256:ab", "é", "f" * MAX_FINGERPRINT_LENGTH):
        assert checked_fingerprint(fingerprint) == fingerprint
    with pytest.raises(InvalidFingerprintError, match="MAX_FINGERPRINT_LENGTH"):
        checked_fingerprint("f" * (MAX_FINGERPRINT_LENGTH + 1))


def _lease() -> ExecutionLease:
    return ExecutionLease("tenant-1", "exec-1", "instance-1", 2, 1_000)


def _key() -> FencedEffectKey:
    lease = _lease()
    ctx = ExecutionContext("tenant-1", "exec-1", "exec-1", lease, GOOD_STEP)
    return fenced_effect_key_of(ctx, "charge", business_key="b-1", fingerprint="fp")


def test_building_a_key_checks_its_step_and_fingerprint() -> None:
    lease = _lease()
    ctx = ExecutionContext("tenant-1", "exec-1", "exec-1", lease, StepRef("exec-1", "", "n"))
    with pytest.raises(InvalidStepError):
        fenced_effect_key_of(ctx, "charge")
    good = dataclasses.replace(ctx, step=GOOD_STEP)
    with pytest.raises(InvalidFingerprintError):
        fenced_effect_key_of(good, "charge", fingerprint=5)  # type: ignore[arg-type]


def test_a_fenced_key_is_checked_whole() -> None:
    key = _key()
    assert checked_fenced_key(key) is key
    assert key.scope_key == scope_key_of("tenant-1", "exec-1")
    hand: Any = dataclasses.replace
    bad: list[tuple[FencedEffectKey, type[Exception]]] = [
        (hand(key, step=GOOD_STEP.__class__("exec-1", "", "n")), InvalidStepError),
        (hand(key, fingerprint=5), InvalidFingerprintError),
        (hand(key, scope_key="other"), InvalidIdentifierError),
        (hand(key, lease_execution_id="exec-2"), InvalidIdentifierError),
        (hand(key, token="2"), ValueError),
        (hand(key, tenant_id=""), InvalidIdentifierError),
    ]
    for wrong, error in bad:
        with pytest.raises(error):
            checked_fenced_key(wrong)
    with pytest.raises(TypeError):
        checked_fenced_key(("tenant-1", "exec-1"))


def test_a_lease_handed_back_is_checked() -> None:
    lease = _lease()
    assert checked_lease(lease) is lease
    hand: Any = dataclasses.replace
    for wrong, error in (
        (hand(lease, lease_epoch="2"), ValueError),
        (hand(lease, lease_epoch=True), ValueError),
        (hand(lease, execution_id=""), InvalidIdentifierError),
        (hand(lease, tenant_id=None), InvalidIdentifierError),
        (("tenant-1", "exec-1", 2), TypeError),
    ):
        with pytest.raises(error):
            checked_lease(wrong)
