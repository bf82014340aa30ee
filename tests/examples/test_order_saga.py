"""The order saga example run as a user runs it (examples/order_saga/README.md): its shop
tables made by its schema command, two `agboss-sql worker --app order_saga.app:app`
processes, orders driven through its client, and the outcome read from the shop's own
tables — an approved order, a cancelled one, children shipped on both workers, and a worker
SIGKILLed while orders run."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from saga_support import Worker, client, first_event, ok, read_shop, takeovers

from agboss_sql.runtime import Engine, WorkflowState, WorkflowTimeoutError

RUN_S = 60.0
"""An order's run: a worker's sweep takes it within a third of a lease, then a few short
steps and one child per item; seconds, tens on a loaded machine."""

TAKEOVER_S = 90.0
"""Orders finished after a worker died: its leases expire (2 s), the other's sweep and
child rescue (every 2/3 s) take them, then the rest of the work, on a loaded machine."""


def order(order_id: str, items: list[str], *, approval: bool = False) -> dict[str, object]:
    return {"id": order_id, "cents": 100, "items": items, "needs_approval": approval}


def succeeded(items: list[str]) -> dict[str, object]:
    """The result of an order of `items` (100 cents, no approval)."""
    return {"reserved": items, "charged": 100, "shipped": items, "approval": None}


async def wait_state(engine: Engine, order_id: str, state: WorkflowState) -> None:
    """Poll the run's status until it is `state` (bounded by RUN_S)."""
    deadline = time.monotonic() + RUN_S
    while True:
        status = await engine.status(order_id)
        if status.state is state:
            return
        assert not status.state.ended, f"{order_id} ended {status.state}: {status.error}"
        assert time.monotonic() < deadline, f"{order_id} still {status.state} after {RUN_S} s"
        await asyncio.sleep(0.1)


async def results(engine: Engine, ids: list[str], bound_s: float) -> dict[str, object]:
    """Every run's result (raising for one that failed or was cancelled), all within
    `bound_s`."""
    deadline = time.monotonic() + bound_s
    found: dict[str, object] = {}
    for order_id in ids:
        left = max(0.1, deadline - time.monotonic())
        try:
            found[order_id] = await engine.result(order_id, timeout_s=left)
        except WorkflowTimeoutError:
            states = {i: (await engine.status(i)).state.value for i in ids}
            raise AssertionError(f"not all ended within {bound_s} s: {states}") from None
    return found


async def test_an_approved_order_pauses_then_is_charged_once_and_ships_every_item(
    workers: list[Worker], client_engine: Engine, shop_url: str
) -> None:
    said = await asyncio.to_thread(
        client, shop_url, "start", "o-1", "--cents", "4200", "--items", "book,pen", "--approval"
    )
    assert ok(said).strip() == "started o-1"
    await wait_state(client_engine, "o-1", WorkflowState.PAUSED)
    said = await asyncio.to_thread(client, shop_url, "status", "o-1")
    assert ok(said).strip() == "o-1: paused, waiting on approval"
    # Charged and shipped before the approval; nothing refunded.
    shop = read_shop(shop_url)
    assert [(o, c) for o, c, _ in shop.paid("o-1")] == [("o-1", 4200)]
    assert [item for item, _ in shop.shipped("o-1")] == ["book", "pen"]
    assert shop.refunds == []

    assert ok(await asyncio.to_thread(client, shop_url, "approve", "o-1")).strip() == (
        "approved o-1"
    )
    said = await asyncio.to_thread(client, shop_url, "result", "o-1", "--timeout", str(RUN_S))
    assert json.loads(ok(said)) == {
        "reserved": ["book", "pen"],
        "charged": 4200,
        "shipped": ["book", "pen"],
        "approval": {"approved": True},
    }
    shop = read_shop(shop_url)
    ids = {worker.instance_id for worker in workers}
    assert len(shop.payments) == 1 and shop.paid("o-1")[0][2] in ids
    assert [item for item, _ in shop.shipped("o-1")] == ["book", "pen"]
    assert {by for _, by in shop.shipped("o-1")} <= ids
    assert shop.refunds == []


async def test_an_order_cancelled_while_it_waits_is_refunded_once_and_its_stock_released(
    workers: list[Worker], client_engine: Engine, shop_url: str
) -> None:
    await client_engine.start("order", order("o-2", ["book", "pen"], approval=True), id="o-2")
    await wait_state(client_engine, "o-2", WorkflowState.PAUSED)
    said = await asyncio.to_thread(client, shop_url, "cancel", "o-2")
    assert ok(said).strip() == "cancelled o-2"

    said = await asyncio.to_thread(client, shop_url, "result", "o-2", "--timeout", str(RUN_S))
    assert said.returncode != 0 and "WorkflowCancelledError" in said.stderr, said.stderr
    assert "run 'o-2' was cancelled" in said.stderr, said.stderr
    # The worker that unwound it ran both undos: the refund and the stock's release.
    unwound = await asyncio.to_thread(
        first_event,
        workers,
        lambda e: e.get("kind") == "unwound" and e.get("tree") == "o-2",
        RUN_S,
        "unwound event of o-2",
    )
    assert unwound["undone"] == 2, unwound
    shop = read_shop(shop_url)
    assert [(o, c) for o, c, _ in shop.paid("o-2")] == [("o-2", 100)]
    assert shop.refunds == [("o-2", 100)]
    # A second cancel is harmless: still one refund.
    assert (await client_engine.cancel("o-2")) is True
    assert (await client_engine.status("o-2")).state is WorkflowState.CANCELLED
    assert read_shop(shop_url).refunds == [("o-2", 100)]


async def test_the_items_ship_on_both_workers_whichever_charged_the_order(
    workers: list[Worker], client_engine: Engine, shop_url: str
) -> None:
    ids = [f"o-{n:02d}" for n in range(10)]
    items = ["a", "b", "c"]
    for order_id in ids:
        await client_engine.start("order", order(order_id, items), id=order_id)
    done = await results(client_engine, ids, RUN_S)
    assert all(done[i] == succeeded(items) for i in ids), done

    shop = read_shop(shop_url)
    instances = {worker.instance_id for worker in workers}
    assert sorted(o for o, _, _ in shop.payments) == ids
    assert {by for _, _, by in shop.payments} <= instances
    for order_id in ids:
        assert [item for item, _ in shop.shipped(order_id)] == items, shop.shipped(order_id)
    assert shop.refunds == []
    # Children run on any instance: both workers shipped, and some items on the worker
    # that did not charge their order.
    assert {by for _, _, by in shop.shipments} == instances, shop.shipments
    charged_by = {o: by for o, _, by in shop.payments}
    assert any(by != charged_by[o] for o, _, by in shop.shipments), shop


async def test_a_worker_killed_while_orders_run_leaves_them_to_the_other_done_once(
    workers: list[Worker], client_engine: Engine, shop_url: str
) -> None:
    # The first worker to start a child is SIGKILLed from its reader thread the instant it
    # says so: it dies in the child's first step (a 0.1 s pack), holding the child's lease.
    killed: list[tuple[Worker, str]] = []
    once = threading.Lock()

    def kill_on_first_child(worker: Worker, event: dict[str, object]) -> None:
        if event.get("kind") != "child-run":
            return
        with once:
            if killed:
                return
            killed.append((worker, str(event["child"])))
        worker.kill()

    for worker in workers:
        worker.on_event = kill_on_first_child
    ids = [f"k-{n:02d}" for n in range(6)]
    items = ["a", "b", "c"]
    for order_id in ids:
        await client_engine.start("order", order(order_id, items), id=order_id)
    done = await results(client_engine, ids, TAKEOVER_S)
    assert killed, "no worker ran a child"
    victim, child = killed[0]
    assert victim.process.poll() is not None, "the victim is still alive"
    (survivor,) = [worker for worker in workers if worker is not victim]
    assert all(done[i] == succeeded(items) for i in ids), done

    # Nothing done twice: one payment per order, one shipment per item, no refund.
    shop = read_shop(shop_url)
    assert sorted(o for o, _, _ in shop.payments) == ids
    for order_id in ids:
        assert [item for item, _ in shop.shipped(order_id)] == items, shop.shipped(order_id)
    assert shop.refunds == []
    # The child it died in was taken over by the survivor.
    taken = takeovers(shop_url)
    assert (child, survivor.instance_id, victim.instance_id) in taken, taken
