"""Network faults between a pod and its database server end in typed errors within bounds.

Each test stands a `TcpProxy` between one pod's `SqlConnection` and the server under test
(PostgreSQL or MySQL/MariaDB; SQLite has no network, and its equivalents live with the
fault suite), then black-holes, drops, slows or cuts that pod's connections at a chosen
point. A direct connection (not through the proxy) sets up and audits from the database.

What each test pins:

- a black-holed connection inside a fenced effect, during a lease renewal, while
  connecting, and right after COMMIT each ends in a typed error within its `Timeouts`
  bound, and nothing of a failed call was applied unless the error says the outcome is
  unknown;
- dropped connections surface as `StoreUnavailableError`, never as a driver error;
- latency slows calls down and changes no answer;
- a takeover blocked on a partitioned session's row lock ends in
  `StoreTimeoutError(what="lock")` within `lock_ms`;
- the ambiguous commit, both ways (the COMMIT lost, or only its reply lost):
  `CommitOutcomeUnknownError`, then the same fenced effect replays the stored result if
  the first commit landed and runs the work once if it did not (business rows counted);
- eight calls waiting on one tree's row lock do not hold up the pod's lease renewals and
  takes (reserved lane); a business call finding the pool exhausted ends in
  `StoreTimeoutError(what="pool")` within `pool_ms`;
- `asyncio.wait_for` around a stuck call returns promptly.

Upper bounds carry `SLACK_MS`: the machine running these is small and shared, so a bound
is checked loosely; what the checks catch is a wait of tens of seconds or minutes, which
is what an unbounded wait becomes. No lower bound on wall-clock time is asserted.
Every time-to-error is recorded; `AGBOSS_NETWORK_FIGURES=<file>` appends them as JSON
lines, and they are printed at the end of the module (`-s` shows them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection
from support.capabilities import lock_waits_in_whole_seconds, proxied_network_path
from support.sql import lock_waits_sql

from agboss_sql.contracts import (
    AgbossError,
    ApplicationContext,
    CommitOutcomeUnknownError,
    ExecutionContext,
    ExecutionLease,
    FencedEffectKey,
    StepRef,
    StoreClock,
    StoreTimeoutError,
    StoreUnavailableError,
    VirtualClock,
    fenced_effect_key_of,
)
from agboss_sql.lab.database import (
    committed_business_rows,
    create_schema,
    insert_business_row,
    truncate_all,
)
from agboss_sql.lab.faults.proxy import TcpProxy
from agboss_sql.sql.connection import SqlConnection
from agboss_sql.sql.effects import SqlFencedEffectRepository
from agboss_sql.sql.leases import SqlExecutionLeaseRepository
from agboss_sql.sql.schema import execution_leases
from agboss_sql.sql.timeouts import Timeouts

pytestmark = [pytest.mark.database, pytest.mark.faults]

T = TypeVar("T")

START = 1_700_000_000_000
LEASE_MS = 30_000
TENANT = "tenant-net"

# Loose on purpose (see the module): a small shared machine, a driver closing a socket, an
# event loop busy with other pods. An unbounded wait overshoots it by orders of magnitude.
SLACK_MS = 3_000

# Small bounds, so each fault ends fast. MariaDB's lock wait is whole seconds.
TIMEOUTS = Timeouts(connect_ms=800, statement_ms=800, lock_ms=1_000, pool_ms=600, retry_ms=2_000)

FIGURES: list[dict[str, Any]] = []
ABANDONED: list[asyncio.Future[Any]] = []  # hung calls, cancelled and left behind


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server_url(database_url: str) -> str:
    """The server under test, with a fresh schema; SQLite is skipped (no network)."""
    if not proxied_network_path(database_url):
        pytest.skip("network faults need a server database (SQLite's live in the fault suite)")
    create_schema(database_url, drop_first=True)
    return database_url


@pytest.fixture(scope="module", autouse=True)
def figures_table() -> Any:
    yield
    if FIGURES:
        print("\n" + figures_markdown(FIGURES))
    target = os.environ.get("AGBOSS_NETWORK_FIGURES")
    if target and FIGURES:
        with open(target, "a", encoding="utf-8") as out:
            for figure in FIGURES:
                out.write(json.dumps(figure) + "\n")
    FIGURES.clear()


@pytest.fixture
async def direct(server_url: str) -> AsyncIterator[SqlConnection]:
    """A connection around the proxy, for set-up and audit; every table emptied first."""
    connection = SqlConnection(server_url)
    await truncate_all(connection)
    yield connection
    await _closed(connection)


@pytest.fixture
async def proxy(server_url: str) -> AsyncIterator[TcpProxy]:
    async with TcpProxy.for_url(server_url) as running:
        yield running


class Pods:
    """Pods' connections (through the proxy or not) and their stores, on one virtual clock."""

    def __init__(self, server_url: str, proxy: TcpProxy) -> None:
        self.server_url = server_url
        self.proxy = proxy
        self.clock = VirtualClock(START)
        self.store_clock = StoreClock(self.clock)
        self.made: list[SqlConnection] = []

    def connection(
        self,
        timeouts: Timeouts = TIMEOUTS,
        *,
        proxied: bool = True,
        pool_size: int = 8,
        kind: type[SqlConnection] = SqlConnection,
    ) -> SqlConnection:
        url = self.proxy.url_for(self.server_url) if proxied else self.server_url
        made = kind(url, timeouts=timeouts, pool_size=pool_size)
        self.made.append(made)
        return made

    def leases(self, connection: SqlConnection, pod: str = "pod-1") -> SqlExecutionLeaseRepository:
        return SqlExecutionLeaseRepository(connection, self.store_clock, ApplicationContext(pod))

    def effects(
        self,
        connection: SqlConnection,
        pod: str = "pod-1",
        kind: type[SqlFencedEffectRepository] = SqlFencedEffectRepository,
    ) -> SqlFencedEffectRepository:
        return kind(connection, self.store_clock, ApplicationContext(pod))


@pytest.fixture
async def pods(server_url: str, proxy: TcpProxy, direct: SqlConnection) -> AsyncIterator[Pods]:
    made = Pods(server_url, proxy)
    yield made
    # The proxy goes first: whatever a pod still waits on through it then fails at once.
    await proxy.close()
    for connection in made.made:
        await _closed(connection)


async def _closed(connection: SqlConnection) -> None:
    # A close that fails or hangs must not hide the test's own outcome (nor hang it).
    task = asyncio.ensure_future(connection.close())
    done, _ = await asyncio.wait({task}, timeout=10)
    if done:
        task.exception()
    else:
        task.cancel()
        ABANDONED.append(task)


# --- helpers --------------------------------------------------------------------------------


def key_of(lease: ExecutionLease, step_key: str = "step-1") -> FencedEffectKey:
    ctx = ExecutionContext(
        tenant_id=lease.tenant_id,
        root_execution_id=lease.execution_id,
        execution_id=lease.execution_id,
        lease=lease,
        step=StepRef(lease.execution_id, step_key, "charge-step"),
    )
    return fenced_effect_key_of(ctx, "charge")


class Charge:
    """Work writing one business row in the effect's transaction; counts its runs. A
    `before` hook runs first, once (a fault switched on at that very point)."""

    def __init__(self, row: str = "charged", before: Callable[[], Awaitable[None]] | None = None):
        self.row = row
        self.runs = 0
        self.before = before  # on the first run only

    async def __call__(self, tx: AsyncConnection) -> dict[str, str]:
        self.runs += 1
        before, self.before = self.before, None
        if before is not None:
            await before()
        await insert_business_row(tx, self.row)
        return {"receipt": self.row}


def dialect_of(url: str) -> str:
    return make_url(url).get_backend_name()


def lock_bound_ms(url: str, lock_ms: int) -> int:
    """MySQL/MariaDB's lock wait is set in whole seconds (rounded up)."""
    if lock_waits_in_whole_seconds(url):
        return math.ceil(lock_ms / 1000) * 1000
    return lock_ms


class Hung(Exception):
    """The call gave no answer within the test's own cap: an unbounded wait."""


async def timed(call: Awaitable[Any], cap_s: float = 30) -> tuple[Any, BaseException | None, float]:
    """`(answer, error, elapsed ms)` of awaiting `call`. A call still waiting after `cap_s`
    is cancelled and abandoned (not awaited: a driver may hang in its own cancellation)
    with `Hung`, so an unbounded wait fails the test instead of hanging it."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    task = asyncio.ensure_future(call)
    done, _ = await asyncio.wait({task}, timeout=cap_s)
    elapsed = (loop.time() - started) * 1000
    if not done:
        task.cancel()
        ABANDONED.append(task)
        return None, Hung(f"no answer within {cap_s} s"), elapsed
    error = task.exception()
    if error is not None:
        return None, error, elapsed
    return task.result(), None, elapsed


async def must(call: Awaitable[T], what: str, cap_s: float = 30) -> T:
    """The answer of `call`, which must come within `cap_s` (a test step after a fault
    healed: a hang here is a connection or lock the fault left behind)."""
    answer, error, elapsed = await timed(call, cap_s)
    if error is not None:
        raise AssertionError(f"{what} failed after {elapsed:.0f} ms: {error!r}") from error
    return answer  # type: ignore[no-any-return]


def record(url: str, scenario: str, bound_ms: float, elapsed_ms: float, outcome: Any) -> None:
    if isinstance(outcome, BaseException):
        what = getattr(outcome, "what", None)
        outcome = type(outcome).__name__ + (f"({what})" if what else "")
    FIGURES.append(
        {
            "scenario": scenario,
            "database": dialect_of(url),
            "bound_ms": round(bound_ms),
            "elapsed_ms": round(elapsed_ms, 1),
            "outcome": str(outcome),
        }
    )


def figures_markdown(figures: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | database | bound ms | time-to-error ms | outcome |",
        "|---|---|---|---|---|",
    ]
    for f in figures:
        lines.append(
            f"| {f['scenario']} | {f['database']} | {f['bound_ms']} | {f['elapsed_ms']} "
            f"| {f['outcome']} |"
        )
    return "\n".join(lines)


def assert_within(elapsed_ms: float, bound_ms: float, what: str) -> None:
    assert elapsed_ms <= bound_ms + SLACK_MS, (
        f"{what} took {elapsed_ms:.0f} ms, past its bound of {bound_ms:.0f} ms "
        f"(+{SLACK_MS} ms slack)"
    )


def assert_typed(error: BaseException | None) -> None:
    """A store error of ours, never the driver's or SQLAlchemy's own."""
    assert error is not None, "the call should have failed"
    assert isinstance(error, AgbossError), (
        f"untyped error at the store's boundary: {type(error).__module__}."
        f"{type(error).__name__}: {error}"
    )


async def acquired(leases: SqlExecutionLeaseRepository, execution: str) -> ExecutionLease:
    lease = await must(leases.acquire(TENANT, execution, LEASE_MS), f"taking {execution}")
    assert lease is not None
    return lease


async def wait_for_lock_waiters(direct: SqlConnection, count: int, timeout_s: float) -> int:
    """Poll the server until `count` sessions of this database wait on a row lock of the
    lease table (or `timeout_s` passes); the number seen last."""
    query = lock_waits_sql(direct, "UPDATE agboss_execution_leases")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    seen = 0
    while True:
        seen = int((await direct.execute(query)).scalar() or 0)
        if seen >= count or loop.time() >= deadline:
            return seen
        await asyncio.sleep(0.02)  # polling a condition, bounded by the deadline


# --- pass, latency --------------------------------------------------------------------------


async def test_latency_changes_no_answer(pods: Pods, direct: SqlConnection) -> None:
    """50 ms each way on every chunk: every call still answers, and answers right."""
    pods.proxy.set_latency(50)
    pod = pods.connection()
    leases, effects = pods.leases(pod), pods.effects(pod)
    work = Charge()
    _, error, elapsed = await timed(_lease_and_effect(leases, effects, work))
    record(pods.server_url, "latency 50 ms: take + effect + renew", 0, elapsed, error or "ok")
    assert error is None, error
    assert work.runs == 1
    assert await committed_business_rows(direct) == ["charged"]


async def _lease_and_effect(
    leases: SqlExecutionLeaseRepository, effects: SqlFencedEffectRepository, work: Charge
) -> None:
    lease = await acquired(leases, "tree-latency")
    answer = await must(effects.save_result_if_absent(key_of(lease), work), "the effect")
    assert answer.value == {"receipt": "charged"} and not answer.replayed
    remaining = await must(leases.renew(lease, LEASE_MS), "a renewal")
    assert remaining is not None and remaining > 0


# --- black holes ----------------------------------------------------------------------------


async def test_blackhole_inside_fenced_effect(pods: Pods, direct: SqlConnection) -> None:
    """The pod's statement inside the effect's transaction is never answered: a statement
    timeout within `statement_ms`; nothing applied, so the retry runs the work (once)."""
    pod = pods.connection()
    leases, effects = pods.leases(pod), pods.effects(pod)
    lease = await acquired(leases, "tree-bh-effect")

    async def partition() -> None:
        pods.proxy.blackhole()

    work = Charge(before=partition)
    # Capped a little past the bound and its slack: the test must not wait 30 s to fail.
    _, error, elapsed = await timed(
        effects.save_result_if_absent(key_of(lease), work),
        cap_s=(TIMEOUTS.statement_ms + SLACK_MS) / 1000 + 2,
    )
    record(
        pods.server_url, "black hole inside a fenced effect", TIMEOUTS.statement_ms, elapsed, error
    )
    assert_typed(error)
    assert isinstance(error, StoreTimeoutError) and not isinstance(
        error, CommitOutcomeUnknownError
    ), error
    assert error.what == "statement"
    assert_within(elapsed, TIMEOUTS.statement_ms, "a black-holed statement")

    pods.proxy.pass_through()
    # The timed-out connection was closed by the pod: its server session rolled back (the
    # lease row's lock with it), so the retry goes through.
    answer = await must(
        effects.save_result_if_absent(key_of(lease), work), "the effect again, healed"
    )
    assert not answer.replayed
    assert work.runs == 2
    assert await committed_business_rows(direct) == ["charged"]


async def test_blackhole_during_lease_renew(pods: Pods, direct: SqlConnection) -> None:
    """A renewal sent into a black hole ends within `statement_ms`, typed: a timeout, or an
    unknown outcome (the write was sent); the next renewal, healed, answers."""
    pod = pods.connection()
    leases = pods.leases(pod)
    lease = await acquired(leases, "tree-bh-renew")
    pods.proxy.blackhole()
    _, error, elapsed = await timed(leases.renew(lease, LEASE_MS))
    record(
        pods.server_url, "black hole during a lease renew", TIMEOUTS.statement_ms, elapsed, error
    )
    assert_typed(error)
    assert isinstance(error, (StoreTimeoutError, CommitOutcomeUnknownError)), error
    assert_within(elapsed, TIMEOUTS.statement_ms, "a black-holed renewal")

    pods.proxy.pass_through()
    remaining = await must(leases.renew(lease, LEASE_MS), "a renewal")
    assert remaining is not None and remaining > 0


async def test_blackhole_while_connecting(pods: Pods, direct: SqlConnection) -> None:
    """A server that accepts and never answers: `StoreTimeoutError(what="connect")` within
    `connect_ms`."""
    pods.proxy.blackhole()
    pod = pods.connection()
    _, error, elapsed = await timed(pods.leases(pod).acquire(TENANT, "tree-bh-connect", LEASE_MS))
    record(pods.server_url, "black hole while connecting", TIMEOUTS.connect_ms, elapsed, error)
    assert_typed(error)
    assert isinstance(error, StoreTimeoutError), error
    assert error.what == "connect"
    assert_within(elapsed, TIMEOUTS.connect_ms, "a black-holed connect")
    rows = (await direct.execute(sa.select(execution_leases.c.execution_id))).rows
    assert rows == []


async def test_wait_for_around_a_stuck_call_returns_promptly(
    pods: Pods, direct: SqlConnection, request: pytest.FixtureRequest
) -> None:
    """With a long statement bound, the caller's own `asyncio.wait_for(…, 0.5)` around a
    black-holed effect returns in about half a second (the cancelled connection is closed,
    not cancelled through the same black hole), and the effect is not applied."""
    pod = pods.connection(Timeouts(statement_ms=30_000))
    leases, effects = pods.leases(pod), pods.effects(pod)
    lease = await acquired(leases, "tree-wait-for")

    async def partition() -> None:
        pods.proxy.blackhole()

    work = Charge(before=partition)
    _, error, elapsed = await timed(
        asyncio.wait_for(effects.save_result_if_absent(key_of(lease), work), 0.5)
    )
    record(pods.server_url, "wait_for(effect, 0.5 s) on a stuck call", 500, elapsed, error)
    assert isinstance(error, TimeoutError), error
    assert_within(elapsed, 500, "cancelling a stuck call")

    pods.proxy.pass_through()
    answer = await must(
        effects.save_result_if_absent(key_of(lease), work), "the effect again, healed"
    )
    assert not answer.replayed
    assert await committed_business_rows(direct) == ["charged"]


# --- dropped connections --------------------------------------------------------------------


async def test_dropped_inside_fenced_effect_is_store_unavailable(
    pods: Pods, direct: SqlConnection
) -> None:
    """Every connection reset, and new ones refused, in the middle of the effect's
    transaction: `StoreUnavailableError` (nothing applied, not an unknown outcome) within
    the retry and connect bounds; healed, the retry runs the work once."""
    pod = pods.connection()
    leases, effects = pods.leases(pod), pods.effects(pod)
    lease = await acquired(leases, "tree-drop-effect")

    async def cut_off() -> None:
        await pods.proxy.drop()

    work = Charge(before=cut_off)
    _, error, elapsed = await timed(effects.save_result_if_absent(key_of(lease), work))
    bound = TIMEOUTS.retry_ms + TIMEOUTS.connect_ms
    record(pods.server_url, "connections dropped inside a fenced effect", bound, elapsed, error)
    assert_typed(error)
    assert isinstance(error, StoreUnavailableError), error
    assert not isinstance(error, CommitOutcomeUnknownError), error
    assert_within(elapsed, bound, "a dropped effect")

    pods.proxy.pass_through()
    answer = await must(
        effects.save_result_if_absent(key_of(lease), work), "the effect again, healed"
    )
    assert not answer.replayed
    assert await committed_business_rows(direct) == ["charged"]


async def test_dropped_server_is_store_unavailable(pods: Pods, direct: SqlConnection) -> None:
    """Lease calls against a dropped server: `StoreUnavailableError`, whether the pod had
    idle pooled connections (reset under it) or had to connect anew."""
    pod = pods.connection()
    leases = pods.leases(pod)
    lease = await acquired(leases, "tree-drop-lease")
    await pods.proxy.drop()
    _, error, elapsed = await timed(leases.renew(lease, LEASE_MS))
    bound = TIMEOUTS.retry_ms + TIMEOUTS.connect_ms
    record(pods.server_url, "server dropped: lease renew", bound, elapsed, error)
    assert_typed(error)
    assert isinstance(error, StoreUnavailableError), error
    assert_within(elapsed, bound, "a renewal on a dropped server")

    fresh = pods.connection()
    _, error, elapsed = await timed(pods.leases(fresh).acquire(TENANT, "tree-other", LEASE_MS))
    record(pods.server_url, "server dropped: connect + take", bound, elapsed, error)
    assert_typed(error)
    assert isinstance(error, StoreUnavailableError), error
    assert not isinstance(error, CommitOutcomeUnknownError), error
    assert_within(elapsed, bound, "a take on a dropped server")


async def test_idle_connections_reset_cost_nothing(pods: Pods, direct: SqlConnection) -> None:
    """Idle pooled connections reset while unused (a server restart, a NAT timeout): the
    next calls find them dead before use and answer on new connections."""
    pod = pods.connection()
    leases, effects = pods.leases(pod), pods.effects(pod)
    lease = await acquired(leases, "tree-reset-idle")
    await pods.proxy.reset_connections()
    remaining = await must(leases.renew(lease, LEASE_MS), "a renewal")
    assert remaining is not None and remaining > 0
    await pods.proxy.reset_connections()
    answer = await must(
        effects.save_result_if_absent(key_of(lease), Charge()), "the effect again, healed"
    )
    assert not answer.replayed
    assert await committed_business_rows(direct) == ["charged"]


# --- the ambiguous commit -------------------------------------------------------------------


@pytest.mark.parametrize("after", ["reset", "hang"])
@pytest.mark.parametrize("deliver", [False, True], ids=["commit-lost", "reply-lost"])
async def test_ambiguous_commit(
    pods: Pods, direct: SqlConnection, deliver: bool, after: str
) -> None:
    """The pod sends COMMIT and never hears back (its connection reset, or silent):
    `CommitOutcomeUnknownError`, not retried blindly. Calling the same effect again
    replays the stored result when the COMMIT landed (the work ran once), and runs the
    work once when it did not; either way exactly one business row."""
    await _ambiguous_commit(pods, direct, deliver, after, SqlFencedEffectRepository)


class BlindRetryEffects(SqlFencedEffectRepository):
    """Broken on purpose: runs the effect again when its COMMIT got no answer, as if
    nothing had been applied."""

    async def save_result_if_absent(self, key: Any, work: Any) -> Any:
        for _ in range(3):
            with contextlib.suppress(CommitOutcomeUnknownError):
                return await super().save_result_if_absent(key, work)
        return await super().save_result_if_absent(key, work)


async def test_ambiguous_commit_catches_a_blind_retry(pods: Pods, direct: SqlConnection) -> None:
    """The check above fails for an effect store that retries an unanswered COMMIT."""
    with pytest.raises(AssertionError, match=r"CommitOutcomeUnknownError|run again"):
        await _ambiguous_commit(pods, direct, False, "reset", BlindRetryEffects)


async def _ambiguous_commit(
    pods: Pods,
    direct: SqlConnection,
    deliver: bool,
    after: str,
    kind: type[SqlFencedEffectRepository],
) -> None:
    pod = pods.connection()
    leases, effects = pods.leases(pod), pods.effects(pod, kind=kind)
    lease = await acquired(leases, f"tree-commit-{deliver}-{after}")
    work = Charge()
    # The effect's own COMMIT (not a new connection's set-up one): its transaction wrote
    # the effect's result row.
    pods.proxy.cut_at_commit(
        deliver=deliver,
        after=after,  # type: ignore[arg-type]
        marker="agboss_fenced_effect_results",
    )
    _, error, elapsed = await timed(effects.save_result_if_absent(key_of(lease), work))
    bound = TIMEOUTS.statement_ms if after == "hang" else 0
    scenario = f"cut after COMMIT ({'reply lost' if deliver else 'COMMIT lost'}, {after})"
    if kind is SqlFencedEffectRepository:
        record(pods.server_url, scenario, bound, elapsed, error)
    assert pods.proxy.cuts == 1, "the proxy never saw the COMMIT"
    assert work.runs == 1, "the transaction was run again after its COMMIT was sent"
    assert_typed(error)
    assert isinstance(error, CommitOutcomeUnknownError), (
        f"not a CommitOutcomeUnknownError: {error!r}"
    )
    assert_within(elapsed, bound, "an unanswered COMMIT")

    pods.proxy.pass_through()
    answer = await must(
        effects.save_result_if_absent(key_of(lease), work), "the effect again, healed"
    )
    assert answer.value == {"receipt": "charged"}
    if deliver:
        assert answer.replayed, "the first commit landed: the retry must replay it"
        assert work.runs == 1
    else:
        assert not answer.replayed, "the first commit never landed: the retry runs the work"
        assert work.runs == 2
    assert await committed_business_rows(direct) == ["charged"]


# --- locks held by a partitioned session ----------------------------------------------------


async def test_takeover_blocked_by_partitioned_lock_times_out(
    pods: Pods, direct: SqlConnection
) -> None:
    """Pod 1 froze inside a fenced effect (holding its lease row's lock) and is then cut
    off; its lease runs out. Pod 2's takeover waits on that lock no longer than `lock_ms`:
    `StoreTimeoutError(what="lock")`. Once pod 1's session is gone, the takeover goes
    through and pod 1's late effect is refused or fails typed, never applied."""
    # Pod 1's own bounds are long: a server that ends an idle transaction after them
    # (PostgreSQL's idle_in_transaction_session_timeout) must not end this one first.
    frozen_pod = pods.connection(Timeouts(connect_ms=800, statement_ms=30_000, lock_ms=5_000))
    leases1, effects1 = pods.leases(frozen_pod, "pod-1"), pods.effects(frozen_pod, "pod-1")
    lease = await acquired(leases1, "tree-partition")
    inside, thaw = asyncio.Event(), asyncio.Event()

    async def freeze() -> None:
        inside.set()
        await thaw.wait()

    frozen = asyncio.create_task(
        effects1.save_result_if_absent(key_of(lease), Charge(before=freeze))
    )
    await asyncio.wait_for(inside.wait(), 10)
    pods.proxy.blackhole()
    await pods.clock.advance(LEASE_MS + 1)  # pod 1's lease is over by the store's time

    # The statement bound is longer than the lock bound: the lock wait is what must end.
    taker = pods.connection(
        Timeouts(connect_ms=800, statement_ms=10_000, lock_ms=1_000), proxied=False
    )
    leases2 = pods.leases(taker, "pod-2")
    _, error, elapsed = await timed(leases2.acquire(TENANT, "tree-partition", LEASE_MS))
    bound = lock_bound_ms(pods.server_url, TIMEOUTS.lock_ms)
    record(pods.server_url, "takeover blocked by a partitioned lock", bound, elapsed, error)
    assert_typed(error)
    assert isinstance(error, StoreTimeoutError), error
    assert error.what == "lock"
    assert_within(elapsed, bound, "a takeover on a partitioned session's lock")

    # The partitioned session ends (the proxy stands for the server's keepalive here).
    await pods.proxy.close()
    thaw.set()
    _, late_error, _ = await timed(asyncio.wait_for(frozen, 30))
    assert_typed(late_error)
    taken = await must(leases2.acquire(TENANT, "tree-partition", LEASE_MS), "the takeover")
    assert taken is not None and taken.lease_epoch == lease.lease_epoch + 1
    assert await committed_business_rows(direct) == []


# --- pool exhaustion ------------------------------------------------------------------------


class NoLaneConnection(SqlConnection):
    """Broken on purpose: lease calls queue for the business pool like any other call."""

    async def run(self, step: Any, *, transaction: bool = True, priority: bool = False) -> Any:
        return await super().run(step, transaction=transaction, priority=False)


async def test_pool_exhaustion_catches_renewals_without_a_lane(
    pods: Pods, direct: SqlConnection
) -> None:
    """The check below fails for a connection whose lease calls have no lane of their own."""
    with pytest.raises(AssertionError, match="queued behind business work"):
        await _pool_exhaustion(pods, direct, NoLaneConnection)


async def test_pool_exhaustion_spares_lease_renewals(pods: Pods, direct: SqlConnection) -> None:
    """A session elsewhere froze holding one tree's lease row lock. Eight fenced effects of
    the pod wait on it, and eight plain statements of the pod too (its pool of 8). The
    pod's renewal of another tree's lease, and a take of a third, still answer while all
    of them wait (lease calls have their own lane). A business call that needs a pooled
    connection waits for one no longer than `pool_ms` (`StoreTimeoutError(what="pool")`),
    and an unrelated fenced effect answers or ends just as fast, never behind the lock.
    Unlocked, every waiter finishes."""
    await _pool_exhaustion(pods, direct, SqlConnection)


async def _pool_exhaustion(pods: Pods, direct: SqlConnection, kind: type[SqlConnection]) -> None:
    timeouts = Timeouts(connect_ms=2_000, statement_ms=30_000, lock_ms=20_000, pool_ms=600)
    pod = pods.connection(timeouts, proxied=False, pool_size=8, kind=kind)
    leases, effects = pods.leases(pod), pods.effects(pod)
    busy = await acquired(leases, "tree-busy")
    other = await acquired(leases, "tree-other")
    busy_row = sa.and_(
        execution_leases.c.tenant_id == TENANT, execution_leases.c.execution_id == "tree-busy"
    )
    locked, unlock = asyncio.Event(), asyncio.Event()

    async def frozen_session() -> None:
        async with direct.transaction() as tx:
            await tx.execute(
                sa.select(execution_leases.c.lease_epoch).where(busy_row).with_for_update()
            )
            locked.set()
            await unlock.wait()

    holder = asyncio.create_task(frozen_session())
    await asyncio.wait_for(locked.wait(), 10)
    waiting: list[asyncio.Task[Any]] = [
        asyncio.create_task(
            effects.save_result_if_absent(key_of(busy, f"step-{i}"), Charge(f"row-{i}"))
        )
        for i in range(8)
    ]
    touch = (
        sa.update(execution_leases).where(busy_row).values(updated_at=execution_leases.c.updated_at)
    )
    waiting += [asyncio.create_task(pod.execute(touch)) for _ in range(8)]
    try:
        seen = await wait_for_lock_waiters(direct, 16, 10)
        ended = [t.exception() or t.result() for t in waiting if t.done()]
        assert seen >= 16, f"only {seen} of the 16 calls reached the lock; ended: {ended}"

        remaining, error, elapsed = await timed(leases.renew(other, LEASE_MS))
        if kind is SqlConnection:
            record(
                pods.server_url, "renewal while the pool waits on a lock", 0, elapsed, error or "ok"
            )
        assert error is None, f"the renewal queued behind business work: {error!r}"
        assert remaining is not None and remaining > 0
        # The waiters cannot have finished: their lock is held until `unlock` (and their lock
        # bound is 20 s, far beyond the renewal's answer).
        assert not any(task.done() for task in waiting), "the waiters stopped waiting early"

        third, error, elapsed = await timed(leases.acquire(TENANT, "tree-third", LEASE_MS))
        record(pods.server_url, "take while the pool waits on a lock", 0, elapsed, error or "ok")
        assert error is None, f"the take queued behind business work: {error!r}"
        assert third is not None

        _, error, elapsed = await timed(pod.execute("SELECT 1"))
        record(pods.server_url, "statement on an exhausted pool", timeouts.pool_ms, elapsed, error)
        assert_typed(error)
        assert isinstance(error, StoreTimeoutError), error
        assert error.what == "pool"
        assert_within(elapsed, timeouts.pool_ms, "a wait for a pooled connection")

        _, error, elapsed = await timed(
            effects.save_result_if_absent(key_of(other), Charge("unrelated"))
        )
        record(
            pods.server_url,
            "unrelated effect while 8 effects wait",
            timeouts.pool_ms,
            elapsed,
            error or "ok",
        )
        if error is not None:
            assert isinstance(error, StoreTimeoutError) and error.what == "pool", error
        assert_within(elapsed, timeouts.pool_ms, "an unrelated effect")
        assert not any(task.done() for task in waiting)
    finally:
        unlock.set()
        await asyncio.wait_for(holder, 30)
        results = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 60)
    assert all(not isinstance(r, BaseException) for r in results), results
    rows = set(await committed_business_rows(direct))
    assert {f"row-{i}" for i in range(8)} <= rows
