"""An outbound call made at most once per attempt: record the intent, claim an attempt,
send it, end it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agboss_sql.contracts import (
    AttemptRef,
    CorruptStoredRowError,
    FencedEffectKey,
    JsonValue,
    OutboundCall,
    OutboundCallRepository,
    OutboundCallStatus,
    attempt_owner_of,
)

Send = Callable[[int], Awaitable[JsonValue]]
"""Sends attempt N to the other system and answers its response. Called only for an
attempt this caller has just claimed; it should check that the lease is still trusted
(`LeaseKeeper.guard()`) right before it sends."""


async def outbound_call(
    outbound: OutboundCallRepository,
    key: FencedEffectKey,
    intent: JsonValue,
    recorded_at: int,
    send: Send,
) -> OutboundCall:
    """Drive the call under `key` until it is completed, and answer the completed call.

    Records `intent` (or finds the recorded one), then, while the call is not completed,
    claims the next attempt (`mark_pending` from the state it read), sends it through
    `send` and ends it (`mark_completed`). Each attempt is sent at most once, and only by
    the caller that claimed it: an attempt found pending — one claimed by an earlier try
    of this same caller whose outcome it did not see (the reply of its claim or of its end
    was lost, or the caller failed between the send and the end), or by a holder of an
    older lease — is never sent again; the next attempt is claimed instead. A completed
    call is answered without a send.

    Store errors propagate as they are (a fenced refusal once the lease is lost, a typed
    outage): calling again later, under the same or a newer lease, goes on from what the
    store holds.
    """
    owner = attempt_owner_of(key)
    call = (await outbound.save_if_absent(key, intent, recorded_at)).call
    while call.status is not OutboundCallStatus.COMPLETED:
        expected = AttemptRef(call.status, call.attempt, call.attempt_owner)
        if await outbound.mark_pending(key, expected, owner):
            attempt = call.attempt + 1
            response = await send(attempt)
            await outbound.mark_completed(
                key, AttemptRef(OutboundCallStatus.PENDING, attempt, owner), response
            )
        found = await outbound.get(key)
        if found is None:
            raise CorruptStoredRowError(f"the outbound call {key.name!r} vanished from its store")
        call = found
    return call
