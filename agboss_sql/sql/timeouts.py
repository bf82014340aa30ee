"""`Timeouts`: the bound of every wait a `SqlConnection` makes."""

from __future__ import annotations

from agboss_sql._timeouts import Timeouts

__all__ = ["Timeouts"]
