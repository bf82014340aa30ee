"""Proving a store set: the conformance suite (`testing.contracts`), the interleaving
explorer (`testing.explorer`), the fenced LangGraph checkpoint saver's contract
(`testing.checkpoint_saver`), several instances on one store (`testing.instances`) and the
project's schema on a test database (`testing.database`). The fault suite is the lab's
(`agboss_sql.lab.faults`)."""

from __future__ import annotations
