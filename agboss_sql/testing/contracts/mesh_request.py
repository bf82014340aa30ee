"""Contract suite of `MeshRequestRepository` (docs/contracts.md): one run per incoming request.

An idempotency key is saved once per tenant (whichever instance receives the request
first), the same tenant and key with another fingerprint is `IdempotencyKeyConflictError`,
and the response is stored once, so a retried request gets the first run's answer. Keys
are per tenant: two tenants using one key never see nor collide with each other's request.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

from agboss_sql.contracts.errors import IdempotencyKeyConflictError
from agboss_sql.contracts.stores import MeshRequestRepository
from agboss_sql.contracts.types import MeshRequest
from agboss_sql.testing._case import Case, CaseContext
from agboss_sql.testing.contracts._limits import limit_cases
from agboss_sql.testing.contracts._mesh_request_more import more_cases

CONTRACT = "mesh_request"
TENANT = "tenant-1"
FINGERPRINT = "sha256:" + "ab" * 32


def _expect(condition: bool, rule: str, message: str) -> None:
    if not condition:
        raise AssertionError(f"[{rule}] {message}")


def _mesh(ctx: CaseContext, instance: int = 0) -> MeshRequestRepository:
    store: MeshRequestRepository = ctx.store(CONTRACT, instance)
    return store


async def creates_a_request_once(ctx: CaseContext) -> None:
    """The first save creates the request; a retry with the same fingerprint, on either
    instance, gets the stored request (the first `received_at`) and `created` False."""
    received = ctx.clock.now()
    request, created = await _mesh(ctx, 0).save_if_absent("key-1", TENANT, FINGERPRINT, received)
    want = MeshRequest("key-1", TENANT, FINGERPRINT, received, None, False)
    _expect(created, "create-once", "the first save did not create the request")
    _expect(request == want, "create-once", f"the first save answered {request}, want {want}")
    await ctx.clock.advance(1_000)
    retry, created = await _mesh(ctx, 1).save_if_absent(
        "key-1", TENANT, FINGERPRINT, ctx.clock.now()
    )
    _expect(not created, "create-once", "a retried request was created a second time")
    _expect(retry == want, "create-once", f"the retry answered {retry}, expected {want}")
    got = await _mesh(ctx, 1).get(TENANT, "key-1")
    _expect(got == want, "create-once", f"get() reads {got}")
    unknown = await _mesh(ctx, 0).get(TENANT, "key-unknown")
    _expect(unknown is None, "create-once", f"an unknown key reads {unknown}")


async def creates_a_request_once_under_concurrent_saves(ctx: CaseContext) -> None:
    """Ten saves of one key at once through both instances, round after round: exactly one
    creates it, and every save answers the winner's request."""
    for round_ in range(5):
        key = f"key-{round_}"
        start = ctx.clock.now()
        results = await asyncio.gather(
            *(
                _mesh(ctx, i % 2).save_if_absent(key, TENANT, FINGERPRINT, start + i)
                for i in range(10)
            )
        )
        creators = [i for i, (_, created) in enumerate(results) if created]
        _expect(
            len(creators) == 1,
            "create-once",
            f"round {round_ + 1}: {len(creators)} of 10 concurrent saves created {key}",
        )
        stored = {request.received_at for request, _ in results}
        _expect(
            stored == {start + creators[0]},
            "create-once",
            f"round {round_ + 1}: the saves answered received_at {sorted(stored)}, the "
            f"creator saved {start + creators[0]}",
        )


async def refuses_a_key_with_another_fingerprint(ctx: CaseContext) -> None:
    """The same key with another fingerprint is `IdempotencyKeyConflictError`, from either
    instance, and leaves the stored request as it was."""
    received = ctx.clock.now()
    await _mesh(ctx, 0).save_if_absent("key-1", TENANT, FINGERPRINT, received)
    for instance in (0, 1):
        try:
            await _mesh(ctx, instance).save_if_absent("key-1", TENANT, "sha256:other", received + 1)
        except IdempotencyKeyConflictError:
            pass
        else:
            raise AssertionError(
                "[fingerprint-conflict] the same key with another fingerprint was accepted"
            )
    got = await _mesh(ctx, 1).get(TENANT, "key-1")
    _expect(
        got == MeshRequest("key-1", TENANT, FINGERPRINT, received),
        "fingerprint-conflict",
        f"the refused save changed the request: {got}",
    )


async def lets_one_fingerprint_win_concurrent_saves_of_one_key(ctx: CaseContext) -> None:
    """Saves of one key with two fingerprints at once: one save creates it; every save of
    the other fingerprint is `IdempotencyKeyConflictError`, never created."""
    for round_ in range(4):
        key = f"key-{round_}"
        prints = [f"print-{i % 2}" for i in range(8)]
        results = await asyncio.gather(
            *(
                _mesh(ctx, i % 2).save_if_absent(key, TENANT, fp, ctx.clock.now())
                for i, fp in enumerate(prints)
            ),
            return_exceptions=True,
        )
        stored = await _mesh(ctx, 0).get(TENANT, key)
        _expect(stored is not None, "create-once", f"round {round_ + 1}: nothing stored")
        assert stored is not None
        for fp, result in zip(prints, results, strict=True):
            if fp == stored.fingerprint:
                _expect(
                    not isinstance(result, BaseException),
                    "create-once",
                    f"round {round_ + 1}: a save of the stored fingerprint failed: {result!r}",
                )
            else:
                _expect(
                    isinstance(result, IdempotencyKeyConflictError),
                    "fingerprint-conflict",
                    f"round {round_ + 1}: a save with the other fingerprint gave {result!r}",
                )
        created = [r for r in results if not isinstance(r, BaseException) and r.created]
        _expect(len(created) == 1, "create-once", f"round {round_ + 1}: {len(created)} created")


async def stores_the_response_once(ctx: CaseContext) -> None:
    """`complete` stores the response and marks the request completed once; a second
    complete is False and the first response stands; a retry then reads it."""
    received = ctx.clock.now()
    await _mesh(ctx, 0).save_if_absent("key-1", TENANT, FINGERPRINT, received)
    done = await _mesh(ctx, 1).complete(TENANT, "key-1", {"answer": [1, "zwei", None], "ok": True})
    _expect(done, "complete-once", "the first complete returned False")
    again = await _mesh(ctx, 0).complete(TENANT, "key-1", {"answer": "overwritten"})
    _expect(not again, "complete-once", "a second complete returned True")
    want = MeshRequest(
        "key-1", TENANT, FINGERPRINT, received, {"answer": [1, "zwei", None], "ok": True}, True
    )
    got = await _mesh(ctx, 0).get(TENANT, "key-1")
    _expect(got == want, "complete-once", f"after two completes get() reads {got}")
    retry, created = await _mesh(ctx, 1).save_if_absent("key-1", TENANT, FINGERPRINT, received + 5)
    _expect(
        (retry, created) == (want, False),
        "complete-once",
        f"a retry after the response answered {retry}, created={created}",
    )
    unknown = await _mesh(ctx, 1).complete(TENANT, "key-unknown", "x")
    _expect(not unknown, "complete-once", "completing an unknown key returned True")
    _expect(
        await _mesh(ctx, 0).get(TENANT, "key-unknown") is None,
        "complete-once",
        "completing an unknown key created it",
    )


async def stores_one_of_concurrent_responses(ctx: CaseContext) -> None:
    """Ten completes of one request at once through both instances: one returns True and
    its response is the one stored."""
    for round_ in range(4):
        key = f"key-{round_}"
        await _mesh(ctx, round_ % 2).save_if_absent(key, TENANT, FINGERPRINT, ctx.clock.now())
        done = await asyncio.gather(
            *(_mesh(ctx, i % 2).complete(TENANT, key, {"by": i}) for i in range(10))
        )
        winners = [i for i, ok in enumerate(done) if ok]
        _expect(
            len(winners) == 1,
            "complete-once",
            f"round {round_ + 1}: {len(winners)} of 10 concurrent completes returned True",
        )
        got = await _mesh(ctx, 1).get(TENANT, key)
        _expect(
            got is not None and got.completed and got.response == {"by": winners[0]},
            "complete-once",
            f"round {round_ + 1}: complete {winners[0]} won but the request reads {got}",
        )


async def another_tenant_neither_reads_nor_completes(ctx: CaseContext) -> None:
    """`get` and `complete` are by tenant and key: another tenant, with the key, neither
    reads the request (nor its response) nor completes it."""
    received = ctx.clock.now()
    await _mesh(ctx, 0).save_if_absent("key-1", TENANT, FINGERPRINT, received)
    other = "tenant-2"
    seen = await _mesh(ctx, 1).get(other, "key-1")
    _expect(seen is None, "tenant-apart", f"another tenant's get() read {seen}")
    done = await _mesh(ctx, 1).complete(other, "key-1", {"from": "the other tenant"})
    _expect(not done, "tenant-apart", "another tenant's complete() returned True")
    got = await _mesh(ctx, 0).get(TENANT, "key-1")
    want = MeshRequest("key-1", TENANT, FINGERPRINT, received, None, False)
    _expect(got == want, "tenant-apart", f"after another tenant's complete, get() reads {got}")
    mine = await _mesh(ctx, 0).complete(TENANT, "key-1", {"ok": True})
    _expect(mine, "tenant-apart", "the tenant's own complete returned False")
    seen = await _mesh(ctx, 1).get(other, "key-1")
    _expect(seen is None, "tenant-apart", f"another tenant's get() read the response: {seen}")


async def two_tenants_under_one_key_each_get_their_own(ctx: CaseContext) -> None:
    """Keys are per tenant: another tenant's save under a key the first tenant used (with
    the same or another fingerprint) creates its own request, from either instance, under
    concurrent saves too; each tenant's retries, `get` and `complete` see only its own."""
    other = "tenant-2"
    first = ctx.clock.now()
    await _mesh(ctx, 0).save_if_absent("key-1", TENANT, FINGERPRINT, first)
    await _mesh(ctx, 0).complete(TENANT, "key-1", {"for": TENANT})
    try:
        theirs, created = await _mesh(ctx, 1).save_if_absent(
            "key-1", other, "sha256:other", first + 1
        )
    except IdempotencyKeyConflictError as exc:
        raise AssertionError(
            f"[tenant-apart] another tenant's save under a key the first tenant used was "
            f"refused as a conflict: keys are per tenant ({exc})"
        ) from None
    want = MeshRequest("key-1", other, "sha256:other", first + 1, None, False)
    _expect(created, "tenant-apart", "another tenant's first save under the key was a replay")
    _expect(theirs == want, "tenant-apart", f"another tenant's save answered {theirs}")
    again, created = await _mesh(ctx, 0).save_if_absent("key-1", other, "sha256:other", first + 2)
    _expect(
        (again, created) == (want, False),
        "tenant-apart",
        f"the other tenant's retry answered {again}, created={created}",
    )
    mine = MeshRequest("key-1", TENANT, FINGERPRINT, first, {"for": TENANT}, True)
    got = await _mesh(ctx, 1).get(TENANT, "key-1")
    _expect(got == mine, "tenant-apart", f"the first tenant's request reads {got}")
    done = await _mesh(ctx, 0).complete(other, "key-1", {"for": other})
    _expect(done, "tenant-apart", "the other tenant could not complete its own request")
    got = await _mesh(ctx, 1).get(other, "key-1")
    _expect(
        got == dataclasses.replace(want, response={"for": other}, completed=True),
        "tenant-apart",
        f"the other tenant's request reads {got}",
    )
    got = await _mesh(ctx, 0).get(TENANT, "key-1")
    _expect(got == mine, "tenant-apart", f"the other tenant's complete changed {got}")
    # Both tenants' first saves of a new key at once: each tenant's request is created once.
    for round_ in range(3):
        key = f"key-both-{round_}"
        results = await asyncio.gather(
            *(
                _mesh(ctx, i % 2).save_if_absent(
                    key, (TENANT, other)[i % 2], FINGERPRINT, ctx.clock.now()
                )
                for i in range(6)
            )
        )
        for i, result in enumerate(results):
            _expect(
                result.request.tenant_id == (TENANT, other)[i % 2],
                "tenant-apart",
                f"round {round_ + 1}: a save of {(TENANT, other)[i % 2]} answered {result.request}",
            )
        for tenant in (TENANT, other):
            created_count = sum(1 for r in results if r.created and r.request.tenant_id == tenant)
            _expect(
                created_count == 1,
                "tenant-apart",
                f"round {round_ + 1}: {created_count} saves created {tenant}'s request",
            )


CASES: list[tuple[str, Callable[[CaseContext], Awaitable[None]]]] = [
    (
        "another tenant neither reads nor completes a request",
        another_tenant_neither_reads_nor_completes,
    ),
    ("creates a request once", creates_a_request_once),
    (
        "creates a request once under concurrent saves",
        creates_a_request_once_under_concurrent_saves,
    ),
    ("refuses a key with another fingerprint", refuses_a_key_with_another_fingerprint),
    (
        "lets one fingerprint win concurrent saves of one key",
        lets_one_fingerprint_win_concurrent_saves_of_one_key,
    ),
    ("stores the response once", stores_the_response_once),
    ("stores one of concurrent responses", stores_one_of_concurrent_responses),
    (
        "two tenants under one key each get their own request",
        two_tenants_under_one_key_each_get_their_own,
    ),
]


def cases() -> list[Case]:
    """The mesh requests' cases (none is a fencing case: mesh requests are not fenced)."""
    return [Case(CONTRACT, name, run) for name, run in CASES] + more_cases() + limit_cases(CONTRACT)


__all__ = ["CONTRACT", "cases"]
