"""Contract suite of `ExecutionHistoryRepository` (docs/contracts.md): finished runs.

A snapshot is upserted by tenant and execution id and read back whole (its `record` JSON
included); the tenant's snapshots are listed newest first in `[since, until)` with keyset
pages that neither skip nor repeat a run, also among runs that finished in the same
millisecond; `purge` deletes what finished before the retention and says how many.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from agboss_sql.contracts.stores import ExecutionHistoryRepository
from agboss_sql.contracts.types import ExecutionSnapshot, HistoryCursor, JsonValue
from agboss_sql.testing._case import Case, CaseContext

CONTRACT = "execution_history"
TENANT = "tenant-1"

RECORD: JsonValue = {
    "steps": [
        {"name": "triage", "decision": {"route": "refund", "confidence": 0.92}},
        {
            "name": "refund",
            "decision": None,
            "tool_calls": [{"tool": "pay", "args": {"cents": 4200}}],
        },
    ],
    "input_hash": "sha256:" + "0f" * 32,
    "tool_calls": [{"tool": "pay", "args": {"cents": 4200}, "result": {"id": "ch_1"}}],
    "origin": {"kind": "mesh", "step": {"idempotency_key": "k-1"}, "note": "grüße ✓"},
}


def _expect(condition: bool, rule: str, message: str) -> None:
    if not condition:
        raise AssertionError(f"[{rule}] {message}")


def _history(ctx: CaseContext, instance: int = 0) -> ExecutionHistoryRepository:
    store: ExecutionHistoryRepository = ctx.store(CONTRACT, instance)
    return store


def _snapshot(
    execution_id: str,
    finished_at: int,
    *,
    tenant_id: str = TENANT,
    status: str = "succeeded",
    record: JsonValue = None,
) -> ExecutionSnapshot:
    return ExecutionSnapshot(
        tenant_id=tenant_id,
        execution_id=execution_id,
        workflow="support",
        status=status,
        started_at=finished_at - 500,
        finished_at=finished_at,
        record={"n": execution_id} if record is None else record,
    )


def _ids(snapshots: Sequence[ExecutionSnapshot]) -> list[str]:
    return [s.execution_id for s in snapshots]


async def _all_pages(
    store: ExecutionHistoryRepository,
    limit: int,
    *,
    since: int | None = None,
    until: int | None = None,
) -> list[list[ExecutionSnapshot]]:
    pages: list[list[ExecutionSnapshot]] = []
    after: HistoryCursor | None = None
    while True:
        page = list(await store.list(TENANT, since=since, until=until, limit=limit, after=after))
        _expect(len(page) <= limit, "page-limit", f"a page of limit {limit} held {len(page)}")
        if not page:
            return pages
        pages.append(page)
        _expect(len(pages) <= 100, "page-no-skip-no-repeat", "paging never ended")
        last = page[-1]
        after = HistoryCursor(last.finished_at, last.execution_id)


async def reads_back_a_saved_snapshot(ctx: CaseContext) -> None:
    """A snapshot reads back whole on either instance, its record's steps[].decision,
    input_hash, tool_calls and origin included; another tenant's reads `None`."""
    snapshot = _snapshot("exec-1", ctx.clock.now(), record=RECORD)
    await _history(ctx, 0).save(snapshot)
    for instance in (0, 1):
        got = await _history(ctx, instance).get(TENANT, "exec-1")
        _expect(got == snapshot, "record-json", f"saved {snapshot}, read back {got}")
    other = await _history(ctx, 1).get("tenant-2", "exec-1")
    _expect(other is None, "tenant-isolation", f"another tenant reads the snapshot: {other}")
    unknown = await _history(ctx, 1).get(TENANT, "exec-unknown")
    _expect(unknown is None, "record-json", f"an unknown run reads {unknown}")


async def replaces_a_snapshot_by_tenant_and_execution(ctx: CaseContext) -> None:
    """A second save of one run replaces the first (one row, listed once); the same id
    under another tenant is another run."""
    now = ctx.clock.now()
    first = _snapshot("exec-1", now, status="failed", record={"attempt": 1})
    await _history(ctx, 0).save(first)
    second = dataclasses.replace(first, status="succeeded", finished_at=now + 10, record=RECORD)
    await _history(ctx, 1).save(second)
    got = await _history(ctx, 0).get(TENANT, "exec-1")
    _expect(got == second, "upsert", f"after two saves the run reads {got}")
    listed = await _history(ctx, 0).list(TENANT)
    _expect(list(listed) == [second], "upsert", f"after two saves list() gives {listed}")
    theirs = _snapshot("exec-1", now, tenant_id="tenant-2")
    await _history(ctx, 1).save(theirs)
    mine = await _history(ctx, 0).get(TENANT, "exec-1")
    _expect(mine == second, "tenant-isolation", f"another tenant's save replaced: {mine}")
    got_theirs = await _history(ctx, 0).get("tenant-2", "exec-1")
    _expect(got_theirs == theirs, "tenant-isolation", f"tenant-2's run reads {got_theirs}")


async def keeps_one_snapshot_under_concurrent_saves(ctx: CaseContext) -> None:
    """Ten saves of one run at once through both instances: no error, one snapshot, equal
    to one of the saves."""
    now = ctx.clock.now()
    saves = [_snapshot("exec-1", now + i, record={"writer": i}) for i in range(10)]
    await asyncio.gather(*(_history(ctx, i % 2).save(s) for i, s in enumerate(saves)))
    listed = await _history(ctx, 1).list(TENANT)
    _expect(len(listed) == 1, "upsert", f"ten saves of one run list {len(listed)} snapshots")
    _expect(listed[0] in saves, "upsert", f"the stored snapshot is none of the saves: {listed[0]}")


async def lists_newest_first_in_keyset_pages(ctx: CaseContext) -> None:
    """Pages of every size, each continuing after the last snapshot of the one before,
    give every run once, newest first — with many runs finished in one millisecond."""
    now = ctx.clock.now()
    finished = [now, now, now, now + 1, now + 1, now + 5, now + 5, now + 5, now + 5, now + 9]
    saved: list[ExecutionSnapshot] = []
    for i, at in enumerate(finished):
        for suffix in ("a", "B", "c-10", "c-9"):
            saved.append(_snapshot(f"run-{i:02d}-{suffix}", at))
    saved.append(_snapshot("run-zz", now + 5))
    saved.append(_snapshot("RUN-zz", now + 5))
    for i, snapshot in enumerate(saved):
        await _history(ctx, i % 2).save(snapshot)
    await _history(ctx, 1).save(_snapshot("other-tenant", now + 5, tenant_id="tenant-2"))
    whole = list(await _history(ctx, 0).list(TENANT, limit=1_000))
    _expect(
        sorted(_ids(whole)) == sorted(_ids(saved)) and len(whole) == len(saved),
        "page-no-skip-no-repeat",
        f"one page of limit 1000 lists {len(whole)} runs, {len(saved)} were saved",
    )
    times = [s.finished_at for s in whole]
    _expect(times == sorted(times, reverse=True), "newest-first", f"finished_at order: {times}")
    for limit in (1, 2, 3, 4, 7, len(saved) - 1, len(saved), len(saved) + 1):
        pages = await _all_pages(_history(ctx, limit % 2), limit)
        flat = [s for page in pages for s in page]
        repeated = sorted({i for i in _ids(flat) if _ids(flat).count(i) > 1})
        skipped = sorted(set(_ids(whole)) - set(_ids(flat)))
        _expect(
            not repeated and not skipped,
            "page-no-skip-no-repeat",
            f"pages of {limit}: repeated {repeated[:5]}, skipped {skipped[:5]}",
        )
        _expect(
            _ids(flat) == _ids(whole),
            "page-no-skip-no-repeat",
            f"pages of {limit} list the runs in another order than one page does",
        )
        _expect(
            all(len(page) == limit for page in pages[:-1]),
            "page-limit",
            f"pages of {limit}: a page before the last was short: {[len(p) for p in pages]}",
        )


async def lists_runs_finished_in_since_until(ctx: CaseContext) -> None:
    """`since` is inclusive and `until` exclusive, by `finished_at`; pages keep to them."""
    now = ctx.clock.now()
    for i in range(10):
        await _history(ctx, i % 2).save(_snapshot(f"run-{i}", now + 10 * (i // 2)))
    # finished_at: run-0/1 at now, 2/3 at +10, 4/5 at +20, 6/7 at +30, 8/9 at +40
    windows = [
        (None, None, 10),
        (now + 10, None, 8),
        (now + 11, None, 6),
        (None, now + 30, 6),
        (None, now + 31, 8),
        (now + 10, now + 30, 4),
        (now + 20, now + 20, 0),
        (now + 50, None, 0),
    ]
    for since, until, count in windows:
        got = list(await _history(ctx, 1).list(TENANT, since=since, until=until))
        _expect(
            len(got) == count
            and all(
                (since is None or s.finished_at >= since)
                and (until is None or s.finished_at < until)
                for s in got
            ),
            "since-until",
            f"list(since={since}, until={until}) gave {len(got)} runs finished at "
            f"{[s.finished_at for s in got]}, expected {count}",
        )
        pages = await _all_pages(_history(ctx, 0), 3, since=since, until=until)
        flat = [s for page in pages for s in page]
        _expect(
            _ids(flat) == _ids(got),
            "page-no-skip-no-repeat",
            f"pages of 3 in [since={since}, until={until}) list {_ids(flat)}, one page {_ids(got)}",
        )


async def purges_runs_finished_before_retention(ctx: CaseContext) -> None:
    """`purge(older_than)` deletes every tenant's snapshots finished before `older_than`
    (one finished exactly then stays) and answers how many."""
    now = ctx.clock.now()
    for i in range(6):
        await _history(ctx, i % 2).save(_snapshot(f"run-{i}", now + 100 * i))
    await _history(ctx, 1).save(_snapshot("theirs", now + 50, tenant_id="tenant-2"))
    none = await _history(ctx, 0).purge(now)
    _expect(none == 0, "purge-count", f"purge({now}) with nothing older answered {none}")
    purged = await _history(ctx, 1).purge(now + 200)
    _expect(
        purged == 3,
        "purge-count",
        f"purge(+200) answered {purged}, expected 3 (run-0, run-1, tenant-2's run)",
    )
    left = _ids(await _history(ctx, 0).list(TENANT))
    _expect(left == ["run-5", "run-4", "run-3", "run-2"], "purge-count", f"left: {left}")
    gone = await _history(ctx, 0).get("tenant-2", "theirs")
    _expect(gone is None, "purge-count", f"tenant-2's old run survived: {gone}")
    again = await _history(ctx, 1).purge(now + 200)
    _expect(again == 0, "purge-count", f"a second purge answered {again}")


CASES: list[tuple[str, Callable[[CaseContext], Awaitable[None]]]] = [
    ("reads back a saved snapshot", reads_back_a_saved_snapshot),
    (
        "replaces a snapshot by tenant and execution id",
        replaces_a_snapshot_by_tenant_and_execution,
    ),
    ("keeps one snapshot under concurrent saves", keeps_one_snapshot_under_concurrent_saves),
    (
        "lists newest first in keyset pages, without skip or repeat over equal finished_at",
        lists_newest_first_in_keyset_pages,
    ),
    ("lists runs finished from since and before until", lists_runs_finished_in_since_until),
    ("purges runs finished before retention", purges_runs_finished_before_retention),
]


def cases() -> list[Case]:
    """The history's cases (none is a fencing case: history is not fenced)."""
    return [Case(CONTRACT, name, run) for name, run in CASES]


__all__ = ["CONTRACT", "cases"]
