"""The schema: one MetaData for every table the SQL stores use.

Identifiers are bounded (255) so composite keys stay under MySQL's 3072-byte
index limit with utf8mb4; a longer identity (a fenced key, a scope) is keyed
by its SHA-256 hex digest and kept whole beside it. Times are BIGINT ms.
Payloads are JSON text (LONGTEXT on MySQL); checkpoint blobs are binary.
MySQL identifier columns use a binary collation so that keys compare by
their exact characters, as on the other databases.
"""

from __future__ import annotations

import sqlalchemy as sa

from agboss_sql.sql._column_types import Blob, Ident, Json, OrderedIdent, WideText

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
    }
)


def Flag() -> sa.Boolean:
    return sa.Boolean(create_constraint=False)


Millis = sa.BigInteger
Hash = Ident  # SHA-256 hex digests (64)

execution_leases = sa.Table(
    "agboss_execution_leases",
    metadata,
    sa.Column("tenant_id", Ident(), primary_key=True),
    sa.Column("execution_id", Ident(), primary_key=True),
    sa.Column("holder_instance_id", Ident(), nullable=False),
    sa.Column("lease_epoch", sa.BigInteger(), nullable=False),
    sa.Column("expires_at", Millis(), nullable=False),
    sa.Column("released", Flag(), nullable=False),
    sa.Column("yielded", Flag(), nullable=False),
    sa.Column("finished", Flag(), nullable=False),
    # The high-water mark of fenced writes in this lease's scope: the lease row is
    # locked by every fenced write, so the mark lives on it and is raised in the
    # same statement that checks the lease.
    sa.Column("fence_token", sa.BigInteger(), nullable=False),
    # Raised by one on every fenced write, so the fence always changes the row: on a
    # cluster that certifies write sets (Galera) a write that changes nothing is not
    # certified, and a fence on a node that has not yet applied a takeover would pass.
    sa.Column("fence_writes", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("taken_over_from_instance_id", Ident(), nullable=True),
    sa.Column("taken_over_from_epoch", sa.BigInteger(), nullable=True),
    sa.Column("closed_reason", sa.String(32), nullable=True),
    # A per-take nonce: on MySQL (no RETURNING) it tells which take a read-back belongs to.
    sa.Column("take_id", sa.String(64), nullable=True),
    sa.Column("updated_at", Millis(), nullable=False),
)

execution_ids = sa.Table(
    "agboss_execution_ids",
    metadata,
    sa.Column("execution_id", Ident(), primary_key=True),
    sa.Column("tenant_id", Ident(), nullable=False),
)

execution_lease_events = sa.Table(
    "agboss_execution_lease_events",
    metadata,
    sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("tenant_id", Ident(), nullable=False),
    sa.Column("execution_id", Ident(), nullable=False),
    sa.Column("instance_id", Ident(), nullable=False),
    sa.Column("lease_epoch", sa.BigInteger(), nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("at", Millis(), nullable=False),
    sa.Column("taken_over_from_instance_id", Ident(), nullable=True),
    sa.Column("taken_over_from_epoch", sa.BigInteger(), nullable=True),
    sa.Column("reason", sa.Text(), nullable=True),
    sa.Index(None, "tenant_id", "execution_id", "id"),
)

fenced_effect_results = sa.Table(
    "agboss_fenced_effect_results",
    metadata,
    sa.Column("identity_hash", Hash(64), primary_key=True),
    # The key's identity whole: its idempotency key (up to MAX_IDEMPOTENCY_KEY_LENGTH
    # characters) escaped in JSON may outgrow MySQL's TEXT.
    sa.Column("identity", WideText(), nullable=False),
    sa.Column("tenant_id", Ident(), nullable=False),
    sa.Column("scope_key", sa.Text(), nullable=False),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("business_key", sa.Text(), nullable=True),
    sa.Column("fingerprint", sa.Text(), nullable=True),
    sa.Column("step_execution_id", Ident(), nullable=False),
    sa.Column("step_idempotency_key", sa.Text(), nullable=False),
    sa.Column("step_name", sa.Text(), nullable=False),
    sa.Column("lease_execution_id", Ident(), nullable=False),
    sa.Column("token", sa.BigInteger(), nullable=False),
    sa.Column("result", Json(), nullable=True),
    sa.Column("stored_at", Millis(), nullable=False),
)

outbound_calls = sa.Table(
    "agboss_outbound_calls",
    metadata,
    sa.Column("identity_hash", Hash(64), primary_key=True),
    sa.Column("key_identity", WideText(), nullable=False),
    sa.Column("business_identity", sa.Text(), nullable=True),
    sa.Column("tenant_id", Ident(), nullable=False),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("intent", Json(), nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("attempt_owner", sa.Text(), nullable=False),
    sa.Column("lease_execution_id", Ident(), nullable=False),
    sa.Column("token", sa.BigInteger(), nullable=False),
    sa.Column("fingerprint", sa.Text(), nullable=True),
    sa.Column("step_execution_id", Ident(), nullable=False),
    sa.Column("step_idempotency_key", sa.Text(), nullable=False),
    sa.Column("step_name", sa.Text(), nullable=False),
    sa.Column("response", Json(), nullable=True),
    sa.Column("error", Json(), nullable=True),
    sa.Column("recorded_at", Millis(), nullable=False),
    sa.Column("updated_at", Millis(), nullable=False),
)

child_executions = sa.Table(
    "agboss_child_executions",
    metadata,
    sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("child_execution_id", Ident(), nullable=False, unique=True),
    sa.Column("tenant_id", Ident(), nullable=False),
    sa.Column("root_execution_id", Ident(), nullable=False),
    sa.Column("parent_execution_id", Ident(), nullable=False),
    sa.Column("depth", sa.Integer(), nullable=False),
    sa.Column("payload", Json(), nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("claimed_by", Ident(), nullable=True),
    sa.Column("queued_at", Millis(), nullable=False),
    sa.Column("claimed_at", Millis(), nullable=True),
    sa.Column("finished_at", Millis(), nullable=True),
    sa.Column("outcome", Json(), nullable=True),
    # The attempt whose finish finished the child (NULL: finished without an attempt), and
    # what that finish answered as `remaining`: a retry of that attempt's finish answers it
    # again. 0 means this child's finish owes the parent its wake.
    sa.Column("finished_attempt", sa.Integer(), nullable=True),
    sa.Column("finish_remaining", sa.Integer(), nullable=True),
    # The parent's wake, owed by the finish that saw none left: claimed by compare-and-set
    # (by whom, until when on the application clock), then marked done.
    sa.Column("wake_claimed_by", Ident(), nullable=True),
    sa.Column("wake_claimed_until", Millis(), nullable=True),
    sa.Column("parent_woken_at", Millis(), nullable=True),
    # Written by releases before revision 0010 (the finishes of a parent's children on a
    # certifying cluster); their row in `agboss_child_parents` serves since.
    sa.Column("sibling_finishes", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Index(None, "parent_execution_id", "status"),
    sa.Index(None, "finish_remaining", "parent_woken_at"),
)
# The claim's order (`ORDER BY depth DESC, queued_at, id`) read straight off the index: a
# `FOR UPDATE SKIP LOCKED` claim then stops at the first unlocked row. Without it InnoDB
# sorts, locking every queued row it read, and a concurrent claimer finds none.
sa.Index(
    None,
    child_executions.c.status,
    child_executions.c.depth.desc(),
    child_executions.c.queued_at,
    child_executions.c.id,
)

child_parents = sa.Table(
    "agboss_child_parents",
    metadata,
    # One row per (tenant, parent) that has had a child queued: how many of its children are
    # not finished. A child's enqueue adds one and its finish takes one off, in their own
    # transactions, so a finish locks this one row whatever the number of siblings.
    sa.Column("tenant_id", Ident(), primary_key=True),
    sa.Column("parent_execution_id", Ident(), primary_key=True),
    sa.Column("unfinished", sa.BigInteger(), nullable=False),
    # On a cluster that certifies write sets (Galera) row locks are local to a node: a
    # wait for the parent's children raises this, so a wait and a finish that did not see
    # each other write one row and one of them fails certification.
    sa.Column("waits", sa.BigInteger(), nullable=False, server_default="0"),
)

execution_records = sa.Table(
    "agboss_execution_records",
    metadata,
    sa.Column("tenant_id", Ident(), primary_key=True),
    sa.Column("execution_id", Ident(), primary_key=True),
    sa.Column("root_execution_id", Ident(), nullable=False),
    sa.Column("parent_execution_id", Ident(), nullable=True),
    sa.Column("thread_id", Ident(), nullable=True),
    sa.Column("workflow", Ident(), nullable=False),
    sa.Column("owner", Ident(), nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("created_at", Millis(), nullable=False),
    sa.Column("updated_at", Millis(), nullable=False),
    sa.Column("outcome", Json(), nullable=True),
    sa.Index(None, "tenant_id", "thread_id"),
    sa.Index(None, "status", "updated_at"),
)

execution_tree_keys = sa.Table(
    "agboss_execution_tree_keys",
    metadata,
    sa.Column("tenant_id", Ident(), primary_key=True),
    sa.Column("root_execution_id", Ident(), primary_key=True),
    sa.Column("key", Ident(), primary_key=True),
    sa.Column("value", Json(), nullable=True),
)

mesh_requests = sa.Table(
    "agboss_mesh_requests",
    metadata,
    # Idempotency keys are per tenant: another tenant's request under the same key is
    # another request.
    sa.Column("idempotency_key", Ident(), primary_key=True),
    sa.Column("tenant_id", Ident(), primary_key=True),
    sa.Column("fingerprint", sa.Text(), nullable=False),
    sa.Column("received_at", Millis(), nullable=False),
    sa.Column("completed", Flag(), nullable=False),
    sa.Column("response", Json(), nullable=True),
)

rate_limit_slots = sa.Table(
    "agboss_rate_limit_slots",
    metadata,
    sa.Column("key", Ident(), primary_key=True),
    sa.Column("holder", Ident(), primary_key=True),
    sa.Column("expires_at", Millis(), nullable=False),
)

rate_limit_keys = sa.Table(
    "agboss_rate_limit_keys",
    metadata,
    # One row per limited key: the lock under which its slots are counted and taken,
    # its current window and its pause.
    sa.Column("key", Ident(), primary_key=True),
    sa.Column("window_start", Millis(), nullable=True),
    sa.Column("window_used", sa.BigInteger(), nullable=True),
    # Whether the last add to the window was allowed: one upsert decides and answers it.
    sa.Column("window_allowed", Flag(), nullable=True),
    sa.Column("paused_until", Millis(), nullable=True),
    # On a cluster that certifies write sets (Galera) the row's lock is local to a node:
    # there every slot take raises this counter, so two takes of one key on different
    # nodes write one row and the later fails certification.
    sa.Column("slot_takes", sa.BigInteger(), nullable=False, server_default="0"),
)

paused_executions = sa.Table(
    "agboss_paused_executions",
    metadata,
    sa.Column("tenant_id", Ident(), primary_key=True),
    sa.Column("pause_id", Ident(), primary_key=True),
    sa.Column("execution_id", Ident(), nullable=False),
    sa.Column("root_execution_id", Ident(), nullable=False),
    sa.Column("thread_id", Ident(), nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("request", Json(), nullable=True),
    sa.Column("decision", Json(), nullable=True),
    sa.Column("created_at", Millis(), nullable=False),
    sa.Column("resolved_at", Millis(), nullable=True),
    sa.Column("updated_at", Millis(), nullable=False),
    # Who took the decision (`take(..., taker=)`): a retried take by the same taker answers
    # True again.
    sa.Column("taken_by", Ident(), nullable=True),
    sa.Index(None, "tenant_id", "root_execution_id", "status"),
    sa.Index(None, "status", "updated_at"),
)

cost_entries = sa.Table(
    "agboss_cost_entries",
    metadata,
    # Entry ids are per tenant: another tenant's entry under the same id is another entry.
    sa.Column("entry_id", Ident(), primary_key=True),
    sa.Column("tenant_id", Ident(), primary_key=True),
    sa.Column("execution_id", Ident(), nullable=False),
    sa.Column("application", Ident(), nullable=False),
    sa.Column("tokens_in", sa.BigInteger(), nullable=False),
    sa.Column("tokens_out", sa.BigInteger(), nullable=False),
    sa.Column("cost_micros", sa.BigInteger(), nullable=False),
    sa.Column("at", Millis(), nullable=False),
    sa.Index(None, "execution_id", "at"),
    sa.Index(None, "tenant_id", "at"),
    sa.Index(None, "application", "at"),
)

cost_reservations = sa.Table(
    "agboss_cost_reservations",
    metadata,
    sa.Column("scope", sa.String(16), primary_key=True),
    sa.Column("key", Ident(), primary_key=True),
    sa.Column("reserved_micros", sa.BigInteger(), nullable=False),
    # The reservation's tenant, '' when it was made without one.
    sa.Column("tenant_id", Ident(), primary_key=True, server_default=sa.text("''")),
)

execution_history = sa.Table(
    "agboss_execution_history",
    metadata,
    sa.Column("tenant_id", Ident(), primary_key=True),
    sa.Column("execution_id", Ident(), primary_key=True),
    sa.Column("workflow", Ident(), nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("started_at", Millis(), nullable=False),
    sa.Column("finished_at", Millis(), nullable=False),
    sa.Column("record", Json(), nullable=True),
    sa.Index(None, "tenant_id", "finished_at", "execution_id"),
    sa.Index(None, "finished_at"),
)

# --- LangGraph checkpoints (`SqlCheckpointSaver`) ---------------------------------------
# The saver accepts every thread id, namespace (`checkpoint_ns`, one level per subgraph),
# task id and channel name LangGraph does: any text, empty, longer than a key column, ending
# in spaces (which MySQL's collations would compare equal to the text without them). Each is
# keyed by its SHA-256 (`*_hash`: exact, bounded) and, where a read answers it, kept whole
# beside the key. Channel values are stored once per channel version
# (`agboss_checkpoint_blobs`), not once per checkpoint; values and checkpoint bodies are
# LangGraph's serde output (type tag + bytes). Checkpoint ids order a thread's history (its
# latest, a listing's pages, the ranges of pending writes a page reads), so they are ordered
# by their exact characters on every database, as LangGraph's own savers order them in
# Python (`OrderedIdent`).

checkpoints = sa.Table(
    "agboss_checkpoints",
    metadata,
    sa.Column("thread_hash", Hash(64), primary_key=True),
    sa.Column("ns_hash", Hash(64), primary_key=True),
    sa.Column("checkpoint_id", OrderedIdent(64), primary_key=True),
    sa.Column("thread_id", sa.Text(), nullable=False),
    sa.Column("checkpoint_ns", sa.Text(), nullable=False),
    sa.Column("parent_checkpoint_id", OrderedIdent(64), nullable=True),
    # SHA-256 of the metadata's `run_id` (any text), for `delete_for_runs`.
    sa.Column("run_hash", Hash(64), nullable=True),
    sa.Column("checkpoint_type", sa.String(64), nullable=False),
    sa.Column("checkpoint", Blob(), nullable=False),
    sa.Column("metadata", Json(), nullable=False),
    sa.Index(None, "run_hash"),
)

checkpoint_blobs = sa.Table(
    "agboss_checkpoint_blobs",
    metadata,
    sa.Column("thread_hash", Hash(64), primary_key=True),
    sa.Column("ns_hash", Hash(64), primary_key=True),
    # The channel's name is in every checkpoint body that reads this value.
    sa.Column("channel_hash", Hash(64), primary_key=True),
    sa.Column("version", Ident(128), primary_key=True),
    sa.Column("value_type", sa.String(64), nullable=False),
    sa.Column("value", Blob(), nullable=True),
    # Set: `value` holds only the elements appended to the list stored whole under this
    # version of the same channel (see `agboss_sql.sql.checkpoint._appends`).
    sa.Column("base_version", Ident(128), nullable=True),
)

checkpoint_writes = sa.Table(
    "agboss_checkpoint_writes",
    metadata,
    sa.Column("thread_hash", Hash(64), primary_key=True),
    sa.Column("ns_hash", Hash(64), primary_key=True),
    sa.Column("checkpoint_id", OrderedIdent(64), primary_key=True),
    sa.Column("task_hash", Hash(64), primary_key=True),
    sa.Column("idx", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("task_id", sa.Text(), nullable=False),
    sa.Column("channel", sa.Text(), nullable=False),
    sa.Column("task_path", sa.Text(), nullable=False),
    sa.Column("value_type", sa.String(64), nullable=False),
    sa.Column("value", Blob(), nullable=True),
)


def _compressed_with_lz4(table: sa.Table, column: str) -> None:
    """PostgreSQL compresses `column`'s large values with lz4 rather than pglz (a put waits
    for it: 0.62 ms against 0.82 ms for a 15 kB insert), where the server has lz4; the
    migrations set the same (0008)."""
    sa.event.listen(
        table,
        "after_create",
        sa.DDL(  # type: ignore[no-untyped-call]
            "DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_settings WHERE name = "
            "'default_toast_compression' AND 'lz4' = ANY(enumvals)) THEN "
            f"EXECUTE 'ALTER TABLE {table.name} ALTER COLUMN {column} SET COMPRESSION lz4'; "
            "END IF; END $$"
        ).execute_if(dialect="postgresql"),
    )


_compressed_with_lz4(checkpoints, "checkpoint")
_compressed_with_lz4(checkpoint_blobs, "value")
_compressed_with_lz4(checkpoint_writes, "value")

STORE_TABLES = tuple(metadata.sorted_tables)
"""Every table, in dependency order (for truncation in tests)."""
