"""A fixture, never imported: copied into `agboss_sql/sql/` of a copy of the package, it
makes the SQL stores import the lab, which both import contracts forbid."""

from agboss_sql.lab.tree_worker import Worker

__all__ = ["Worker"]
