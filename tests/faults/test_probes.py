"""The fault suite's probes on the database under test, each with real processes
(`agboss_sql.lab.faults.probes`; `agboss-sql faults --scenario lease-starvation` and
`--scenario clock-jump` run the same).

- A holder keeps a 3 s lease while takes of a row another process locked fill the takes'
  lane (servers), and while its own 2.5 s fenced effect holds the lease row: the renewal
  that waits behind the effect is accepted, and the effect commits (issue: the lease was
  lost at 1.8 s, every database).
- A process whose application clock is an hour ahead is refused the slot and the window
  unit another process holds (issue: it evicted the live slot, two holders of one slot).
"""

from __future__ import annotations

import pytest
from fault_support import fault_url

from agboss_sql.lab.faults.probes import clock_jump, lease_starvation

pytestmark = [pytest.mark.faults, pytest.mark.database]


def test_a_lease_is_kept_through_blocked_takes_and_its_own_long_effect() -> None:
    assert lease_starvation(fault_url()) == []


def test_a_jumped_application_clock_neither_evicts_a_live_slot_nor_moves_a_window() -> None:
    assert clock_jump(fault_url()) == []
