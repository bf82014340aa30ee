"""`SqlCheckpointSaver`: LangGraph's checkpoint saver on the project's SQL connection.

A real `langgraph.checkpoint.base.BaseCheckpointSaver`: a graph compiled with it
persists and resumes on SQLite, PostgreSQL and MySQL/MariaDB, and any instance
sharing the database can resume another's thread.

Storage (`agboss_checkpoints`, `agboss_checkpoint_blobs`, `agboss_checkpoint_writes`):
a checkpoint row holds the checkpoint without its channel values; each channel value is
stored once per channel version, written by the `put` that introduced the version and
shared by every later checkpoint that still reads it. Small scalars (None, bools, floats,
64-bit ints, texts of at most `INLINE_TEXT` characters) are the exception, as in
LangGraph's own savers, and so are short lists of them (at most `INLINE_ITEMS`, texts of at
most `INLINE_ITEM_TEXT`: a `list[str]` channel under `operator.add`, say): they stay in the
body of every checkpoint that reads them, so they cost no row and no look-up, and a put
whose new versions are all such values is one statement with no transaction (a body's
`channel_values` names them; rows written before they were inlined hold none there, and
read the same way). A body that keeps a list is stored with its serde type prefixed
(`BODY_HOLDS_LISTS`): a saver of a release before lists were kept inline refuses it with
its serde's error rather than reading the thread without the list. Values, bodies and pending writes
are serialised with the saver's LangGraph serde (`JsonPlusSerializer` by default; with
LangGraph's `EncryptedSerializer` all three are stored encrypted, and a growing list is then
stored whole at each version, since only bytes the msgpack serde wrote are appended to);
metadata is JSON text, so `list` filters it in SQL. A pending write is keyed by
(checkpoint, task, index): a retried task does not duplicate it.

Appends (`_appends`): a list that only grows (a chat's `messages` under `add_messages`) is
not written whole at every version. When a new value's bytes begin with every element of
the channel's latest value this saver stored whole (its base), the row holds the base's
version (`base_version`) and the elements after them; a read joins the two into the very
bytes the serde wrote. An append names a base stored whole, never another append, and a
value is stored whole again once what it adds passes a quarter of its base: a 105-turn chat
stored 6.0 MB where whole values took 35 MB. The put writes only if every base it names is
still stored (checked in its own statement, script or transaction; on PostgreSQL and
MySQL/MariaDB the base rows are read with a shared lock held to the commit, so a delete of a
base waits for the put, or the put for the delete and then finds the base gone), else it
writes every value whole; deletes keep the base of every append a kept checkpoint reads.

Keys: thread ids, namespaces, task ids and channel names are any text LangGraph accepts
(empty, longer than a key column, ending in spaces, which MySQL's collations would compare
equal to the text without them): each is keyed by its SHA-256 (`thread_hash`, `ns_hash`,
`task_hash`, `channel_hash`) and kept whole where a read answers it. Only text no database
can store (a NUL character, a lone surrogate) is refused, before any statement.

Loops and threads: the async methods serve any event loop (a connection of its own on each
loop but the first, `_bridge`); the sync methods (`put`, `get_tuple`, `list`, ...) use no
loop at all: they run the same operations in the caller's thread on synchronous driver
connections (stdlib `sqlite3`, psycopg, PyMySQL: `_sync`, `_sync_drivers`), with the same
statements, fence, bounds and typed errors.

Statements per operation, by what the database can do (n: more than `MAX_ROWS` new
versions or writes take more). "Folding" databases run data-modifying statements inside
`WITH` (`Capabilities.dml_in_with`: PostgreSQL); the others (MySQL/MariaDB, SQLite) run a
write of several statements as one transaction. SQLite runs every step inline on the
event loop, inside `BEGIN IMMEDIATE` when it writes. The sync methods send the same
statements, on their own connections (`_sync`).

| operation | folding | not folding |
|---|---|---|
| `aput` | 1 (blobs folded into the checkpoint upsert with `WITH`; with appends, their bases' check too) | 1 alone; with new blobs BEGIN + 2 + COMMIT, sent as one text on MySQL/MariaDB (`Capabilities.scripts`: one round trip; with appends, under their bases' check, ending with the count of bases there); with appends on SQLite BEGIN + 3 + COMMIT (their bases read first) |
| `aput`, fenced | 1 (lease fence folded in) | BEGIN + 3 + COMMIT |
| `aput_writes` | 1 (fenced too) | 1 (fenced: BEGIN + 2 + COMMIT) |
| `aget_tuple` | 1: the checkpoint with its writes and the values it is expected to read; 2 when it reads others, 3 when an append's base is neither read nor kept | 1 to 3 |
| `alist`, per page | 2: checkpoints, then their values (a row-value `IN` of keys, `PAGE_BLOBS[-1]` per statement; on SQLite and PostgreSQL one JSON array of every key) with the writes of the page's range of ids, in one statement (a page of one thread namespace; wider listings read values and writes by key, `MAX_LOOKUPS` per statement); 3 when an append's base is read by no checkpoint of the page | 2 or 3 |
| `aget_delta_channel_history` | 2 per `DELTA_PAGE` checkpoints walked: a range of the namespace's checkpoints from the target down (parent links followed by the saver), then the values that may seed the channels with the writes of the walked range (as a listing's page reads them); one more for an append's base | 2 or more |
| `adelete_thread`, `acopy_thread` | 1 | BEGIN + 3 + COMMIT |

A refused fenced write reads why in its transaction (the fence's diagnosis) and rolls
back; where writes fold, that transaction follows the refused statement, as it does for a
fenced `aput_writes` whose writes were all stored already (the fence then holds and the
writes add nothing).

Expected values: the saver remembers, for the last `EXPECTED_NAMESPACES` thread namespaces
it wrote or read, which (channel, version) values their latest checkpoint reads, and names
them in the statement that reads the checkpoint. The guess is checked against the
checkpoint read: values it names that were not guessed (another instance wrote since, or a
checkpoint is read by id) are read in a second statement; a guessed value not found was
not there in that statement's snapshot, so nothing stale is ever answered.

Kept values: the saver keeps the serialised values it wrote or read (by key, whole as the
serde wrote them, at most `value_cache_bytes`, least recently used out first), and a read
takes the values its checkpoint names from there instead of fetching them. A value row
never changes and is deleted only with every checkpoint that reads it (an append's base
with every checkpoint that reads the append), so the kept bytes are what the database
would answer for any checkpoint the read found; only versions of the form
`get_next_version` makes are kept (their random fraction is never reused for another value,
even after another instance deleted the thread and it began again). Which checkpoint is
the latest, and which values it names, always come from the database.

Decoded lists: decoding is most of what reading a long conversation costs (LangGraph's
serde validates every message again). Per channel, the saver keeps the list it decoded last
as a pickle of the objects (bounded by `value_cache_bytes` too), and a value whose bytes
begin with every element of that list is decoded as a load of the pickle (new objects,
equal in type and value to what the serde makes) followed by the serde's decoding of the
elements after them. Only for LangGraph's default serde, and only lists of builtin values
and pydantic models of them (`_decoded`); anything else the serde decodes every time. A
pickle loads with the garbage collector paused: a long conversation's cold history read
otherwise spent most of its time in the collector's full collections (`_decoded`).

The latest checkpoint of a thread is read off the primary key (the greatest
`checkpoint_id` of `(thread_id, ns_hash)`), never by scanning its history.

Fencing (`fenced=True`): every `aput` and `aput_writes` raises the lease's fence
token in the same transaction as (where writes fold: the same statement as) the write,
with the statement the fenced-effect store uses on `agboss_execution_leases` (`_fence`).
The write happens only while the lease in the run's config (`configurable["agboss_lease"]`:
an `ExecutionLease`, or a dict of `tenant_id`, `execution_id`, `lease_epoch` and
`holder_instance_id`) is held at its epoch by the instance it names and live by the
store's time (a lease that names no holder is a `ValueError` before any statement); otherwise nothing is written and
`ExecutionFencedError` is raised, so an instance that wakes after a takeover cannot
overwrite the new holder's checkpoint.

Modules: `saver` (the saver: its synchronous methods and lifecycle on the async core),
`_aio` (the async core: deleting, copying and pruning threads, on `_writes` and
`_reads`), `_core` (the state, keys and atomic write those share), `_statements` (its
statements: the reads, listing and deletes, on `_write_statements`; the rows as they bind
in `_layout`), `_appends` (values stored as appends), `_values` (kept values), `_decoded`
(decoded lists), `_lease` (the writer's lease in a config), `_bridge` (a connection per
event loop), `_sync` and `_sync_drivers` (the synchronous methods' connections),
`importing` (`import_threads`, `aimport_threads`: every thread of another LangGraph saver
brought over, checked).
"""

from __future__ import annotations

from agboss_sql.sql.checkpoint._layout import LIST_PAGE, MAX_ROWS
from agboss_sql.sql.checkpoint._lease import LEASE_KEY
from agboss_sql.sql.checkpoint.importing import (
    ImportMismatchError,
    ImportReport,
    aimport_threads,
    import_threads,
)
from agboss_sql.sql.checkpoint.saver import SqlCheckpointSaver

__all__ = [
    "LEASE_KEY",
    "LIST_PAGE",
    "MAX_ROWS",
    "ImportMismatchError",
    "ImportReport",
    "SqlCheckpointSaver",
    "aimport_threads",
    "import_threads",
]
