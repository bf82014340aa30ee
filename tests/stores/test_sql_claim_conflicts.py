"""A child claim that meets transient conflicts, on a server under test.

The conflicts are the server's own: a trigger on the queue table fails the claim's update
with the error a deadlock (MySQL family, 1213) or a serialization failure (PostgreSQL,
40001) raises, for the first N claim updates it sees (a count the failed statement's rollback
leaves alone). The store sees exactly what a real
conflict shows it, and the rows are the real rows.

- A claim run again after a conflict still takes the head of the queue (deepest first,
  then oldest): a retried claim is a claim, not a guess past the head. (On a cluster
  that certifies write sets a retry starts a few rows past the head by design, and the
  test holds it to that width.)
- On a cluster that certifies write sets, a claim goes on through more conflicts than
  the connection's attempts (claimers on other nodes keep taking the rows it picks), for
  the whole `Timeouts.retry_ms`.
- A claim whose every attempt conflicts ends, within `Timeouts.retry_ms` and the
  connection's attempts, in `StoreTimeoutError` (`what == "retry"`), and nothing of it was
  applied: the child is still queued at its attempt.

Each case runs on both claims: `claim` and a batch claim (`claim_many`, a batch of one),
whose retry and spread past the head are code of their own.

SQLite has no transient conflicts (a writer takes the database's write lock first).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import pytest
import sqlalchemy as sa
from support.capabilities import require, row_locks

from agboss_sql.contracts import (
    ApplicationContext,
    ClaimedChild,
    QueuedChild,
    StoreTimeoutError,
    VirtualClock,
)
from agboss_sql.sql import queue as queue_module
from agboss_sql.sql.connection import MAX_ATTEMPTS, SqlConnection
from agboss_sql.sql.migrate import sync_url
from agboss_sql.sql.queue import QUEUED, RUNNING, SqlChildExecutionQueueRepository
from agboss_sql.sql.schema import child_executions
from agboss_sql.sql.timeouts import Timeouts

TENANT = "tenant-1"
RETRY_MS = 2_000
BOUND_S = RETRY_MS / 1000 + 30
"""Bound of a claim that must give up: the connection stops after `MAX_ATTEMPTS` or
`RETRY_MS`; 30 s more for a loaded machine. A claim that never gives up runs past it."""

_TABLE = child_executions.name


@dataclass(frozen=True)
class _Faults:
    """The trigger's SQL on one server: what creates it, what removes it, what sets the
    failures to come (`{n}`) and restarts the count, and what reads the count."""

    create: tuple[str, ...]
    drop: tuple[str, ...]
    reset: tuple[str, ...]
    calls: str


# The count must survive the failed statement's rollback: a non-transactional table on the
# MySQL family (its sequences cannot restart on a Galera cluster), a sequence on PostgreSQL.
_MYSQL = _Faults(
    create=(
        "CREATE TABLE agboss_test_claim_faults "
        "(id INT PRIMARY KEY, n INT NOT NULL, calls INT NOT NULL) ENGINE=MyISAM",
        "INSERT INTO agboss_test_claim_faults VALUES (1, 0, 0)",
        f"""CREATE TRIGGER agboss_test_claim_fault BEFORE UPDATE ON {_TABLE} FOR EACH ROW
BEGIN
  IF OLD.status = '{QUEUED}' AND NEW.status = '{RUNNING}' THEN
    UPDATE agboss_test_claim_faults SET calls = calls + 1 WHERE id = 1;
    IF (SELECT calls <= n FROM agboss_test_claim_faults WHERE id = 1) THEN
      SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'forced deadlock';
    END IF;
  END IF;
END""",
    ),
    drop=(
        "DROP TRIGGER IF EXISTS agboss_test_claim_fault",
        "DROP TABLE IF EXISTS agboss_test_claim_faults",
    ),
    reset=("UPDATE agboss_test_claim_faults SET n = {n}, calls = 0 WHERE id = 1",),
    calls="SELECT calls FROM agboss_test_claim_faults WHERE id = 1",
)
_POSTGRESQL = _Faults(
    create=(
        "CREATE SEQUENCE agboss_test_claim_calls",
        "CREATE TABLE agboss_test_claim_faults (n INT NOT NULL)",
        "INSERT INTO agboss_test_claim_faults VALUES (0)",
        f"""CREATE FUNCTION agboss_test_claim_fault() RETURNS trigger AS $$
BEGIN
  IF OLD.status = '{QUEUED}' AND NEW.status = '{RUNNING}'
     AND nextval('agboss_test_claim_calls') <= (SELECT n FROM agboss_test_claim_faults) THEN
    RAISE EXCEPTION 'forced serialization failure' USING ERRCODE = '40001';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql""",
        f"""CREATE TRIGGER agboss_test_claim_fault BEFORE UPDATE ON {_TABLE}
FOR EACH ROW EXECUTE FUNCTION agboss_test_claim_fault()""",
    ),
    drop=(
        f"DROP TRIGGER IF EXISTS agboss_test_claim_fault ON {_TABLE}",
        "DROP FUNCTION IF EXISTS agboss_test_claim_fault()",
        "DROP TABLE IF EXISTS agboss_test_claim_faults",
        "DROP SEQUENCE IF EXISTS agboss_test_claim_calls",
    ),
    reset=(
        "ALTER SEQUENCE agboss_test_claim_calls RESTART",
        "UPDATE agboss_test_claim_faults SET n = {n}",
    ),
    # A sequence's last value, read without moving it.
    calls="SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM agboss_test_claim_calls",
)


class Faults:
    """The trigger installed on the database under test (removed by `remove`)."""

    def __init__(self, sql: SqlConnection, sql_url: str) -> None:
        # The DDL differs per server: asked here, in this one place.
        self.sql = _POSTGRESQL if sql.dialect_name == "postgresql" else _MYSQL
        self.certified = sql.capabilities.certified_writes
        self.engine = sa.create_engine(sync_url(sql_url))
        self._run(self.sql.drop)
        self._run(self.sql.create)

    def _run(self, statements: tuple[str, ...]) -> None:
        with self.engine.begin() as connection:
            for statement in statements:
                connection.exec_driver_sql(statement)

    def fail_next(self, n: int) -> None:
        """The next `n` claim updates fail; the count starts again."""
        self._run(tuple(s.format(n=int(n)) for s in self.sql.reset))

    def calls(self) -> int:
        """How many claim updates the trigger saw since the last `fail_next`."""
        with self.engine.connect() as connection:
            return int(connection.exec_driver_sql(self.sql.calls).scalar_one())

    def remove(self) -> None:
        self._run(self.sql.drop)
        self.engine.dispose()


Claim = Callable[[SqlChildExecutionQueueRepository, str], Awaitable[ClaimedChild | None]]


async def _claim_one(
    store: SqlChildExecutionQueueRepository, instance_id: str
) -> ClaimedChild | None:
    return await store.claim(instance_id)


async def _claim_a_batch_of_one(
    store: SqlChildExecutionQueueRepository, instance_id: str
) -> ClaimedChild | None:
    claimed = await store.claim_many(instance_id, 1)
    assert len(claimed) <= 1, claimed
    return claimed[0] if claimed else None


@pytest.fixture(params=[_claim_one, _claim_a_batch_of_one], ids=["claim", "claim_many"])
def take(request: pytest.FixtureRequest) -> Claim:
    """A claim of one child: by `claim`, or by `claim_many` (its own retry loop)."""
    claim: Claim = request.param
    return claim


@pytest.fixture
def faults(sql: SqlConnection, sql_url: str) -> Iterator[Faults]:
    require(row_locks(sql), "transient conflicts (SQLite has none)")
    installed = Faults(sql, sql_url)
    try:
        yield installed
    finally:
        installed.remove()


@pytest.fixture
async def queue(
    sql_url: str,
) -> AsyncIterator[tuple[SqlChildExecutionQueueRepository, VirtualClock]]:
    connection = SqlConnection(sql_url, timeouts=Timeouts(retry_ms=RETRY_MS))
    clock = VirtualClock(1_000_000)
    try:
        yield SqlChildExecutionQueueRepository(connection, clock, ApplicationContext("i-1")), clock
    finally:
        await connection.close()


async def test_a_claim_retried_after_a_conflict_takes_the_head_of_the_queue_or_near_it(
    take: Claim,
    faults: Faults,
    queue: tuple[SqlChildExecutionQueueRepository, VirtualClock],
) -> None:
    store, clock = queue
    ids = [f"child-{i:02d}" for i in range(12)]
    for child_id in ids:
        await store.enqueue(QueuedChild(TENANT, "root-1", "parent-1", child_id, 1, None))
        await clock.advance(10)
    certified = store.connection.capabilities.certified_writes
    # Five claims, each of whose first update fails. A retried claim is a claim: it takes
    # the oldest. On a cluster that certifies write sets it starts past the head on
    # purpose (claimers on other nodes keep taking the head), at most 4 x its retries
    # rows past it. (A retry past the head where that is not the design picks another
    # child four times in five.)
    left = list(ids)
    for _ in range(5):
        faults.fail_next(1)
        claimed = await asyncio.wait_for(take(store, "i-1"), BOUND_S)
        assert faults.calls() >= 2, "the conflict did not happen: the test proves nothing"
        assert claimed is not None and claimed.attempt == 1
        assert claimed.child_execution_id in left
        place = left.index(claimed.child_execution_id)
        assert place <= 4 if certified else place == 0, (claimed.child_execution_id, left)
        left.remove(claimed.child_execution_id)


async def test_a_claim_whose_every_attempt_conflicts_raises_a_typed_timeout_and_applies_nothing(
    take: Claim,
    faults: Faults,
    queue: tuple[SqlChildExecutionQueueRepository, VirtualClock],
) -> None:
    store, _clock = queue
    await store.enqueue(QueuedChild(TENANT, "root-1", "parent-1", "only", 1, None))
    faults.fail_next(1_000_000)
    with pytest.raises(StoreTimeoutError) as raised:
        await asyncio.wait_for(take(store, "i-1"), BOUND_S)
    assert raised.value.what == "retry"
    assert faults.calls() >= 2
    faults.fail_next(0)
    children = await store.children(TENANT, "parent-1")
    assert [(c.child_execution_id, c.status, c.attempt) for c in children] == [("only", QUEUED, 0)]
    # The conflicts gone, the same child is claimed at its first attempt.
    claimed = await take(store, "i-1")
    assert claimed is not None and (claimed.child_execution_id, claimed.attempt) == ("only", 1)


async def test_on_a_certifying_cluster_a_claim_outlasts_the_connections_attempts(
    take: Claim,
    faults: Faults,
    sql_url: str,
) -> None:
    require(faults.certified, "certified write sets (a Galera cluster)")
    # A bound long enough for the connection to give up once (its attempts back off to
    # 0.2 s each) and the claim to go on.
    connection = SqlConnection(sql_url, timeouts=Timeouts(retry_ms=30_000))
    try:
        store = SqlChildExecutionQueueRepository(
            connection, VirtualClock(1_000_000), ApplicationContext("i-1")
        )
        await store.enqueue(QueuedChild(TENANT, "root-1", "parent-1", "only", 1, None))
        faults.fail_next(MAX_ATTEMPTS + 2)
        claimed = await asyncio.wait_for(take(store, "i-1"), 30 + BOUND_S)
        assert faults.calls() == MAX_ATTEMPTS + 3
        assert claimed is not None and (claimed.child_execution_id, claimed.attempt) == ("only", 1)
    finally:
        await connection.close()


async def test_on_a_certifying_cluster_a_retried_claim_starts_at_most_four_rows_a_retry_past_the_head(
    take: Claim,
    faults: Faults,
    queue: tuple[SqlChildExecutionQueueRepository, VirtualClock],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require(faults.certified, "certified write sets (a Galera cluster)")
    store, clock = queue
    ids = [f"child-{i:02d}" for i in range(12)]
    for child_id in ids:
        await store.enqueue(QueuedChild(TENANT, "root-1", "parent-1", child_id, 1, None))
        await clock.advance(10)
    # The widest draw every time: the spread's bound itself, not a sample of it.
    monkeypatch.setattr(queue_module.random, "randrange", lambda n: n - 1)
    faults.fail_next(1)
    claimed = await asyncio.wait_for(take(store, "i-1"), BOUND_S)
    assert faults.calls() == 2
    assert claimed is not None and claimed.child_execution_id == ids[4]
