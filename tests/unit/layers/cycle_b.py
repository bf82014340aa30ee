"""A fixture, never imported: the other half of `cycle_a.py`'s cycle."""

from agboss_sql.memory.cycle_a import A

B = A
__all__ = ["B"]
