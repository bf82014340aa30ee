"""The lab: what proves the library under real processes, signals and network cuts, and
what measures it. Nothing in the library imports it (`tox -e lint` checks that).

- `cluster`: `agboss-sql cluster`, worker processes (`agboss-sql worker`, the runtime's
  `Engine`) running a workflow app on one database through kills, a freeze and a cancel,
  audited from the database (`cluster_audit`); `tree_app` is the demo workload of trees,
  written on the public workflow API like any user's app;
- `demo`: `agboss-sql demo`, one takeover told step by step;
- `faults`: the fault suite (pods, hold points, the TCP proxy, the scenarios, the audit,
  `fault_suite`), `agboss-sql faults`;
- `bench`: `agboss-sql bench`, the stores beside the raw driver;
- `business`, `database`: the business table the project's suites and the lab write to,
  and the schema with it.

It needs the `lab` extra (`pip install '.[lab]'`), which brings `REQUIRES`.
"""

from __future__ import annotations

from importlib.util import find_spec

REQUIRES = ("rich",)
"""The modules the lab imports beyond the library's dependencies (the `lab` extra)."""


def missing_requirements() -> list[str]:
    """The modules of `REQUIRES` that are not installed (none imported to find out)."""
    return [name for name in REQUIRES if find_spec(name) is None]


__all__ = ["REQUIRES", "missing_requirements"]
