"""Waiting for a task this code cancelled, without swallowing a cancellation of its own."""

from __future__ import annotations

import asyncio
from typing import Any


async def wait_cancelled(task: asyncio.Future[Any], *, quiet: bool = False) -> None:
    """Wait for `task` (cancelled by the caller) to end. Its `CancelledError` ends here (and,
    with `quiet`, any error it ended in); a cancellation of the caller's own task passes on.

    `with contextlib.suppress(asyncio.CancelledError): await task` cannot tell the two
    apart: a caller cancelled while it waits there absorbs its own cancellation and runs on
    (a worker loop told to stop that keeps looping)."""
    current = asyncio.current_task()
    # Cancellations the caller already has (this may be its clean-up after one): only a
    # new one, arriving during the wait, is the caller's to pass on.
    before = current.cancelling() if current is not None else 0
    try:
        await task
    except asyncio.CancelledError:
        if current is not None and current.cancelling() > before:
            raise
    except Exception:
        if not quiet:
            raise
