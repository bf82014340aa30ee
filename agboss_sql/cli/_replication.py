"""`check`'s replication line: on PostgreSQL, whether a failover could lose what the
primary acknowledged.

A standby promoted from asynchronous replication may lack the primary's last commits:
a lease granted at epoch n and the effect stored under it can vanish, and the next take
grants epoch n again (one fencing token granted twice). With a synchronous standby
(`synchronous_standby_names` naming a standby that streams in sync, `synchronous_commit`
`on`, `remote_write` or `remote_apply`) every acknowledged COMMIT is on the standby too.
"""

from __future__ import annotations

from dataclasses import dataclass

SAFE_COMMITS = ("on", "remote_write", "remote_apply")
"""`synchronous_commit` values under which a COMMIT returns once a synchronous standby has
it (`remote_write`: in the standby's memory, which a SIGKILLed primary does not lose)."""


@dataclass(frozen=True)
class Replication:
    """What a PostgreSQL server says of its replication."""

    in_recovery: bool
    standby_names: str
    synchronous_commit: str
    standbys: tuple[tuple[str, str, str], ...]
    """(application_name, state, sync_state) of each standby connected."""
    several_hosts: bool
    """The URL names several servers."""
    read_write_only: bool
    """The URL asks for a server that takes writes (`target_session_attrs`)."""

    @property
    def synchronous(self) -> list[str]:
        """The standbys streaming in sync (or in a sync quorum)."""
        return [
            name
            for name, state, sync in self.standbys
            if state == "streaming" and sync in ("sync", "quorum")
        ]

    @property
    def safe(self) -> bool:
        """A failover to a synchronous standby loses no acknowledged commit."""
        return (
            not self.in_recovery
            and bool(self.synchronous)
            and self.synchronous_commit in SAFE_COMMITS
        )

    def lines(self) -> list[str]:
        """`check`'s lines: the verdict, then each problem and what to do."""
        if self.in_recovery:
            return [
                "replication: this server is a standby (in recovery): it takes no write, so "
                "every store's write is refused (StoreReadOnlyError); point the URL at the "
                "primary, or name every server with target_session_attrs=read-write"
            ]
        if self.safe:
            found = [
                f"replication: synchronous standby {', '.join(self.synchronous)} "
                f"(synchronous_commit={self.synchronous_commit}): a failover to it loses no "
                "acknowledged commit"
            ]
        elif not self.standbys and not self.standby_names:
            found = [
                "replication: WARNING: no standby: a failover would promote nothing; a standby "
                "added with asynchronous replication may lack the last commits when promoted "
                "(a lease epoch granted twice): make it synchronous "
                "(synchronous_standby_names, synchronous_commit=on)"
            ]
        elif self.synchronous_commit not in SAFE_COMMITS and self.synchronous:
            found = [
                f"replication: WARNING: synchronous_commit={self.synchronous_commit}: a COMMIT "
                "returns before the synchronous standby has it, so a promoted standby may lack "
                "it (a lease epoch granted twice): set synchronous_commit=on"
            ]
        elif self.standby_names and not self.synchronous:
            found = [
                f"replication: WARNING: synchronous_standby_names is '{self.standby_names}' but "
                "no standby streams in sync: every COMMIT waits until one does"
            ]
        else:
            names = ", ".join(f"{name} ({sync})" for name, _, sync in self.standbys)
            found = [
                f"replication: WARNING: asynchronous standby {names}: a standby promoted after "
                "the primary died may lack its last commits, and the next take grants a lease "
                "epoch again (one fencing token granted twice): make it synchronous "
                "(synchronous_standby_names, synchronous_commit=on)"
            ]
        if self.standbys and not (self.several_hosts and self.read_write_only):
            found.append(
                "replication: the URL names one server: after a failover the instances keep "
                "reaching the old one; name every server, with target_session_attrs=read-write "
                "(postgresql://user@/db?host=h1:p1&host=h2:p2&target_session_attrs=read-write)"
            )
        return found


def replication_of(url: str) -> Replication | None:
    """The replication of the PostgreSQL server `url` reaches (its primary, for a URL
    naming several with `target_session_attrs=read-write`); `None` on other databases."""
    import sqlalchemy as sa

    from agboss_sql._dialects._pg_hosts import several_hosts
    from agboss_sql.sql.migrate import sync_url

    parsed = sync_url(url)
    if parsed.get_backend_name() != "postgresql":
        return None
    engine = sa.create_engine(parsed)
    try:
        with engine.connect() as connection:
            in_recovery = bool(connection.exec_driver_sql("SELECT pg_is_in_recovery()").scalar())
            names = str(
                connection.exec_driver_sql(
                    "SELECT current_setting('synchronous_standby_names')"
                ).scalar()
                or ""
            )
            commit = str(
                connection.exec_driver_sql("SELECT current_setting('synchronous_commit')").scalar()
            )
            standbys = tuple(
                (str(row[0]), str(row[1]), str(row[2]))
                for row in connection.exec_driver_sql(
                    "SELECT application_name, state, sync_state FROM pg_stat_replication "
                    "ORDER BY application_name"
                )
            )
    finally:
        engine.dispose()
    attrs = parsed.query.get("target_session_attrs")
    return Replication(
        in_recovery=in_recovery,
        standby_names=names.strip(),
        synchronous_commit=commit,
        standbys=standbys,
        several_hosts=several_hosts(parsed),
        read_write_only=attrs in ("read-write", "primary"),
    )


__all__ = ["SAFE_COMMITS", "Replication", "replication_of"]
