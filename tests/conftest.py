"""Shared pytest configuration: which database the run targets."""

from __future__ import annotations

import os
import re

import pytest

DATABASE_URL_ENV = "AGBOSS_TEST_DATABASE_URL"


def _env_database_url() -> str | None:
    return os.environ.get(DATABASE_URL_ENV) or None


def _hide_password(url: str) -> str:
    return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)


def pytest_report_header(config: pytest.Config) -> str:
    url = _env_database_url()
    if url is None:
        return f"agboss database: temporary SQLite file ({DATABASE_URL_ENV} not set)"
    return f"agboss database: {_hide_password(url)}"


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """SQLAlchemy URL of the database under test.

    ``AGBOSS_TEST_DATABASE_URL`` when set (tox sets it from ``dialects/<db>/ready.sh``),
    otherwise a fresh SQLite file for this session.
    """
    url = _env_database_url()
    if url is not None:
        return url
    path = tmp_path_factory.mktemp("sqlite") / "agboss_test.sqlite"
    return f"sqlite:///{path}"
