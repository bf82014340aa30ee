"""Fixtures of the in-memory store tests."""

from __future__ import annotations

import pytest
from memory_cluster import Cluster


@pytest.fixture
def cluster() -> Cluster:
    """Two or more instances' stores on one fresh backend and one virtual clock."""
    return Cluster()
