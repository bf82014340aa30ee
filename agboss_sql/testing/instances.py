"""Several application instances over one backing store, on one virtual clock, for tests.

    async with instances(make_app, n=2) as cluster:
        a, b = cluster.apps
        lease = await a.store(ExecutionLeaseRepository).acquire("t", "root-1", 30_000)
        await cluster.clock.advance(31_000)
        assert await b.store(ExecutionLeaseRepository).acquire("t", "root-1", 30_000)

In-memory stores are shared automatically (one `InMemoryBackend`); SQL stores
share one temporary SQLite file (never `:memory:`, which is one database per
connection) or the server at `url`. Each instance gets its own `SqlConnection`.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agboss_sql.application import Application, DatabaseUrl
from agboss_sql.contracts.clocks import Clock, StoreClock, VirtualClock
from agboss_sql.memory import InMemoryBackend
from agboss_sql.testing.database import create_project_schema

AppFactory = Callable[..., Application]


@dataclass(frozen=True)
class Cluster:
    """The started instances and the clock they share."""

    apps: Sequence[Application]
    clock: VirtualClock
    url: str | None


def _template(app: Application | AppFactory) -> AppFactory:
    if isinstance(app, Application):
        template = app

        def make(*, values: Mapping[Any, Any], instance_id: str) -> Application:
            # Each instance opens its own connection: never share the template's.
            merged = {
                k: v
                for k, v in template.values.items()
                if getattr(k, "__name__", "") != "SqlConnection"
            }
            merged.update(values)
            return Application(
                template.name,
                template.providers,
                merged,
                strict=template.strict,
                instance_id=instance_id,
            )

        return make
    return app


def _uses_sql(app: Application) -> bool:
    return any(p.__module__.startswith("agboss_sql.sql") for p in app.providers)


@contextlib.asynccontextmanager
async def instances(
    app: Application | AppFactory,
    n: int = 2,
    *,
    url: str | None = None,
    clock: VirtualClock | None = None,
) -> AsyncIterator[Cluster]:
    """Start `n` instances of `app` (an `Application` used as a template, or a factory taking
    `values=` and `instance_id=`) over one backing store and one `VirtualClock`."""
    clock = clock or VirtualClock(1_700_000_000_000)
    make = _template(app)
    backend = InMemoryBackend()
    with contextlib.ExitStack() as stack:
        probe = make(values={}, instance_id="probe")
        database_url = url
        if database_url is None and _uses_sql(probe):
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="agboss-"))
            database_url = f"sqlite:///{Path(directory) / 'instances.sqlite'}"
        if database_url is not None:
            create_project_schema(database_url)
        apps: list[Application] = []
        try:
            for index in range(n):
                values: dict[Any, Any] = {
                    InMemoryBackend: backend,
                    Clock: clock,
                    StoreClock: StoreClock(clock),
                }
                if database_url is not None:
                    values[DatabaseUrl] = DatabaseUrl(database_url)
                instance = make(values=values, instance_id=f"instance-{index + 1}")
                await instance.start()
                apps.append(instance)
            yield Cluster(tuple(apps), clock, database_url)
        finally:
            for instance in apps:
                await instance.close()
