"""A fixture, never imported: copied into `agboss_sql/memory/` of a copy of the package
beside `cycle_b.py`, the two make an import cycle."""

from agboss_sql.memory.cycle_b import B

A = B
__all__ = ["A"]
