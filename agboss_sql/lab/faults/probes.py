"""Fault probes: scenarios that run their own processes instead of the pods' trees.

- `clock_jump(url)`: a process holds the one slot of a limit and has added the one unit of
  a window; a second process, its application clock an hour ahead, asks for a slot and
  for a unit of the same limits. Slots and windows decide by the database's clock, so the
  second process is refused both, and the first still holds its slot.
- `lease_starvation(url)`: a holder keeps lease A with a `LeaseKeeper` of a 3 s lease
  while (on a server) another process holds the row of lease B locked and four tasks of
  the holder keep taking B, each blocked `lock_ms` on that row, and while its own 2.5 s
  fenced effect holds A's row (the renewal waits behind it). The holder must keep A
  through two lease lengths, and the effect must commit.

Each returns the violations it found (none when the guarantee held). Every process runs
this module's `_main(<role>, …)`; every wait is bounded, and every process is ended
before a probe returns.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

from agboss_sql.contracts.clocks import Clock, SkewedClock, StoreClock, SystemClock
from agboss_sql.contracts.errors import StoreTimeoutError, StoreUnavailableError
from agboss_sql.contracts.keys import fenced_effect_key_of
from agboss_sql.contracts.stores import RateLimitRepository
from agboss_sql.contracts.types import ApplicationContext, ExecutionContext, StepRef

TENANT = "tenant-probe"
SLOT_KEY = "probe-model"
SLOT_TTL_MS = 60_000
WINDOW_MS = 3_600_000
JUMP_MS = 3_600_000
"""How far ahead the jumped process's application clock is: an hour."""
LEASE_MS = 3_000
EFFECT_S = 2.5
"""The holder's own effect: most of its lease, longer than its trust window (2 s)."""
HOLD_FOR_S = 2 * LEASE_MS / 1000
"""Two lease lengths: past the effect, and past a take blocked one `lock_ms` (5 s)."""
TAKERS = 4
PROCESS_BOUND_S = 60.0
"""How long a probe's process may take before it is killed and the probe fails."""


def _server(url: str) -> bool:
    return not url.startswith("sqlite")


_ENTRY = "import sys; from agboss_sql.lab.faults.probes import _main; _main(sys.argv[1:])"
"""A probe process (not `-m`: the package imports this module first)."""


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _ENTRY, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _answer(process: subprocess.Popen[str]) -> dict[str, Any]:
    """The JSON line the process ends with (it is killed past `PROCESS_BOUND_S`)."""
    try:
        out, _ = process.communicate(timeout=PROCESS_BOUND_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {"error": f"the probe process did not end within {PROCESS_BOUND_S} s"}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        return {"error": f"the probe process exited {process.returncode}: {out[-500:]!r}"}
    answer: dict[str, Any] = json.loads(lines[-1])
    return answer


def _prepare(url: str) -> None:
    """The schema at the head revision (the probes' applications check it), every row
    deleted."""
    from alembic import command

    from agboss_sql.lab.faults.suite import reset_database
    from agboss_sql.sql.migrate import alembic_config

    reset_database(url)
    command.upgrade(alembic_config(url), "head")


# --- clock-jump -------------------------------------------------------------------------


async def _limits(url: str, name: str, clock: Clock) -> tuple[Any, RateLimitRepository]:
    """The rate limits an application on `clock` gets from its container."""
    from agboss_sql.application import Application, DatabaseUrl
    from agboss_sql.sql.rate_limits import SqlRateLimitRepository

    app = Application(
        name,
        providers=[SqlRateLimitRepository],
        values={DatabaseUrl: DatabaseUrl(url), Clock: clock},
        instance_id=name,
    )
    await app.start()
    return app, app.store(RateLimitRepository)


async def _slot_taker(url: str, holder: str, jump_ms: int) -> dict[str, Any]:
    app, limits = await _limits(url, holder, SkewedClock(SystemClock(), jump_ms))
    try:
        took = await limits.acquire_slot(SLOT_KEY, holder, 1, SLOT_TTL_MS)
        window = await limits.add_to_window(SLOT_KEY, WINDOW_MS, 1, 1)
        return {"slot": took, "window": window.allowed, "used": window.used}
    finally:
        await app.close()


def clock_jump(url: str) -> list[str]:
    """The violations of the clock-jump probe on `url` (see the module)."""
    _prepare(url)

    async def first_holder() -> list[str]:
        app, limits = await _limits(url, "on-time", SystemClock())
        try:
            if not await limits.acquire_slot(SLOT_KEY, "on-time", 1, SLOT_TTL_MS):
                return ["setup: the first holder was refused the free slot"]
            if not (await limits.add_to_window(SLOT_KEY, WINDOW_MS, 1, 1)).allowed:
                return ["setup: the first holder was refused the window's free unit"]
            jumped = await asyncio.to_thread(
                lambda: _answer(_spawn("slot-taker", url, "jumped", str(JUMP_MS)))
            )
            found = []
            if "error" in jumped:
                found.append(f"the jumped process failed: {jumped['error']}")
            if jumped.get("slot"):
                found.append(
                    "two holders of a one-slot limit: a process whose clock is an hour ahead "
                    "took the slot another holds live"
                )
            if jumped.get("window"):
                found.append(
                    "a window of one unit added two: a process whose clock is an hour ahead "
                    f"started its own window (used {jumped.get('used')})"
                )
            if not await limits.renew_slot(SLOT_KEY, "on-time", SLOT_TTL_MS):
                found.append("the first holder's live slot was gone after the jumped take")
            return found
        finally:
            await app.close()

    return asyncio.run(first_holder())


# --- lease-starvation -------------------------------------------------------------------


async def _locker(url: str, execution: str) -> dict[str, Any]:
    """Take `execution`'s lease, lock its row in an open transaction, say so, and keep the
    lock until stdin closes."""
    import sqlalchemy as sa

    from agboss_sql.sql.connection import SqlConnection
    from agboss_sql.sql.leases import SqlExecutionLeaseRepository
    from agboss_sql.sql.schema import execution_leases as L

    connection = SqlConnection(url)
    try:
        leases = SqlExecutionLeaseRepository(connection, StoreClock(), ApplicationContext("lock"))
        if await leases.acquire(TENANT, execution, 600_000) is None:
            return {"error": f"the locker could not take {execution}"}
        async with connection.transaction() as tx:
            await tx.execute(
                sa.select(L.c.lease_epoch)
                .where(L.c.tenant_id == TENANT, L.c.execution_id == execution)
                .with_for_update()
            )
            print("locked", flush=True)
            await asyncio.to_thread(sys.stdin.read)
        return {"locked": True}
    finally:
        await connection.close()


async def _holder(url: str, locked: str) -> dict[str, Any]:
    """Keep lease A through `HOLD_FOR_S` while takes of `locked` (if any) are blocked and
    its own `EFFECT_S` effect holds A's row; answer whether it was kept."""
    import sqlalchemy as sa

    from agboss_sql.runtime.keeper import LeaseKeeper
    from agboss_sql.sql.connection import SqlConnection
    from agboss_sql.sql.effects import SqlFencedEffectRepository
    from agboss_sql.sql.leases import SqlExecutionLeaseRepository

    connection = SqlConnection(url)
    application = ApplicationContext("holder")
    leases = SqlExecutionLeaseRepository(connection, StoreClock(), application)
    effects = SqlFencedEffectRepository(connection, StoreClock(), application)
    keeper = LeaseKeeper(leases, None, SystemClock(), lease_ms=LEASE_MS)
    blocked = 0
    stop = asyncio.Event()

    async def take_locked() -> None:
        nonlocal blocked
        while not stop.is_set():
            try:
                await leases.acquire(TENANT, locked, LEASE_MS)
            except StoreTimeoutError as error:
                blocked += error.what == "lock"
            except StoreUnavailableError:
                pass

    async def long_effect() -> Any:
        lease = keeper.lease
        assert lease is not None
        step = StepRef("lease-a", "long-effect", "long-effect")
        key = fenced_effect_key_of(
            ExecutionContext(TENANT, "lease-a", "lease-a", lease, step), "long"
        )
        async with keeper.effect() as held:

            async def work(tx: Any) -> Any:
                held()
                await tx.execute(sa.text("SELECT 1"))
                await asyncio.sleep(EFFECT_S)  # the effect's own work, its row locked
                return {"done": True}

            return (await effects.save_result_if_absent(key, work)).value

    try:
        # The holder's connections are open before it starts, as a running worker's are.
        async with connection.transaction() as tx:
            await tx.execute(sa.text("SELECT 1"))
        if await keeper.take(TENANT, "lease-a") is None:
            return {"error": "the holder could not take lease A"}
        keeper.start()
        # The effect starts on a lease just confirmed: 2.5 s of its 3 s are the effect's.
        await keeper.confirm_now()
        takers = [asyncio.create_task(take_locked()) for _ in range(TAKERS if locked else 0)]
        effect = asyncio.create_task(long_effect())
        lost = asyncio.create_task(keeper.signal.wait())
        began = time.monotonic()
        # The holder's abort signal, not a sleep, ends the wait when the lease is lost.
        await asyncio.wait([lost], timeout=HOLD_FOR_S)
        stop.set()
        kept = not lost.done() and keeper.held and keeper.trusted()
        lost.cancel()
        answer: dict[str, Any] = {
            "kept": kept,
            "reason": None if kept else repr(keeper.signal.reason),
            "held_s": round(time.monotonic() - began, 2),
            "blocked_takes": blocked,
        }
        try:
            answer["effect"] = await asyncio.wait_for(effect, PROCESS_BOUND_S / 2)
        except Exception as error:
            answer["effect_error"] = repr(error)
        for taker in takers:
            taker.cancel()  # a take blocked on the locked row would wait out its lock_ms
        await asyncio.gather(*takers, return_exceptions=True)
        return answer
    finally:
        await keeper.stop()
        await connection.close()


def lease_starvation(url: str) -> list[str]:
    """The violations of the lease-starvation probe on `url` (see the module)."""
    _prepare(url)
    locker: subprocess.Popen[str] | None = None
    found: list[str] = []
    try:
        if _server(url):
            locker = _spawn("locker", url, "lease-b")
            assert locker.stdout is not None
            if locker.stdout.readline().strip() != "locked":
                return ["setup: the locker process did not lock lease B's row"]
        answer = _answer(_spawn("holder", url, "lease-b" if locker else ""))
    finally:
        if locker is not None:
            assert locker.stdin is not None
            locker.stdin.close()  # ends its transaction and the process
            try:
                locker.wait(timeout=PROCESS_BOUND_S)
            except subprocess.TimeoutExpired:
                locker.kill()
                locker.wait()
    if "error" in answer:
        return [f"the holder process failed: {answer['error']}"]
    if not answer.get("kept"):
        found.append(
            f"the holder lost its lease after {answer.get('held_s')} s: {answer.get('reason')}"
        )
    if answer.get("effect") != {"done": True}:
        found.append(f"the holder's own effect did not commit: {answer.get('effect_error')}")
    if locker is not None and not answer.get("blocked_takes"):
        found.append("no take of the locked lease was blocked: the probe starved nothing")
    return found


# --- as scenarios of the fault suite ---------------------------------------------------


def probe_scenarios() -> dict[str, Any]:
    """The probes as named scenarios (`agboss-sql faults --scenario clock-jump`), tagged
    `long` so that the default test run (which runs the probes in tests/faults) leaves
    them out."""
    from agboss_sql.lab.faults.scenarios import Scenario

    return {
        s.name: s
        for s in (
            Scenario(
                name="lease-starvation",
                doc="a holder keeps its 3 s lease while takes of a row another process "
                "locked fill the takes' lane (servers) and its own 2.5 s effect holds the "
                "lease row; the effect commits",
                act=_no_act,
                probe=lease_starvation,
                tags=("probe", "long"),
            ),
            Scenario(
                name="clock-jump",
                doc="a process whose clock is an hour ahead asks for the slot and the "
                "window unit another process holds: refused both (database time decides)",
                act=_no_act,
                probe=clock_jump,
                tags=("probe", "long"),
            ),
        )
    }


def _no_act(_run: Any) -> None:
    """A probe's scenario drives no pod."""


# --- the processes ----------------------------------------------------------------------


def _main(argv: list[str]) -> None:
    role, url, *rest = argv
    answer: dict[str, Any]
    if role == "slot-taker":
        answer = asyncio.run(_slot_taker(url, rest[0], int(rest[1])))
    elif role == "locker":
        answer = asyncio.run(_locker(url, rest[0]))
    elif role == "holder":
        answer = asyncio.run(_holder(url, rest[0] if rest else ""))
    else:
        raise SystemExit(f"unknown probe role {role!r}")
    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1:])


__all__ = ["clock_jump", "lease_starvation", "probe_scenarios"]
