"""Revision 0012_checkpoint_id_order orders checkpoint ids by their exact characters on
PostgreSQL, whatever the database's default collation: on a database whose collation orders
`a1` before `B1` (ICU's `en-US`), a thread stored before it listed its checkpoints without
their pending writes and named another latest than SQLite and MySQL do; after it, the same
rows read back as on every database, and a downgrade gives the columns their old collation
back with nothing lost. On the other databases the revision changes nothing, and the same
answers hold before and after it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from migration_support import connected, drop_every_table, schema_difference, scratch_database
from sqlalchemy.engine import make_url

from agboss_sql.sql import migrate
from agboss_sql.sql.checkpoint import SqlCheckpointSaver

pytestmark = pytest.mark.database

BEFORE = "0011_wide_identities"
AFTER = "0012_checkpoint_id_order"
THREAD = {"configurable": {"thread_id": "ordered", "checkpoint_ns": ""}}
IDS = ("B1", "a1")
"""Stored in this order, each the parent of the next: code point order puts `a1` last
(`B` is 66, `a` 97), ICU's `en-US` puts it first (letters before case)."""


@pytest.fixture
def ordered_url(scratch_url: str) -> Iterator[tuple[str, bool]]:
    """(a database with no table, whether its collation orders `IDS` otherwise than code
    point order): on PostgreSQL a database of its own whose default collation is ICU's
    `en-US`; elsewhere the migration tests' scratch database."""
    url = make_url(scratch_url)
    if url.get_backend_name() != "postgresql":
        drop_every_table(scratch_url)
        yield scratch_url, False
        return
    with connected(scratch_url) as connection:
        icu = connection.exec_driver_sql(
            "SELECT 1 FROM pg_collation WHERE collname = 'en-US-x-icu'"
        ).first()
        if icu is None or connection.dialect.server_version_info < (15,):
            pytest.skip("this PostgreSQL server has no ICU collations (PostgreSQL 15+)")
    icu_en_us = " TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
    with scratch_database(scratch_url, f"{url.database}_ordered", icu_en_us) as ordered:
        yield ordered, True


def _store(url: str) -> None:
    with SqlCheckpointSaver.from_conn_string(url) as saver:
        config: Any = THREAD
        for checkpoint_id in IDS:
            checkpoint = empty_checkpoint()
            checkpoint["id"] = checkpoint_id
            config = saver.put(config, checkpoint, {"step": 1}, {})
            saver.put_writes(config, [("channel", f"by {checkpoint_id}")], f"task {checkpoint_id}")


def _read(url: str) -> tuple[str, list[tuple[str, list[Any]]], list[str]]:
    """(the latest id, every checkpoint listed with its pending writes, those before `a1`)."""
    with SqlCheckpointSaver.from_conn_string(url) as saver:
        latest = saver.get_tuple(THREAD)
        assert latest is not None
        listed = [
            (found.config["configurable"]["checkpoint_id"], list(found.pending_writes or []))
            for found in saver.list(THREAD)
        ]
        before = [
            found.config["configurable"]["checkpoint_id"]
            for found in saver.list(
                THREAD, before={"configurable": {**THREAD["configurable"], "checkpoint_id": "a1"}}
            )
        ]
        return latest.config["configurable"]["checkpoint_id"], listed, before


EXACT = (
    "a1",
    [("a1", [("task a1", "channel", "by a1")]), ("B1", [("task B1", "channel", "by B1")])],
    ["B1"],
)


def test_ids_are_ordered_by_their_characters_after_the_upgrade_and_nothing_is_lost(
    ordered_url: tuple[str, bool],
) -> None:
    url, collated = ordered_url
    migrate.upgrade(url, BEFORE)
    _store(url)
    latest, listed, _ = _read(url)
    if collated:
        # What this revision mends: the database's order, and a page's range of ids for its
        # pending writes computed in code point order, so none was read.
        assert latest == "B1"
        assert listed == [("B1", []), ("a1", [])]
    else:
        assert (latest, listed) == EXACT[:2]

    migrate.upgrade(url)
    assert migrate.current(url) == AFTER
    assert _read(url) == EXACT
    assert schema_difference(url) == []

    migrate.downgrade(url, BEFORE)
    assert migrate.current(url) == BEFORE
    latest, listed, _ = _read(url)
    assert sorted(found for found, _ in listed) == sorted(IDS)  # every checkpoint still there
    if not collated:
        assert (latest, listed) == EXACT[:2]
    migrate.upgrade(url)
    assert _read(url) == EXACT
