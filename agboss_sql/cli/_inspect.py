"""The subcommands of `agboss-sql` that read a live database: `check` (readiness, schema,
clock skew) and `leases` (the lease log)."""

from __future__ import annotations

import argparse

from agboss_sql.cli._common import (
    MISUSED,
    CommandFailed,
    _advice,
    _revision,
    _select,
    add_url_argument,
    collation_lines,
    database_url,
    existing_database,
    require_head,
    shown,
)

# --- check -----------------------------------------------------------------------------


def _check_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument(
        "--strict", action="store_true", help="an opted-out fencing store is an error"
    )
    parser.add_argument(
        "--require-sync",
        action="store_true",
        help="PostgreSQL: not ready unless the server is a primary with a synchronous standby "
        "(a failover then loses no acknowledged commit); without it, a warning",
    )


def _check(args: argparse.Namespace) -> int:
    import asyncio

    from sqlalchemy.engine import make_url

    given = make_url(database_url(args))
    if args.require_sync and given.get_backend_name() != "postgresql":
        raise CommandFailed(
            f"--require-sync checks PostgreSQL's synchronous replication; {shown(str(given))} "
            f"is {given.get_backend_name()}",
            MISUSED,
        )
    url = existing_database(args, stores=True)
    return asyncio.run(_check_async(url, strict=args.strict, require_sync=args.require_sync))


async def _check_async(url: str, *, strict: bool, require_sync: bool = False) -> int:
    import time

    from agboss_sql.application import Application, DatabaseUrl, HealthStatus, sql_stores
    from agboss_sql.sql import migrate
    from agboss_sql.sql.connection import SqlConnection

    print(f"database: {shown(url)}")
    healthy = True
    revision, head = migrate.current(url), migrate.head()
    if revision == head:
        print(f"schema: {revision} (head)")
    else:
        healthy = False
        print(f"schema: {_revision(revision)}, head is {head}: {_advice(url, revision)}")
    collated, collation = collation_lines(url)
    healthy = healthy and collated
    for line in collation:
        print(line)
    if revision is not None:
        # A database that runs leases: a failover must not lose a granted epoch.
        from agboss_sql.cli._replication import replication_of

        replication = replication_of(url)
        if replication is not None:
            for line in replication.lines():
                print(line)
            if replication.in_recovery:
                healthy = False
            elif require_sync and not replication.safe:
                healthy = False
                print("replication: refused (--require-sync): no synchronous standby")
    # The report says what is wrong with the schema; start() would refuse it instead.
    app = Application(
        "agboss-sql-check",
        sql_stores(),
        {DatabaseUrl: DatabaseUrl(url)},
        strict=strict,
        require_schema=False,
    )
    await app.start()
    try:
        if revision is None:
            # Each store would answer "up" on tables that do not exist.
            print("stores: not checked: the database has no agboss schema")
        else:
            report = await app.check_readiness()
            print(report)
            healthy = healthy and report.status is HealthStatus.UP
        connection = SqlConnection(url)
        try:
            now = connection.ops.now_ms()
            sent = time.time_ns() / 1e6
            database_now = (await connection.execute(_select(now))).scalar()
            received = time.time_ns() / 1e6
        finally:
            await connection.close()
        skew = float(database_now or 0) - (sent + received) / 2
        print(
            f"clock skew: the database's clock is {skew:+.0f} ms from this host's "
            f"(round trip {received - sent:.1f} ms); leases are decided by the database's clock"
        )
    finally:
        await app.close()
    print("ready" if healthy else "NOT ready")
    return 0 if healthy else 1


# --- leases ----------------------------------------------------------------------------


def _leases_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument("--tenant", help="with --execution: one lease and its whole log")
    parser.add_argument("--execution", help="with --tenant: the execution (tree root or child) id")
    parser.add_argument("--limit", type=int, default=20, help="recent events to show")


def _leases(args: argparse.Namespace) -> int:
    import asyncio

    if (args.tenant is None) != (args.execution is None):
        given, missing = ("--tenant", "--execution") if args.tenant else ("--execution", "--tenant")
        raise CommandFailed(
            f"{given} needs {missing}: a lease is named by both (without either, the recent "
            "moves of every lease are shown)",
            MISUSED,
        )
    if args.limit < 1:
        raise CommandFailed(f"--limit must be at least 1, got {args.limit}", MISUSED)
    url = existing_database(args, stores=True)
    require_head(url)
    return asyncio.run(_leases_async(url, args.tenant, args.execution, args.limit))


def iso_ms(epoch_ms: int) -> str:
    """An epoch-millisecond time as ISO 8601 in UTC, to the millisecond."""
    from datetime import UTC, datetime

    moment = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def span_ms(ms: int) -> str:
    """A duration for a person: `850 ms`, `12.5 s`, `7 min`, `3.0 h`, `2.0 d`."""
    ms = abs(ms)
    if ms < 1_000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    if ms < 3_600_000:
        return f"{ms // 60_000} min"
    if ms < 86_400_000:
        return f"{ms / 3_600_000:.1f} h"
    return f"{ms / 86_400_000:.1f} d"


async def _leases_async(url: str, tenant: str | None, execution: str | None, limit: int) -> int:
    import sqlalchemy as sa

    from agboss_sql.contracts import ApplicationContext, StoreClock
    from agboss_sql.sql.connection import SqlConnection
    from agboss_sql.sql.events import SqlExecutionLeaseEventRepository
    from agboss_sql.sql.schema import execution_leases as leases

    connection = SqlConnection(url)
    try:
        log = SqlExecutionLeaseEventRepository(
            connection, StoreClock(), ApplicationContext("agboss-sql-leases")
        )
        # Ages are measured on the database's clock, the one that decides the leases.
        now = int((await connection.execute(_select(connection.ops.now_ms()))).scalar() or 0)
        print(f"database time: {iso_ms(now)}")
        if tenant is not None and execution is not None:
            row = (
                await connection.execute(
                    sa.select(
                        leases.c.holder_instance_id,
                        leases.c.lease_epoch,
                        leases.c.expires_at,
                        leases.c.released,
                        leases.c.yielded,
                        leases.c.finished,
                        leases.c.closed_reason,
                    ).where(leases.c.tenant_id == tenant, leases.c.execution_id == execution)
                )
            ).first()
            if row is None:
                print(f"{tenant}/{execution}: no lease")
            else:
                holder, epoch, expires_at, released, yielded, finished, closed = row
                if finished:
                    state = "finished"
                elif closed:
                    state = f"closed ({closed})"
                elif released:
                    state = "released"
                elif yielded:
                    state = "yielded"
                elif expires_at > now:
                    state = f"live, expires {iso_ms(expires_at)} (in {span_ms(expires_at - now)})"
                else:
                    state = f"expired {iso_ms(expires_at)} ({span_ms(now - expires_at)} ago)"
                print(f"{tenant}/{execution}: {holder} at epoch {epoch}, {state}")
            events = list(await log.list(tenant, execution))
        else:
            events = list(await log.recent(limit))
            if not events:
                print("no lease moves recorded yet")
        for event in events:
            taken = event.taken_over_from
            extra = f" from {taken.instance_id}@{taken.lease_epoch}" if taken else ""
            extra += f" ({event.reason})" if event.reason else ""
            print(
                f"{iso_ms(event.at)} ({span_ms(now - event.at)} ago) "
                f"{event.tenant_id}/{event.execution_id} {event.instance_id} "
                f"epoch {event.lease_epoch} {event.kind}{extra}"
            )
        # A zombie is an instance acting at an epoch below the lease's current one.
        return 0
    finally:
        await connection.close()
