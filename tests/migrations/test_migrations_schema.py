"""The migrations on the database under test: the schema they create, their version
table, and several instances upgrading at once."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from migration_support import (
    connected,
    drop_every_table,
    schema_difference,
    table_names,
    upgrade_in_process,
    version_rows,
)
from sqlalchemy.ext.asyncio import create_async_engine
from support.capabilities import column_compression, embedded_url

from agboss_sql.lab.business import business_metadata
from agboss_sql.sql import migrate
from agboss_sql.sql.connection import normalize_url
from agboss_sql.sql.schema import metadata

pytestmark = pytest.mark.database

OUR_TABLES = set(metadata.tables)


def test_upgrade_downgrade_upgrade_round_trips(empty_url: str) -> None:
    head = migrate.head()

    assert migrate.upgrade(empty_url) == migrate.Migration(None, head)
    assert table_names(empty_url) == OUR_TABLES | {migrate.VERSION_TABLE}
    assert migrate.current(empty_url) == head

    assert migrate.downgrade(empty_url, "base") == migrate.Migration(head, None)
    assert table_names(empty_url) == {migrate.VERSION_TABLE}
    assert migrate.current(empty_url) is None

    assert migrate.upgrade(empty_url) == migrate.Migration(None, head)
    assert table_names(empty_url) == OUR_TABLES | {migrate.VERSION_TABLE}
    assert schema_difference(empty_url) == []


LZ4_COLUMNS = {
    ("agboss_checkpoint_blobs", "value"),
    ("agboss_checkpoint_writes", "value"),
    ("agboss_checkpoints", "checkpoint"),
}


def _compression(url: str) -> dict[tuple[str, str], str]:
    """PostgreSQL: the compression method of each of the saver's value columns ('' default,
    'l' lz4, 'p' pglz)."""
    with connected(url) as connection:
        rows = connection.execute(
            sa.text(
                "SELECT c.relname, a.attname, a.attcompression FROM pg_attribute a"
                " JOIN pg_class c ON c.oid = a.attrelid"
                " WHERE c.relname IN ('agboss_checkpoint_blobs', 'agboss_checkpoint_writes',"
                " 'agboss_checkpoints') AND a.attname IN ('value', 'checkpoint')"
            )
        ).all()
    return {(table, column): str(method) for table, column, method in rows}


def test_the_saver_values_are_compressed_with_lz4_on_postgresql(empty_url: str) -> None:
    """PostgreSQL with lz4: the migrations and `metadata.create_all` set the saver's value
    columns to lz4, and the downgrade sets them back; elsewhere nothing is asked."""
    if not column_compression(empty_url):
        pytest.skip("column compression is PostgreSQL's")
    with connected(empty_url) as connection:
        has_lz4 = connection.execute(
            sa.text(
                "SELECT 'lz4' = ANY(enumvals) FROM pg_settings"
                " WHERE name = 'default_toast_compression'"
            )
        ).scalar()
    if not has_lz4:
        pytest.skip("this server has no lz4")

    migrate.upgrade(empty_url, "0007_mesh_tenant_keys")
    assert set(_compression(empty_url).values()) == {""}
    migrate.upgrade(empty_url)
    assert _compression(empty_url) == dict.fromkeys(LZ4_COLUMNS, "l")
    migrate.downgrade(empty_url, "0007_mesh_tenant_keys")
    assert _compression(empty_url) == dict.fromkeys(LZ4_COLUMNS, "p")

    drop_every_table(empty_url)
    engine = sa.create_engine(migrate.sync_url(empty_url))
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()
    assert _compression(empty_url) == dict.fromkeys(LZ4_COLUMNS, "l")


def test_the_appended_values_column_is_not_dropped_while_an_append_is_stored(
    empty_url: str,
) -> None:
    """0009's downgrade would lose the values stored as appends: it refuses while one is
    stored, and drops the column once none is."""
    migrate.upgrade(empty_url)
    row = {
        "thread_hash": "t" * 64,
        "ns_hash": "n" * 64,
        "channel_hash": "c" * 64,
        "version": "2",
        "value_type": "msgpack",
        "value": b"\x91\x01",
        "base_version": "1",
    }
    insert = sa.text(
        "INSERT INTO agboss_checkpoint_blobs (thread_hash, ns_hash, channel_hash, version,"
        " value_type, value, base_version) VALUES (:thread_hash, :ns_hash, :channel_hash,"
        " :version, :value_type, :value, :base_version)"
    )
    with connected(empty_url) as connection:
        connection.execute(insert, row)
        connection.commit()
    with pytest.raises(RuntimeError, match="holds appended values"):
        migrate.downgrade(empty_url, "0008_lz4_values")
    assert migrate.current(empty_url) == migrate.head()

    with connected(empty_url) as connection:
        connection.execute(sa.text("DELETE FROM agboss_checkpoint_blobs"))
        connection.commit()
    migrate.downgrade(empty_url, "0008_lz4_values")
    with connected(empty_url) as connection:
        columns = sa.inspect(connection).get_columns("agboss_checkpoint_blobs")
    assert "base_version" not in {column["name"] for column in columns}
    migrate.upgrade(empty_url)


def test_upgrade_at_head_does_nothing(empty_url: str) -> None:
    migrate.upgrade(empty_url)

    done = migrate.upgrade(empty_url)

    assert done == migrate.Migration(migrate.head(), migrate.head())
    assert not done.changed
    assert version_rows(empty_url) == [migrate.head()]


def test_autogenerate_finds_no_difference_after_upgrade(empty_url: str) -> None:
    # Tables that are not the project's (the conformance suite's business rows, an
    # application's own) are no difference either.
    with connected(empty_url) as connection, connection.begin():
        business_metadata.create_all(connection)
        connection.exec_driver_sql("CREATE TABLE app_orders (id INTEGER PRIMARY KEY)")

    migrate.upgrade(empty_url)

    assert schema_difference(empty_url) == []


def test_the_comparison_sees_a_schema_that_differs(empty_url: str) -> None:
    # Proves the test above can fail: a missing table, index and column are found.
    migrate.upgrade(empty_url)
    with connected(empty_url) as connection, connection.begin():
        context = MigrationContext.configure(connection)
        op = Operations(context)
        op.drop_table("agboss_execution_ids")
        op.drop_index(
            "ix_agboss_execution_records_status_updated_at", table_name="agboss_execution_records"
        )
        with op.batch_alter_table("agboss_mesh_requests") as batch:
            batch.drop_column("response")

    found = {(diff[0], _subject(diff)) for diff in schema_difference(empty_url)}

    assert found == {
        ("add_table", "agboss_execution_ids"),
        ("add_index", "ix_agboss_execution_records_status_updated_at"),
        ("add_column", "response"),
    }


def _subject(diff: Any) -> str:
    kind = diff[0]
    if kind == "add_table":
        return str(diff[1].name)
    if kind == "add_index":
        return str(diff[1].name)
    if kind == "add_column":
        return str(diff[3].name)
    return repr(diff)


def test_the_history_lives_in_its_own_version_table(empty_url: str) -> None:
    migrate.upgrade(empty_url)

    assert version_rows(empty_url) == [migrate.head()]
    assert "alembic_version" not in table_names(empty_url)


def test_an_applications_own_alembic_project_is_untouched(empty_url: str) -> None:
    with connected(empty_url) as connection, connection.begin():
        connection.exec_driver_sql(
            "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"
        )
        connection.exec_driver_sql("INSERT INTO alembic_version VALUES ('app0042')")

    migrate.upgrade(empty_url)
    assert version_rows(empty_url, "alembic_version") == ["app0042"]
    assert version_rows(empty_url) == [migrate.head()]

    migrate.downgrade(empty_url, "base")
    assert version_rows(empty_url, "alembic_version") == ["app0042"]
    assert "alembic_version" in table_names(empty_url)


def test_upgrade_on_a_callers_connection_commits_it(empty_url: str) -> None:
    with connected(empty_url) as connection:
        done = migrate.upgrade_on(connection)

        assert done == migrate.Migration(None, migrate.head())
        assert not connection.in_transaction()
    # Seen from another connection: committed.
    assert migrate.current(empty_url) == migrate.head()
    assert schema_difference(empty_url) == []


async def test_upgrade_on_an_async_connection_through_run_sync(empty_url: str) -> None:
    engine = create_async_engine(normalize_url(empty_url), poolclass=sa.NullPool)
    try:
        async with engine.connect() as connection:
            done = await connection.run_sync(migrate.upgrade_on)
    finally:
        await engine.dispose()

    assert done == migrate.Migration(None, migrate.head())
    assert migrate.current(empty_url) == migrate.head()


def test_upgrade_on_refuses_a_connection_in_a_transaction(empty_url: str) -> None:
    with connected(empty_url) as connection, connection.begin():
        with pytest.raises(ValueError, match="in a transaction"):
            migrate.upgrade_on(connection)
    assert migrate.current(empty_url) is None


def _spawn_upgrades(url: str, count: int, *, locked: bool) -> list[tuple[Any, ...]]:
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(count)
    results: Any = spawn.Queue()
    processes = [
        spawn.Process(target=upgrade_in_process, args=(url, barrier, results, locked))
        for _ in range(count)
    ]
    for process in processes:
        process.start()
    try:
        answers = [results.get(timeout=120) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    return answers


def test_concurrent_upgrades_take_turns(empty_url: str) -> None:
    head = migrate.head()

    answers = _spawn_upgrades(empty_url, 4, locked=True)

    # One process migrated; the three that waited for the lock found the schema at head.
    assert sorted(answers, key=repr) == sorted(
        [("ok", None, head)] + [("ok", head, head)] * 3, key=repr
    )
    assert version_rows(empty_url) == [head]
    assert table_names(empty_url) == OUR_TABLES | {migrate.VERSION_TABLE}
    assert schema_difference(empty_url) == []


def test_concurrent_upgrades_without_the_lock_collide(empty_url: str) -> None:
    # The broken twin of the test above: with the lock replaced by a plain transaction,
    # the four processes all find no schema and all try to create it.
    answers = _spawn_upgrades(empty_url, 4, locked=False)

    failed = [answer for answer in answers if answer[0] == "error"]
    migrated = [answer for answer in answers if answer[:2] == ("ok", None)]
    assert failed or len(migrated) > 1, answers


def test_upgrade_waits_for_the_migration_lock(empty_url: str) -> None:
    spawn = multiprocessing.get_context("spawn")
    results: Any = spawn.Queue()
    calling = spawn.Event()
    with connected(empty_url) as holder:
        with migrate.migration_lock(holder):
            process = spawn.Process(
                target=upgrade_in_process, args=(empty_url, None, results, True, calling)
            )
            process.start()
            assert calling.wait(timeout=60)
            # An unlocked upgrade is done well within this (about 0.1 s).
            time.sleep(1.5)
            assert results.empty()
            assert migrate.current(empty_url) is None
        answer = results.get(timeout=60)
    process.join(timeout=30)

    assert answer == ("ok", None, migrate.head())


def test_sqlite_migration_keeps_the_callers_busy_timeout(empty_url: str) -> None:
    if not embedded_url(empty_url):
        pytest.skip("SQLite only: its lock wait is the connection's busy timeout")
    engine = sa.create_engine(
        migrate.sync_url(empty_url), poolclass=sa.NullPool, connect_args={"timeout": 2.5}
    )
    try:
        with engine.connect() as connection:
            migrate.upgrade_on(connection)
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 2500
    finally:
        engine.dispose()
