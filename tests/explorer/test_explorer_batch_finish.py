"""The explorer's batch-finish moves: the child-queue worlds' instances after the first
finish in batches (`finish_many`) mixing live, superseded, already finished and (in the
child-queue world) another tenant's entries, sent again at will, between single finishes,
rescues and wakes. A batch finish that takes an already finished child off its parent's
count again is caught by these moves, and by nothing else the explorer does: with the
batch finishes left out of the world, the same store passes."""

from __future__ import annotations

import dataclasses

import pytest
from broken_batch_finish import BatchFinishCountsAcrossTenants, BatchFinishRecountsFinished
from naive_stores import memory_set, naive

from agboss_sql.testing.explorer import InterleavingFailure, explore
from agboss_sql.testing.explorer._search import Explorer
from agboss_sql.testing.explorer._world import FINISH_CHILDREN, WORLDS

SEED = 533
LABEL = "a batch finish that counts a finished child again"


async def _caught(world: str, *, exhaustive: bool) -> InterleavingFailure:
    chosen = memory_set(queue=naive(BatchFinishRecountsFinished))
    with pytest.raises(InterleavingFailure) as caught:
        await explore(
            chosen.factories,
            world=world,
            depth=8 if exhaustive else 0,
            walks=0 if exhaustive else 200,
            seed=SEED,
            reset=chosen.reset,
            name=LABEL,
        )
    return caught.value


@pytest.mark.parametrize("world", ["child_queue", "child_tree"])
async def test_the_batch_finish_moves_catch_a_finished_child_counted_again(world: str) -> None:
    failure = await _caught(world, exhaustive=True)
    expected = "parent-woken-once" if world == "child_tree" else "one-effect-per-key"
    assert failure.invariant == expected, str(failure)
    assert failure.mode == "exhaustive search"
    # The minimal schedule ends in a batch finish: the step that broke it.
    assert failure.schedule[-1].split(" → ")[0].endswith("in one batch"), str(failure)
    assert "a superseded entry changes nothing" in str(failure).splitlines()[0]


async def test_the_walks_catch_it_and_shrink_it() -> None:
    failure = await _caught("child_queue", exhaustive=False)
    assert failure.invariant == "one-effect-per-key", str(failure)
    assert any("in one batch" in step for step in failure.schedule), str(failure)


@pytest.mark.parametrize("world", ["child_queue", "child_tree"])
async def test_without_the_batch_finish_moves_the_same_store_passes(world: str) -> None:
    """The store's single finish is the reference's: the world without its batch finishes
    (every instance finishing one child at a time, as before these moves) finds nothing."""
    chosen = memory_set(queue=naive(BatchFinishRecountsFinished))
    without = dataclasses.replace(WORLDS[world], batch_finish=False)
    explorer = Explorer(
        chosen.factories,
        without,
        name=LABEL,
        reset=chosen.reset,
        business_rows=None,
        seed=SEED,
        time_limit=120,
    )
    explorer.start_clock()
    try:
        _schedules, states, _steps, _skews = await explorer.exhaustive(
            6 if world == "child_queue" else 4
        )
        walked = await explorer.walks(100, 30)
        reached = dict(explorer.outcomes())
    finally:
        await explorer.close()
    assert states > 100 and walked == 100 * 30
    assert "finish-child: refused" in reached and "finish-child: replayed" in reached
    assert not any(kind.startswith(FINISH_CHILDREN) for kind in reached)


async def test_the_reference_queue_reaches_every_kind_of_batch() -> None:
    """On the in-memory reference set the child-queue world's batches mix every kind of
    entry: finished (some and none left), refused (superseded), replayed (a retry, and the
    other tenant's child after its first batch)."""
    chosen = memory_set()
    report = await explore(
        chosen.factories,
        world="child_queue",
        depth=6,
        walks=100,
        seed=SEED,
        reset=chosen.reset,
    )
    reached = {kind for kind, _ in report.outcomes}
    for kind in (
        "finish-children: finished, refused",
        "finish-children: finished, none left, refused",
        "finish-children: none left, replayed, refused",
        "finish-children: replayed, refused",
    ):
        assert kind in reached, sorted(reached)


async def test_the_other_tenants_entry_catches_a_count_shared_across_tenants() -> None:
    """A batch finish that also takes its finishes off the other tenant's parent of the same
    id: the child-queue world's batch names the other tenant's child, whose answer (its
    parent's only child: none left) shows the count it was given."""
    chosen = memory_set(queue=naive(BatchFinishCountsAcrossTenants))
    with pytest.raises(InterleavingFailure) as caught:
        await explore(
            chosen.factories,
            world="child_queue",
            depth=8,
            walks=0,
            seed=SEED,
            reset=chosen.reset,
            name="a batch finish that counts across tenants",
        )
    failure = caught.value
    assert failure.invariant == "one-effect-per-key", str(failure)
    assert "counted apart from the parent of the same id" in str(failure), str(failure)
    assert failure.schedule[-1].split(" → ")[0].endswith("in one batch"), str(failure)
