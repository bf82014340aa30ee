"""The documentation in docs/ and README.md stays true to the code: every contract
method, error code, bound and command is documented, every link inside the repository
resolves, and no text points to a document outside the repository."""

from __future__ import annotations

import inspect
import re
import subprocess
from pathlib import Path

import pytest

from agboss_sql import cli
from agboss_sql.contracts import errors
from agboss_sql.contracts.stores import CONTRACTS
from agboss_sql.sql import Timeouts

REPOSITORY = Path(__file__).resolve().parents[2]
DOCS = REPOSITORY / "docs"
PAGES = [REPOSITORY / "README.md", *sorted(DOCS.glob("*.md"))]


def page(name: str) -> str:
    return (DOCS / name).read_text()


@pytest.mark.parametrize("contract", CONTRACTS.values(), ids=lambda c: c.__name__)
def test_every_contract_method_is_documented(contract: type) -> None:
    text = page("contracts.md")
    assert f"## {contract.__name__}" in text
    section = text.split(f"## {contract.__name__}", 1)[1].split("\n## ", 1)[0]
    for name, member in vars(contract).items():
        if getattr(member, "__isabstractmethod__", False):
            assert f"`{name}" in section, f"{contract.__name__}.{name} is not in docs/contracts.md"


def test_every_error_code_is_documented() -> None:
    text = page("errors.md")
    for _, error in inspect.getmembers(errors, inspect.isclass):
        if issubclass(error, errors.AgbossError) and error is not errors.AgbossError:
            assert f"`{error.__name__}`" in text, error.__name__
            assert f"`{error.code}`" in text, error.code


def test_every_bound_is_documented() -> None:
    text = page("limits.md")
    for field, default in Timeouts.__dataclass_fields__.items():
        assert f"`{field}` | {default.default:,} |" in text, field


def test_every_command_is_documented() -> None:
    text = page("operations.md")
    for name in cli.SUBCOMMANDS:
        assert f"`agboss-sql {name}" in text, name


def test_every_link_inside_the_repository_resolves() -> None:
    for path in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.name} links to missing {target}"


def test_no_text_points_outside_the_repository() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPOSITORY, capture_output=True, text=True, check=False
    )
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    # Spelled in pieces so that this file does not match itself.
    outside = re.compile("SPEC" + r"(\.md|\s*§|\s+\d)|" + "/work" + "/shared")
    found = []
    for name in tracked.stdout.split():
        path = REPOSITORY / name
        if not path.is_file() or path.suffix not in {".py", ".md", ".ini", ".toml", ".sh", ""}:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if outside.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == []
