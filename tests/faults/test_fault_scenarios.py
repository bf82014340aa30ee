"""The fault scenarios on the database under test: real pod processes, real signals, the
audit after each (a short set that fits the default run)."""

from __future__ import annotations

import pytest
from fault_support import fault_url

from agboss_sql.lab.faults import SHORT_SET, fault_suite

pytestmark = [pytest.mark.faults, pytest.mark.database]

TestSqlFaults = fault_suite(name="SQL", url=fault_url, scenarios=SHORT_SET, time_scale=10)
