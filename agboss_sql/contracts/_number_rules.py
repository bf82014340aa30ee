"""The number and payload rules every store applies (re-exported by `contracts.rules`): the
ranges of the whole numbers stores write, and the JSON text of a payload."""

from __future__ import annotations

import json

from agboss_sql.contracts.errors import InvalidNumberError, InvalidPayloadError
from agboss_sql.contracts.limits import (
    MAX_DURATION_MS,
    MAX_INT32,
    MAX_INT64,
    MAX_PAYLOAD_BYTES,
    MIN_INT32,
    MIN_INT64,
)

# --- numbers ---------------------------------------------------------------------------------
#
# The ranges (in `contracts.limits`, with every other limit) are checked here, and every
# store (in memory and on SQL) checks them before any statement runs, so a value out of range
# gets one typed error on every backend (`InvalidNumberError`, a `ValueError`) and nothing is
# written. Without them SQLite stores what the servers refuse (an int beyond 64 bits as a
# float, a depth beyond 32 bits).

_LIMIT_OF = {MAX_INT64: "MAX_INT64", MAX_INT32: "MAX_INT32", MAX_DURATION_MS: "MAX_DURATION_MS"}


def _range_error(what: str, value: int, low: int, high: int) -> InvalidNumberError:
    limit = _LIMIT_OF.get(high, "MAX_INT64")
    return InvalidNumberError(
        f"{what} must be between {low} and {high} ({limit}), got {value}", limit=limit
    )


def checked_int(
    what: str,
    value: object,
    *,
    minimum: int | None = None,
    low: int = MIN_INT64,
    high: int = MAX_INT64,
) -> int:
    """`value` if it is an int (not a bool) of at least `minimum` within `[low, high]` (a
    signed 64-bit number unless told), else `InvalidNumberError` (a `ValueError`; out of range, it names
    the limit)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidNumberError(f"{what} must be an int, got {value!r:.80}")
    if minimum is not None and value < minimum:
        raise InvalidNumberError(f"{what} must be an int >= {minimum}, got {value!r}")
    if not low <= value <= high:
        raise _range_error(what, value, low, high)
    return value


def checked_int32(what: str, value: object, *, minimum: int | None = None) -> int:
    """`checked_int` within a signed 32-bit number (a depth, an attempt)."""
    # A plain int in range answers at once (every attempt of a batch finish comes here).
    if (
        type(value) is int
        and MIN_INT32 <= value <= MAX_INT32
        and (minimum is None or value >= minimum)
    ):
        return value
    return checked_int(what, value, minimum=minimum, low=MIN_INT32, high=MAX_INT32)


def checked_count(what: str, value: object) -> int:
    """`value` if it is an int >= 0 (a count, a limit, an amount) of at most `MAX_INT64`,
    else `InvalidNumberError` (a `ValueError`)."""
    if type(value) is int and 0 <= value <= MAX_INT64:
        return value  # a plain int in range: at once (a claim's batch size)
    return checked_int(what, value, minimum=0)


def checked_positive_ms(what: str, value: object) -> int:
    """`value` if it is a positive whole number of ms, at most `MAX_DURATION_MS`, else
    `InvalidNumberError` (a `ValueError`): a zero or negative duration (a lease, a slot, a window) would be granted
    already over; a longer one would overflow the store's time on some backend."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidNumberError(f"{what} must be a positive number of ms, got {value!r:.80}")
    if value > MAX_DURATION_MS:
        raise _range_error(what, value, 1, MAX_DURATION_MS)
    return value


def checked_time(what: str, value: object) -> int:
    """`value` if it is a time in ms since the epoch (an int that fits 64 bits), else
    `InvalidNumberError` (a `ValueError`)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidNumberError(f"{what} is a time in ms (an int), got {value!r:.80}")
    if not MIN_INT64 <= value <= MAX_INT64:
        raise _range_error(what, value, MIN_INT64, MAX_INT64)
    return value


def checked_token(value: object) -> int:
    """`value` if it is a lease token (an epoch: an int that fits 64 bits), else
    `InvalidNumberError` (a `ValueError`)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidNumberError(f"a lease token is an int, got {value!r:.80}")
    if not MIN_INT64 <= value <= MAX_INT64:
        raise _range_error("a lease token", value, MIN_INT64, MAX_INT64)
    return value


# --- payloads --------------------------------------------------------------------------------


def payload_text(what: str, value: object) -> str:
    """The JSON text a store writes for payload `value`, or `InvalidPayloadError` (before
    any statement): no NaN or infinity, nothing JSON has no form for, no cycle or nesting
    deeper than the encoder goes, no lone surrogate, at most `MAX_PAYLOAD_BYTES`."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidPayloadError(
            f"{what} is not JSON every backend stores: {type(exc).__name__}: {exc}"
        ) from None
    if not text.isascii():
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidPayloadError(f"{what} holds a lone surrogate: no UTF-8 form") from None
    else:
        size = len(text)
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidPayloadError(
            f"{what} is {size} bytes of JSON, over MAX_PAYLOAD_BYTES ({MAX_PAYLOAD_BYTES} bytes)",
            limit="MAX_PAYLOAD_BYTES",
        )
    return text


def checked_payloads_together(what: str, *texts: str | None) -> None:
    """`InvalidPayloadError` when the JSON texts one call writes (`payload_text`'s) are
    together over `MAX_PAYLOAD_BYTES` (UTF-8), before any statement: the largest statement
    a store sends stays within `MIN_MAX_ALLOWED_PACKET` on MySQL/MariaDB."""
    size = sum(len(text.encode("utf-8")) for text in texts if text is not None)
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidPayloadError(
            f"{what} are together {size} bytes of JSON, over MAX_PAYLOAD_BYTES "
            f"({MAX_PAYLOAD_BYTES} bytes)",
            limit="MAX_PAYLOAD_BYTES",
        )
