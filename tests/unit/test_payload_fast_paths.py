"""The stores' JSON helpers answer a `None` payload without the encoder (it is every batch
finish's outcome) exactly as the payload rule does, and read `null` back as `None`."""

from __future__ import annotations

from agboss_sql.contracts._number_rules import payload_text
from agboss_sql.sql._base import dumps, loads


def test_none_is_stored_as_the_payload_rule_writes_it() -> None:
    assert dumps(None) == payload_text("the payload", None) == "null"


def test_null_is_read_back_as_none_whatever_its_type() -> None:
    for text in ("null", b"null", None):
        assert loads(text) is None
    assert loads('"null"') == "null"  # the string "null" is not the value null
    assert loads("[null]") == [None]
