"""`wait_cancelled`: the end of a task the caller cancelled is absorbed, a cancellation of
the caller's own is not, even when it arrives while the caller waits."""

from __future__ import annotations

import asyncio

import pytest

from agboss_sql.runtime._tasks import wait_cancelled

BOUND_S = 10
"""A caller that absorbed its own cancellation waits forever: the test gives up after this
(generous for a loaded machine; a correct caller ends at once)."""


async def _slow_to_stop(cleaning: asyncio.Event, gate: asyncio.Event) -> None:
    """A task whose clean-up after a cancellation waits for `gate`."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        cleaning.set()
        await gate.wait()
        raise


async def test_a_cancellation_of_the_waiting_caller_passes_on() -> None:
    cleaning, gate = asyncio.Event(), asyncio.Event()
    inner = asyncio.create_task(_slow_to_stop(cleaning, gate))
    await asyncio.sleep(0)
    after_wait = asyncio.Event()

    async def caller() -> None:
        inner.cancel()
        await wait_cancelled(inner)
        after_wait.set()  # only a caller that swallowed its own cancellation gets here
        await asyncio.Event().wait()

    outer = asyncio.create_task(caller())
    await cleaning.wait()  # the caller now waits for the inner task's clean-up
    outer.cancel()
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(outer, BOUND_S)
    assert not after_wait.is_set()


async def test_the_cancelled_task_end_is_absorbed_also_in_a_clean_up_after_a_cancellation() -> None:
    """A caller cleaning up after its own cancellation (inside `except CancelledError`)
    still waits for the task it cancelled, and goes on with its clean-up."""
    cleaned_up = asyncio.Event()

    async def caller() -> None:
        inner = asyncio.create_task(asyncio.Event().wait())
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            inner.cancel()
            await wait_cancelled(inner)
            cleaned_up.set()
            raise

    outer = asyncio.create_task(caller())
    await asyncio.sleep(0)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(outer, BOUND_S)
    assert cleaned_up.is_set()


async def test_errors_pass_on_unless_quiet() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fails())
    with pytest.raises(RuntimeError):
        await wait_cancelled(task)
    quiet = asyncio.create_task(fails())
    await wait_cancelled(quiet, quiet=True)
    assert quiet.done()
