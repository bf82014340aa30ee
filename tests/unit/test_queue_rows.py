"""The claimed child built from a claim's row without `ClaimedChild.__init__` is the one the
constructor builds: every field, in `CLAIMED`'s order."""

from __future__ import annotations

import dataclasses

import pytest
from pytest import MonkeyPatch

from agboss_sql.contracts.types import ClaimedChild
from agboss_sql.sql import _queue_rows
from agboss_sql.sql._queue_rows import CLAIMED, claimed_child, claimed_of


def test_a_claimed_row_makes_the_child_the_constructor_makes() -> None:
    row = ("t", "root", "parent", "child", 3, '{"k": [1, 2]}', 7, "w1", 123, 9)
    built = claimed_of(row)  # the columns after CLAIMED's (queued_at, id) are ignored
    assert built == ClaimedChild("t", "root", "parent", "child", 3, {"k": [1, 2]}, 7, "w1")
    assert type(built) is ClaimedChild
    assert [getattr(built, f.name) for f in dataclasses.fields(ClaimedChild)] == [
        "t",
        "root",
        "parent",
        "child",
        3,
        {"k": [1, 2]},
        7,
        "w1",
    ]
    assert claimed_of(("t", "r", "p", "c", 0, None, 1, "w")).payload is None


def test_the_fast_build_sets_each_field_from_its_own_argument() -> None:
    values = [f"v{i}" for i in range(len(CLAIMED))]
    built = claimed_child(*values)
    assert built == ClaimedChild(*values)
    assert hash(built) == hash(ClaimedChild(*values))
    assert repr(built) == repr(ClaimedChild(*values))


def test_the_slot_setters_load_only_for_the_claims_columns(monkeypatch: MonkeyPatch) -> None:
    """The module's check that `ClaimedChild` is built by its slots alone refuses a class
    whose fields are not `CLAIMED`'s, and one with a `__post_init__`, each on its own.

    A project test: the check runs once, when the module loads, and no store call reaches it
    (mutation testing: `_slot_setters__mutmut_4`, `_5`, docs/mutation.md)."""
    assert len(_queue_rows._slot_setters()) == len(CLAIMED)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked(ClaimedChild):
        def __post_init__(self) -> None:
            pass

    monkeypatch.setattr(_queue_rows, "ClaimedChild", Checked)
    with pytest.raises(AssertionError, match="not the claim's columns"):
        _queue_rows._slot_setters()

    @dataclasses.dataclass(frozen=True, slots=True)
    class Wider(ClaimedChild):
        note: str = ""

    monkeypatch.setattr(_queue_rows, "ClaimedChild", Wider)
    with pytest.raises(AssertionError, match="not the claim's columns"):
        _queue_rows._slot_setters()
