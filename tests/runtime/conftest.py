"""Fixtures of the runtime tests: an in-memory world (the SQL fixtures are shared)."""

from __future__ import annotations

import pytest
from runtime_support import World


@pytest.fixture
def world() -> World:
    """Instances' in-memory stores on one fresh backend and one virtual clock."""
    return World()
