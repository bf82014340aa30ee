"""The network scenarios of the fault suite: real pods, each behind its own proxy.

Each scenario (`agboss_sql.lab.faults.network`) runs the fault suite's workload with
three pod processes on the server under test, cuts one pod off (drop, black hole), slows
every pod down, or cuts a pod's connection right after it sends COMMIT (the COMMIT lost,
or only its reply), and then audits every promise from the database and the pods' logs.
"""

from __future__ import annotations

import pytest
from support.capabilities import proxied_network_path

from agboss_sql.lab.faults.network import (
    NETWORK_SCENARIO_ACTS,
    run_network_scenario,
)
from agboss_sql.lab.faults.suite import format_report

pytestmark = [pytest.mark.database, pytest.mark.faults, pytest.mark.slow]


@pytest.mark.parametrize(
    "name",
    list(NETWORK_SCENARIO_ACTS),
)
def test_network_scenario(database_url: str, name: str) -> None:
    if not proxied_network_path(database_url):
        pytest.skip("network faults need a server database")
    result = run_network_scenario(database_url, name)
    if not result.passed:
        pytest.fail(format_report([result], title=f"network: {name}"), pytrace=False)
