"""The lease and mark check every fenced write of the SQL stores makes first.

The scope's high-water mark lives on the lease row (`fence_token`), so one
conditional `UPDATE` of that row is the whole check: it takes the row lock,
requires the lease held at the key's token by the instance the key names, not
released/yielded/finished and live by the store's time (read once, inside the statement), requires the mark
not above the token, and raises the mark to the token. One row matched: the
write may go on in the same transaction, which keeps the lock until it ends,
so a takeover waits for the commit or the commit sees the takeover. No row: a
diagnosing read names the reason and the write is refused with
`ExecutionFencedError`.

The check always changes the row (`fence_writes` goes up by one), even when the mark is
already at the token: on a cluster that certifies write sets (Galera), where row locks
are local to a node, a takeover committed on another node and this fenced write then
touch one row, and the later of the two fails certification at COMMIT (a transient
conflict: the step runs again and the fence sees the takeover). An update that changed
nothing would not be certified at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa

from agboss_sql.contracts.clocks import StoreClock
from agboss_sql.contracts.rules import FenceRefusal, fence_refusal_of, fenced_error
from agboss_sql.sql.connection import Exec, SqlBuilder, SqlConnection, Step
from agboss_sql.sql.schema import execution_leases

T = TypeVar("T")

L = execution_leases

MAX_CLAIM_ATTEMPTS = 12
"""How often a step that lost a race for a unique key is run again before giving up."""


class FenceKey(Protocol):
    """What the fence reads of a write's key (a `FencedEffectKey`, or the lease a fenced
    checkpoint write carries): the lease's tenant and execution, the token, the instance it
    was granted to, and the scope a refusal names."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def lease_execution_id(self) -> str: ...
    @property
    def token(self) -> int: ...
    @property
    def holder_instance_id(self) -> str: ...
    @property
    def scope_key(self) -> str: ...


class FenceStatements:
    """The fence (check and mark raise in one statement) and its diagnosis, per dialect."""

    def __init__(self, b: SqlBuilder) -> None:
        _, now = b.now()
        token = sa.bindparam("token", type_=sa.BigInteger)
        this_lease = sa.and_(
            L.c.tenant_id == sa.bindparam("tenant_id"),
            L.c.execution_id == sa.bindparam("execution_id"),
        )
        self.fence = (
            sa.update(L)
            .where(
                this_lease,
                L.c.lease_epoch == token,
                L.c.holder_instance_id == sa.bindparam("holder_instance_id"),
                L.c.released.is_(sa.false()),
                L.c.yielded.is_(sa.false()),
                L.c.finished.is_(sa.false()),
                L.c.expires_at > now,
                L.c.fence_token <= token,
            )
            .values(fence_token=token, fence_writes=L.c.fence_writes + 1)
        )
        self.diagnose = sa.select(
            L.c.lease_epoch,
            L.c.released,
            L.c.yielded,
            L.c.finished,
            L.c.closed_reason,
            L.c.expires_at,
            L.c.fence_token,
            now.label("now"),
            L.c.holder_instance_id,
        ).where(this_lease)


def refusal_of(row: Any | None, token: int, holder: str) -> FenceRefusal:
    """Why the lease row `row` (a `diagnose` row, or `None`) refuses a write at `token` of
    `holder`: `fence_refusal_of`'s reason, the same the in-memory fence names."""
    if row is None:
        return FenceRefusal.LEASE_ABSENT
    epoch, released, yielded, finished, closed_reason, expires_at, mark, now, granted_to = row
    reason = fence_refusal_of(
        token,
        holder=holder,
        epoch=epoch,
        granted_to=granted_to,
        released=bool(released),
        yielded=bool(yielded),
        finished=bool(finished),
        closed_reason=closed_reason,
        expires_at=expires_at,
        now=now,
        mark=mark,
    )
    # Epochs and marks only grow and a lease that ended never comes back at its epoch:
    # the one condition a later read can see otherwise is the time, when the database
    # clock stepped back between the two statements.
    return FenceRefusal.EXPIRED if reason is None else reason


def store_time_params(clock: StoreClock, **params: Any) -> dict[str, Any]:
    """`params`, with the store's time bound as `now` when a test clock is injected (read
    once per operation, so every statement of it sees the same time); database time is
    read inside each statement instead."""
    if not clock.is_database_time:
        params["now"] = clock.now()
    return params


def fence_params(key: FenceKey, clock: StoreClock) -> dict[str, Any]:
    """The fence's parameters for `key` (`store_time_params`), with the holder it names."""
    return store_time_params(
        clock,
        tenant_id=key.tenant_id,
        execution_id=key.lease_execution_id,
        token=key.token,
        holder_instance_id=key.holder_instance_id,
    )


def fenced(sql: FenceStatements, key: FenceKey, params: dict[str, Any]) -> Step[None]:
    """The lease and mark check of a write under `key`: the first statement of its step."""
    if (yield Exec(sql.fence, params)).rowcount == 1:
        return None
    row = (yield Exec(sql.diagnose, params)).first()
    raise fenced_error(key, refusal_of(row, key.token, key.holder_instance_id))


async def fence_on(
    connection: SqlConnection, tx: Any, sql: FenceStatements, key: FenceKey, params: dict[str, Any]
) -> None:
    """`fenced`, sent with `connection.execute_on` in the caller's transaction `tx` (a
    fenced effect's: no step to drive)."""
    if (await connection.execute_on(tx, sql.fence, params)).rowcount == 1:
        return
    row = (await connection.execute_on(tx, sql.diagnose, params)).first()
    raise fenced_error(key, refusal_of(row, key.token, key.holder_instance_id))


async def run_claiming(connection: SqlConnection, factory: Callable[[], Step[T]]) -> T:
    """Run a fenced step in one transaction (retried on transient conflicts by the
    connection), and run it again when it lost a race for a unique key: a claimer that
    commits between this step's read and its insert makes the insert fail, and the next
    run reads that claimer's row."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return await connection.run(factory, transaction=True)
        except Exception as exc:
            if attempt >= MAX_CLAIM_ATTEMPTS or not connection.ops.is_unique_violation(exc):
                raise
