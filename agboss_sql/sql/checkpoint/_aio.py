"""The saver's async core: `AsyncSaver`, its writes (`_writes`) and reads (`_reads`) with
deleting, copying and pruning threads (here), every method on the caller's event loop.
`saver.SqlCheckpointSaver` adds the synchronous methods and the saver's lifecycle."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from agboss_sql.sql._base import identity_hash
from agboss_sql.sql.checkpoint._core import Database, _key_text, _text
from agboss_sql.sql.checkpoint._delta import SaverDeltaHistory
from agboss_sql.sql.checkpoint._layout import BLOB_KEY, CHECKPOINT_KEY, chunks, keyed_params
from agboss_sql.sql.checkpoint._statements import CheckpointStatements
from agboss_sql.sql.checkpoint._writes import SaverWrites
from agboss_sql.sql.connection import Exec, Step
from agboss_sql.sql.schema import checkpoint_blobs, checkpoint_writes, checkpoints


class AsyncSaver(SaverWrites, SaverDeltaHistory):
    """Every async method of the saver (see `saver.SqlCheckpointSaver` for the promises)."""

    # --- deleting, copying, pruning ------------------------------------------------------

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, pending write and value of `thread_id`, atomically."""
        await self._delete_thread(self._sync.here(), thread_id)

    async def _delete_thread(self, connection: Database, thread_id: str) -> None:
        sql = self._statements(connection)
        params = {"thread_hash": identity_hash(_key_text("thread_id", thread_id))}
        await self._write(connection, [Exec(s, params) for s in sql.delete_thread])
        self._values.forget_thread(params["thread_hash"])
        self._decoded.forget_thread(params["thread_hash"])
        self._delta_bodies.forget_thread(params["thread_hash"])

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, pending write and value of one thread to another, atomically
        (rows the target already has are kept)."""
        await self._copy_thread(self._sync.here(), source_thread_id, target_thread_id)

    async def _copy_thread(self, connection: Database, source: str, target: str) -> None:
        sql = self._statements(connection)
        source = _key_text("source_thread_id", source)
        target = _key_text("target_thread_id", target)
        if source == target:
            return
        params = {
            "source_hash": identity_hash(source),
            "target_hash": identity_hash(target),
            "target": target,
        }
        await self._write(connection, [Exec(s, params) for s in sql.copy_thread])

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints whose metadata names one of `run_ids`, their pending writes,
        and the values no remaining checkpoint of their namespace reads, in one transaction."""
        await self._delete_for_runs(self._sync.here(), run_ids)

    async def _delete_for_runs(self, connection: Database, run_ids: Sequence[str]) -> None:
        if isinstance(run_ids, str):
            raise TypeError("run_ids must be a sequence of run ids, not a str")
        hashes = list(dict.fromkeys(identity_hash(str(run_id)) for run_id in run_ids))
        if not hashes:
            return
        sql = self._statements(connection)

        def step() -> Step[None]:
            doomed: list[tuple[Any, Any, Any]] = []
            for runs in chunks(hashes):
                found = {f"k{i}_run_hash": value for i, value in enumerate(runs)}
                doomed += (yield Exec(sql.run_checkpoints(len(runs)), found)).rows
            for keys in chunks(doomed):
                params = keyed_params(keys, CHECKPOINT_KEY)
                yield Exec(sql.keyed_delete(checkpoints, CHECKPOINT_KEY, len(keys)), params)
                yield Exec(sql.keyed_delete(checkpoint_writes, CHECKPOINT_KEY, len(keys)), params)
            for thread_hash, ns_hash in dict.fromkeys((row[0], row[1]) for row in doomed):
                yield from self._collect_blobs(sql, thread_hash, ns_hash)

        await connection.run(step, transaction=True)

    def _collect_blobs(
        self, sql: CheckpointStatements, thread_hash: Any, ns_hash: Any
    ) -> Step[None]:
        """Delete the values of one thread namespace that no checkpoint of it reads."""
        params = {"thread_hash": thread_hash, "ns_hash": ns_hash}
        read: set[tuple[str, str]] = set()
        for kind, data in (yield Exec(sql.namespace_bodies(), params)).rows:
            versions = self._loads(kind, data)["channel_versions"]
            read.update((identity_hash(ch), str(version)) for ch, version in versions.items())
        stored = (yield Exec(sql.namespace_blob_keys(), params)).rows
        # An append read keeps its base.
        read.update(
            (channel, _text(base))
            for channel, version, base in stored
            if base is not None and (channel, version) in read
        )
        garbage = [
            (thread_hash, ns_hash, channel, version)
            for channel, version, _ in stored
            if (channel, version) not in read
        ]
        for chunk in chunks(garbage):
            yield Exec(
                sql.keyed_delete(checkpoint_blobs, BLOB_KEY, len(chunk)),
                keyed_params(chunk, BLOB_KEY),
            )

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`"keep_latest"`: keep each namespace's latest checkpoint of each thread (its pending
        writes and the values it reads; its parent link is cleared), delete the rest;
        `"delete"`: delete the threads. One transaction per thread. A thread that uses a
        `DeltaChannel` is refused for `"keep_latest"` (`NotImplementedError`), as its state
        needs the ancestors."""
        await self._prune(self._sync.here(), thread_ids, strategy)

    async def _prune(self, connection: Database, thread_ids: Sequence[str], strategy: str) -> None:
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread ids, not a str")
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        threads = [_key_text("thread_id", t) for t in dict.fromkeys(thread_ids)]
        for thread_id in threads:
            if strategy == "delete":
                await self._delete_thread(connection, thread_id)
            else:
                await connection.run(self._keep_latest_of(connection, thread_id))

    def _keep_latest_of(self, connection: Database, thread_id: str) -> Callable[[], Step[None]]:
        return lambda: self._keep_latest(connection, thread_id)

    def _keep_latest(self, connection: Database, thread_id: str) -> Step[None]:
        sql = self._statements(connection)
        thread_hash = identity_hash(thread_id)
        rows = (yield Exec(sql.lock_thread, {"thread_hash": thread_hash})).rows
        heads: dict[Any, Any] = {}
        for ns_hash, checkpoint_id in rows:
            # Rows come newest first per namespace, in the database's own order.
            heads.setdefault(ns_hash, checkpoint_id)
        if not heads:
            return
        keys = [(thread_hash, ns_hash, checkpoint_id) for ns_hash, checkpoint_id in heads.items()]
        read: set[tuple[Any, str, str]] = set()
        for heads_chunk in chunks(keys):
            statement = sql.keyed(
                checkpoints,
                ("ns_hash", "checkpoint_type", "checkpoint", "metadata"),
                CHECKPOINT_KEY,
                len(heads_chunk),
            )
            for ns_hash, kind, data, metadata in (
                yield Exec(statement, keyed_params(heads_chunk, CHECKPOINT_KEY))
            ).rows:
                if "counters_since_delta_snapshot" in json.loads(_text(metadata)):
                    raise NotImplementedError(
                        f"keep_latest cannot prune thread {thread_id!r}: it uses a DeltaChannel, "
                        "whose state is rebuilt from the ancestors pruning would delete"
                    )
                versions = self._loads(kind, data)["channel_versions"]
                read.update((ns_hash, identity_hash(ch), str(v)) for ch, v in versions.items())
        for ns_hash, head in heads.items():
            params = {"thread_hash": thread_hash, "ns_hash": ns_hash, "checkpoint_id": head}
            yield Exec(sql.prune_checkpoints, params)
            yield Exec(sql.prune_writes, params)
            yield Exec(sql.orphan_head, params)
        stored = (yield Exec(sql.select_blob_keys, {"thread_hash": thread_hash})).rows
        # An append read keeps its base.
        read.update(
            (ns_hash, channel, _text(base))
            for ns_hash, channel, version, base in stored
            if base is not None and (ns_hash, channel, version) in read
        )
        garbage: list[tuple[str, Any, Any, Any]] = [
            (thread_hash, ns_hash, channel, version)
            for ns_hash, channel, version, _ in stored
            if (ns_hash, channel, version) not in read
        ]
        for chunk in chunks(garbage):
            yield Exec(
                sql.keyed_delete(checkpoint_blobs, BLOB_KEY, len(chunk)),
                keyed_params(chunk, BLOB_KEY),
            )
