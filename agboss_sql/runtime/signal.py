"""`AbortSignal`: what a running execution checks before it starts any model, tool or
effect call."""

from __future__ import annotations

import asyncio


class AbortSignal:
    """Set once, with the reason the execution must stop; never cleared.

    The first reason wins: a lease lost after a cancellation keeps the cancellation as the
    reason (either way the execution starts nothing more).
    """

    __slots__ = ("_event", "_reason")

    def __init__(self) -> None:
        self._reason: BaseException | None = None
        self._event = asyncio.Event()

    @property
    def aborted(self) -> bool:
        """True once the execution must stop."""
        return self._reason is not None

    @property
    def reason(self) -> BaseException | None:
        """Why it was aborted (`ExecutionLeaseLostError`, `ExecutionCancelledError`), or
        `None`."""
        return self._reason

    def abort(self, reason: BaseException) -> bool:
        """Abort with `reason` unless already aborted. True when this call aborted it."""
        if self._reason is not None:
            return False
        self._reason = reason
        self._event.set()
        return True

    def raise_if_aborted(self) -> None:
        """Raise the reason when aborted: call it before every model, tool or effect call."""
        if self._reason is not None:
            raise self._reason

    async def wait(self) -> BaseException:
        """Return the reason once the signal is aborted."""
        await self._event.wait()
        assert self._reason is not None
        return self._reason

    def __repr__(self) -> str:
        return f"AbortSignal(aborted={self.aborted}, reason={self._reason!r})"


__all__ = ["AbortSignal"]
