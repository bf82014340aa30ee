"""The claimed child built from a claim's row without `ClaimedChild.__init__` is the one the
constructor builds: every field, in `CLAIMED`'s order."""

from __future__ import annotations

import dataclasses

from agboss_sql.contracts.types import ClaimedChild
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
