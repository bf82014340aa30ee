"""A fixture, never imported: copied into `agboss_sql/sql/` of a copy of the package, it
makes the SQL stores import the lab, which both import contracts forbid."""

from agboss_sql.lab.cluster import run_cluster

__all__ = ["run_cluster"]
