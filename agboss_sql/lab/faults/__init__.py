"""The fault suite (docs/testing.md): a store set run by real pod processes under real faults
(SIGKILL at hold points, SIGSTOP past the lease, SIGTERM, a store outage inside a pod),
then every promise audited from the database and the pods' event logs.

    TestMine = fault_suite(name="PostgreSQL", url=url, stores="mypkg.stores:store_set")

pytest is imported only when a class is built.
"""

from __future__ import annotations

from agboss_sql.lab.faults.audit import (
    RULES,
    AuditFacts,
    StoreHistory,
    Violation,
    audit,
    read_sql_history,
)
from agboss_sql.lab.faults.fixture import PodIdentity, PodStores, sql_store_set
from agboss_sql.lab.faults.harness import Cluster, NetworkFault, UrlForPod, WaitTimeout
from agboss_sql.lab.faults.holds import (
    AFTER_COMMIT,
    AFTER_WORK,
    BEFORE_FENCE,
    BEFORE_WORK,
    HoldController,
    StoreHoldPoint,
    with_hold_points,
)
from agboss_sql.lab.faults.network import network_scenarios
from agboss_sql.lab.faults.probes import probe_scenarios
from agboss_sql.lab.faults.run import FaultSettings, ScenarioRun
from agboss_sql.lab.faults.scenarios import SCENARIOS, SHORT_SET, Hold, Scenario, register
from agboss_sql.lab.faults.suite import (
    DEFAULT_STORES,
    DUMP_ENV,
    ScenarioResult,
    fault_suite,
    format_report,
    run_scenario,
)

# The network scenarios (server databases only) are named scenarios like the others, so
# `agboss-sql faults` runs them too; they are not in SHORT_SET (tests run them apart).
for _scenario in network_scenarios().values():
    if _scenario.name not in SCENARIOS:
        register(_scenario)
# The probes (their own processes, no pods) too; tests/faults/test_probes.py runs them.
for _scenario in probe_scenarios().values():
    if _scenario.name not in SCENARIOS:
        register(_scenario)

__all__ = [
    "AFTER_COMMIT",
    "AFTER_WORK",
    "BEFORE_FENCE",
    "BEFORE_WORK",
    "DEFAULT_STORES",
    "DUMP_ENV",
    "RULES",
    "SCENARIOS",
    "SHORT_SET",
    "AuditFacts",
    "Cluster",
    "FaultSettings",
    "Hold",
    "HoldController",
    "NetworkFault",
    "PodIdentity",
    "PodStores",
    "Scenario",
    "ScenarioResult",
    "ScenarioRun",
    "StoreHistory",
    "StoreHoldPoint",
    "UrlForPod",
    "Violation",
    "WaitTimeout",
    "audit",
    "fault_suite",
    "format_report",
    "read_sql_history",
    "run_scenario",
    "sql_store_set",
    "with_hold_points",
]
