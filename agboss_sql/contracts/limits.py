"""Every limit a store keeps, in one table (`LIMITS`), the same on every database.

Each limit is checked before any statement runs, by the `checked_*` helpers of
`contracts.keys`, `contracts.rules` and the saver, and refused with the typed error the
table names (its `facts["limit"]` is the limit's name): one answer on SQLite, PostgreSQL
and MySQL/MariaDB, and nothing written. The limits are sized so that every supported
database stores a value at the limit and gives it back equal:

- texts fit their columns on every database: an identifier a 255-character key column;
  a longer text (a step's name, a fingerprint, a saver's thread id) a MySQL `TEXT` column
  (65,535 bytes) even as four-byte characters (`TEXT_COLUMN_CHARACTERS`), and the identity
  that joins a step's idempotency key with the key's scope as JSON (each character escaped
  at most to six) a MySQL `MEDIUMTEXT` column (revision 0011_wide_identities);
- a payload's statement fits MySQL/MariaDB's `max_allowed_packet`: the driver escapes each
  quote and backslash of a text, so a JSON text can double on the wire; the stores need
  `MIN_MAX_ALLOWED_PACKET` (twice the largest payload, and room for the keys) and a server
  below it is refused at connect (`ServerSettingError`).

A text no database here can store is refused the same way everywhere, whatever its length:
a NUL character (PostgreSQL refuses it in a text) or a lone surrogate (no UTF-8 form).
`docs/limits.md` gives this table; a test compares the two.
"""

from __future__ import annotations

from dataclasses import dataclass

from agboss_sql.contracts.errors import (
    AgbossError,
    InvalidBusinessKeyError,
    InvalidFencedEffectNameError,
    InvalidFingerprintError,
    InvalidIdentifierError,
    InvalidNumberError,
    InvalidPayloadError,
    InvalidStepError,
    InvalidValueError,
    ServerSettingError,
)

MIB = 1024 * 1024

MAX_IDENTIFIER_LENGTH = 255
"""Characters of an identifier: a tenant, execution, instance, pause, entry or key id."""
MAX_EFFECT_NAME_LENGTH = 100
"""Characters of a fenced effect's name (`[A-Za-z0-9._-]`)."""
MAX_BUSINESS_KEY_LENGTH = 255
"""Characters of a fenced effect's business key."""
TEXT_COLUMN_CHARACTERS = 65_535 // 4
"""Characters a MySQL `TEXT` column (65,535 bytes) holds as four-byte characters: 16,383."""
MAX_IDEMPOTENCY_KEY_LENGTH = TEXT_COLUMN_CHARACTERS
"""Characters of a step's idempotency key: kept whole, and inside the JSON identity of an
effect's row, where each character may take six (a `MEDIUMTEXT` column on MySQL since
revision 0011_wide_identities)."""
MAX_STEP_NAME_LENGTH = TEXT_COLUMN_CHARACTERS
"""Characters of a step's name."""
MAX_FINGERPRINT_LENGTH = TEXT_COLUMN_CHARACTERS
"""Characters of a fingerprint (a fenced effect's, a mesh request's)."""
MAX_OWNER_LENGTH = TEXT_COLUMN_CHARACTERS
"""Characters of an outbound call's attempt owner."""
MAX_REASON_LENGTH = TEXT_COLUMN_CHARACTERS
"""Characters of a lease event's reason."""
MAX_STATUS_LENGTH = 32
"""Characters of a history snapshot's status."""
MAX_SAVER_KEY_LENGTH = TEXT_COLUMN_CHARACTERS
"""Characters of a checkpoint's thread id and namespace, of a pending write's task id,
task path and channel."""
MAX_CHECKPOINT_ID_LENGTH = 64
"""Characters of a checkpoint id (its key column)."""
MAX_CHANNEL_VERSION_LENGTH = 128
"""Characters of a channel version (its key column)."""
MAX_PAYLOAD_BYTES = 4 * MIB
"""Bytes of the JSON text (UTF-8) of a payload: a stored result, an intent, a response, an
error, an outcome, a request, a decision, a record, a tree value. A call that writes two
(a pause's request and decision) writes at most this much of both together."""
MAX_CHECKPOINT_WRITE_BYTES = 4 * MIB
"""Bytes one saver call writes: a put's checkpoint, metadata and new channel values (as the
serde wrote them), or a put_writes' values and channel names."""
MAX_INT64 = 2**63 - 1
MIN_INT64 = -(2**63)
"""Whole numbers stored in BIGINT columns (times, epochs, tokens, amounts, counts)."""
MAX_INT32 = 2**31 - 1
MIN_INT32 = -(2**31)
"""Whole numbers stored in INTEGER columns: a child's depth and attempt."""
MAX_DURATION_MS = 10 * 365 * 24 * 3600 * 1000
"""The longest duration a store takes (a lease, a slot's ttl, a window, a wake claim): ten
years. A store adds it to its time, and the sum must stay a BIGINT on every backend."""
MIN_MAX_ALLOWED_PACKET = 2 * MAX_PAYLOAD_BYTES + MIB
"""The least `max_allowed_packet` a MySQL/MariaDB server must allow (read at connect): a
payload at its limit, doubled by the driver's escaping, and 1 MiB for the rest of the
statement. MariaDB's default is 16 MiB, MySQL 8's 64 MiB."""


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit: its `name` (a constant of this module), its `maximum` in `unit`, what it
    bounds, and the error a value over it gets."""

    name: str
    maximum: int
    unit: str
    bounds: str
    error: type[AgbossError]


LIMITS: tuple[Limit, ...] = (
    Limit(
        "MAX_IDENTIFIER_LENGTH",
        MAX_IDENTIFIER_LENGTH,
        "characters",
        "an identifier: tenant, execution, instance, pause, entry, budget and tree key ids",
        InvalidIdentifierError,
    ),
    Limit(
        "MAX_EFFECT_NAME_LENGTH",
        MAX_EFFECT_NAME_LENGTH,
        "characters",
        "a fenced effect's name",
        InvalidFencedEffectNameError,
    ),
    Limit(
        "MAX_BUSINESS_KEY_LENGTH",
        MAX_BUSINESS_KEY_LENGTH,
        "characters",
        "a fenced effect's business key",
        InvalidBusinessKeyError,
    ),
    Limit(
        "MAX_IDEMPOTENCY_KEY_LENGTH",
        MAX_IDEMPOTENCY_KEY_LENGTH,
        "characters",
        "a step's idempotency key",
        InvalidStepError,
    ),
    Limit(
        "MAX_STEP_NAME_LENGTH",
        MAX_STEP_NAME_LENGTH,
        "characters",
        "a step's name",
        InvalidStepError,
    ),
    Limit(
        "MAX_FINGERPRINT_LENGTH",
        MAX_FINGERPRINT_LENGTH,
        "characters",
        "a fingerprint (a fenced effect's, a mesh request's)",
        InvalidFingerprintError,
    ),
    Limit(
        "MAX_OWNER_LENGTH",
        MAX_OWNER_LENGTH,
        "characters",
        "an outbound call's attempt owner",
        InvalidValueError,
    ),
    Limit(
        "MAX_REASON_LENGTH",
        MAX_REASON_LENGTH,
        "characters",
        "a lease event's reason",
        InvalidValueError,
    ),
    Limit(
        "MAX_STATUS_LENGTH",
        MAX_STATUS_LENGTH,
        "characters",
        "a history snapshot's status",
        InvalidValueError,
    ),
    Limit(
        "MAX_SAVER_KEY_LENGTH",
        MAX_SAVER_KEY_LENGTH,
        "characters",
        "a checkpoint's thread id and namespace; a pending write's task id, task path, channel",
        InvalidIdentifierError,
    ),
    Limit(
        "MAX_CHECKPOINT_ID_LENGTH",
        MAX_CHECKPOINT_ID_LENGTH,
        "characters",
        "a checkpoint id",
        InvalidIdentifierError,
    ),
    Limit(
        "MAX_CHANNEL_VERSION_LENGTH",
        MAX_CHANNEL_VERSION_LENGTH,
        "characters",
        "a channel version",
        InvalidIdentifierError,
    ),
    Limit(
        "MAX_PAYLOAD_BYTES",
        MAX_PAYLOAD_BYTES,
        "bytes",
        "a payload's JSON text (UTF-8); a pause's request and decision together",
        InvalidPayloadError,
    ),
    Limit(
        "MAX_CHECKPOINT_WRITE_BYTES",
        MAX_CHECKPOINT_WRITE_BYTES,
        "bytes",
        "one saver put (checkpoint, metadata, new values) or put_writes (values, channels)",
        InvalidPayloadError,
    ),
    Limit(
        "MAX_INT64",
        MAX_INT64,
        "integer",
        "times, epochs, tokens, amounts, counts (and at least MIN_INT64)",
        InvalidNumberError,
    ),
    Limit(
        "MAX_INT32",
        MAX_INT32,
        "integer",
        "a child's depth and attempt (and at least MIN_INT32)",
        InvalidNumberError,
    ),
    Limit(
        "MAX_DURATION_MS",
        MAX_DURATION_MS,
        "ms",
        "a duration: a lease, a slot's ttl, a window, a wake claim (and at least 1)",
        InvalidNumberError,
    ),
    Limit(
        "MIN_MAX_ALLOWED_PACKET",
        MIN_MAX_ALLOWED_PACKET,
        "bytes",
        "the least max_allowed_packet of a MySQL/MariaDB server (read at connect)",
        ServerSettingError,
    ),
)
"""Every limit, in the order `docs/limits.md` gives them."""


def unstorable_text_rule_of(text: str) -> str | None:
    """Why no database here can store `text` as it is, or `None` when every one can.

    PostgreSQL refuses a NUL character in a text; no database stores a lone surrogate
    (it has no UTF-8 form). Refused on every backend, so a value never commits in one
    store and fails in another.
    """
    if "\x00" in text:
        return "a NUL character"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "a lone surrogate"
    return None


def over_limit(what: str, size: int, limit: str, maximum: int, unit: str = "characters") -> str:
    """The message of a value of `size` `unit` over the limit `limit` (`maximum`)."""
    return f"{what} is {size} {unit}, over {limit} ({maximum} {unit})"


def checked_text(what: str, value: object, limit: str, maximum: int, *, empty: bool = False) -> str:
    """`value` if it is a text of at most `maximum` characters (non-empty unless `empty`)
    that every database stores, else `InvalidValueError` naming `limit`."""
    if not isinstance(value, str):
        raise InvalidValueError(f"{what} must be a text, got {type(value).__name__}")
    if not value and not empty:
        raise InvalidValueError(f"{what} must not be empty")
    if len(value) > maximum:
        raise InvalidValueError(over_limit(what, len(value), limit, maximum), limit=limit)
    unstorable = unstorable_text_rule_of(value)
    if unstorable is not None:
        raise InvalidValueError(f"{what} must not hold {unstorable}, got {value!r:.80}")
    return value


__all__ = [
    "LIMITS",
    "MAX_BUSINESS_KEY_LENGTH",
    "MAX_CHANNEL_VERSION_LENGTH",
    "MAX_CHECKPOINT_ID_LENGTH",
    "MAX_CHECKPOINT_WRITE_BYTES",
    "MAX_DURATION_MS",
    "MAX_EFFECT_NAME_LENGTH",
    "MAX_FINGERPRINT_LENGTH",
    "MAX_IDENTIFIER_LENGTH",
    "MAX_INT32",
    "MAX_INT64",
    "MAX_OWNER_LENGTH",
    "MAX_PAYLOAD_BYTES",
    "MAX_REASON_LENGTH",
    "MAX_SAVER_KEY_LENGTH",
    "MAX_STATUS_LENGTH",
    "MAX_IDEMPOTENCY_KEY_LENGTH",
    "MAX_STEP_NAME_LENGTH",
    "TEXT_COLUMN_CHARACTERS",
    "MIB",
    "MIN_INT32",
    "MIN_INT64",
    "MIN_MAX_ALLOWED_PACKET",
    "Limit",
    "checked_text",
    "over_limit",
    "unstorable_text_rule_of",
]
