"""LangGraph's published checkpointer conformance suite, run against `SqlCheckpointSaver`."""

from __future__ import annotations

from collections.abc import AsyncIterator

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    ALL_CAPABILITIES,
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
)

from agboss_sql.sql.checkpoint import SqlCheckpointSaver
from agboss_sql.sql.connection import SqlConnection


async def test_every_capability_passes_none_skipped(sql: SqlConnection) -> None:
    made: list[SqlCheckpointSaver] = []

    @checkpointer_test(name=f"SqlCheckpointSaver[{sql.dialect_name}]")
    async def saver() -> AsyncIterator[SqlCheckpointSaver]:
        instance = SqlCheckpointSaver(sql)
        made.append(instance)
        yield instance

    report = await validate(saver)
    report.print_report()

    # The suite creates one saver per capability: all eight ran.
    assert len(made) == len(ALL_CAPABILITIES)
    assert ALL_CAPABILITIES == BASE_CAPABILITIES | EXTENDED_CAPABILITIES
    assert set(report.results) == {capability.value for capability in ALL_CAPABILITIES}
    for capability in ALL_CAPABILITIES:
        result = report.results[capability.value]
        assert result.detected, f"{capability.value}: not detected as implemented"
        assert result.passed is True, f"{capability.value}: {result.failures}"
        assert result.tests_failed == 0, f"{capability.value}: {result.failures}"
        assert result.tests_skipped == 0, f"{capability.value}: {result.tests_skipped} skipped"
        assert result.tests_passed > 0, f"{capability.value}: no test ran"
    assert report.passed_all_base()
    assert report.conformance_level() == "FULL"
