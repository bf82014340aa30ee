"""`SqlMeshRequestRepository`: one run per incoming request, by its tenant and idempotency
key.

Statements per operation, every dialect: `save_if_absent` one (the insert-if-absent)
when it creates the request, two when the key was there (the insert, then a read of the
stored row); `complete` one (a conditional update); `get` one.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from agboss_sql.contracts.errors import IdempotencyKeyConflictError
from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import checked_mesh_request
from agboss_sql.contracts.stores import MeshRequestRepository
from agboss_sql.contracts.types import (
    JsonValue,
    MeshRequest,
    MeshRequestSaved,
)
from agboss_sql.sql._base import ApplicationClockStore, dumps, loads
from agboss_sql.sql.connection import SqlBuilder
from agboss_sql.sql.schema import mesh_requests

M = mesh_requests
_COLUMNS = ("idempotency_key", "tenant_id", "fingerprint", "received_at", "completed", "response")

# A request whose stored row vanished between our insert and our read (never deleted by this
# store) is inserted again; past this many rounds something else keeps deleting it.
_MAX_ROUNDS = 3


class MeshStatements:
    """The mesh request statements for one dialect."""

    def __init__(self, b: SqlBuilder) -> None:
        ops = b.ops
        self.insert = ops.insert_if_absent(M, ["idempotency_key", "tenant_id"]).values(
            idempotency_key=sa.bindparam("idempotency_key"),
            tenant_id=sa.bindparam("tenant_id"),
            fingerprint=sa.bindparam("fingerprint"),
            received_at=sa.bindparam("received_at", type_=sa.BigInteger),
            completed=sa.false(),
            response=sa.null(),
        )
        self.read = sa.select(*(M.c[c] for c in _COLUMNS)).where(
            M.c.idempotency_key == sa.bindparam("idempotency_key"),
            M.c.tenant_id == sa.bindparam("tenant_id"),
        )
        self.complete = (
            sa.update(M)
            .where(
                M.c.idempotency_key == sa.bindparam("idempotency_key"),
                M.c.tenant_id == sa.bindparam("tenant_id"),
                M.c.completed.is_(sa.false()),
            )
            .values(completed=sa.true(), response=sa.bindparam("response"))
        )


def _request_of(row: Any) -> MeshRequest:
    key, tenant_id, fingerprint, received_at, completed, response = row
    return MeshRequest(
        idempotency_key=key,
        tenant_id=tenant_id,
        fingerprint=fingerprint,
        received_at=int(received_at),
        response=loads(response),
        completed=bool(completed),
    )


class SqlMeshRequestRepository(ApplicationClockStore[MeshStatements], MeshRequestRepository):
    """Incoming requests on SQL, one run per tenant and idempotency key.

    The table's primary key is (idempotency key, tenant): another tenant's request under the
    same key is another request, never answered nor refused by it. The same tenant and key
    with another fingerprint is `IdempotencyKeyConflictError`. The first insert wins,
    whichever instance sends it.
    """

    statements = MeshStatements

    async def save_if_absent(
        self, idempotency_key: str, tenant_id: str, fingerprint: str, received_at: int
    ) -> MeshRequestSaved:
        """Insert the request unless the tenant stored one under its key (one statement);
        else read the stored row. The stored request and whether this call created it; the
        same tenant and key with another fingerprint is `IdempotencyKeyConflictError`."""
        checked_mesh_request(idempotency_key, tenant_id, fingerprint, received_at)
        params = {
            "idempotency_key": idempotency_key,
            "tenant_id": tenant_id,
            "fingerprint": fingerprint,
            "received_at": received_at,
        }
        for _ in range(_MAX_ROUNDS):
            if await self.connection.insert_if_absent(self._sql.insert, params):
                return MeshRequestSaved(
                    MeshRequest(idempotency_key, tenant_id, fingerprint, received_at), True
                )
            row = (await self.connection.execute(self._sql.read, params)).first()
            if row is None:
                continue
            stored = _request_of(row)
            if stored.idempotency_key != idempotency_key or stored.tenant_id != tenant_id:
                # MySQL's PAD SPACE collations compare 'k' and 'k ' equal: never answer
                # another key's request as this one's.
                raise IdempotencyKeyConflictError(
                    f"idempotency key {idempotency_key!r} collides in this database with the "
                    f"stored key {stored.idempotency_key!r}: use a key without trailing spaces"
                )
            if stored.fingerprint != fingerprint:
                raise IdempotencyKeyConflictError(
                    f"idempotency key {idempotency_key!r} was used before with another "
                    "request: use a new key for new content"
                )
            return MeshRequestSaved(stored, False)
        raise RuntimeError(
            f"mesh request {idempotency_key!r} was refused as a duplicate {_MAX_ROUNDS} times "
            "but could not be read back: something is deleting mesh requests"
        )

    async def complete(self, tenant_id: str, idempotency_key: str, response: JsonValue) -> bool:
        """Store the response of the tenant's request not completed yet (one conditional
        update on key and tenant). True when this call stored it; a second completion, or
        one by another tenant, changes nothing."""
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("idempotency_key", idempotency_key)
        params = {"idempotency_key": idempotency_key, "tenant_id": tenant_id}
        result = await self.connection.execute(
            self._sql.complete, {**params, "response": dumps(response)}
        )
        return result.rowcount == 1

    async def get(self, tenant_id: str, idempotency_key: str) -> MeshRequest | None:
        """The tenant's stored request, or `None` (also for another tenant's)."""
        checked_identifier("tenant_id", tenant_id)
        checked_identifier("idempotency_key", idempotency_key)
        params = {"idempotency_key": idempotency_key, "tenant_id": tenant_id}
        row = (await self.connection.execute(self._sql.read, params)).first()
        if row is None or row[0] != idempotency_key or row[1] != tenant_id:
            return None
        return _request_of(row)
