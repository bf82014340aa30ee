"""No shipped module grows past `LIMIT` lines: a module a newcomer opens should read in one
sitting. The modules over it when the limit came in are listed in `TO_SPLIT`, each with its
length then; the list only shrinks. The tree is read as it is (every `.py` file under
`agboss_sql/`), so a module moved or added is measured where it now lives."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "agboss_sql"

LIMIT = 600
"""Lines of the longest module allowed."""

TO_SPLIT: dict[str, int] = {
    # Modules still to split, by path under agboss_sql/, with their length when the limit
    # came in. Split one, then delete its line here: the test fails while a listed module
    # is under the limit (or gone), so the list cannot keep a module that no longer needs it.
}


def _lengths() -> dict[str, int]:
    """Lines of every module under agboss_sql/, by its path there."""
    return {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def test_no_module_outside_the_list_is_over_the_limit() -> None:
    over = {
        path: lines for path, lines in _lengths().items() if lines > LIMIT and path not in TO_SPLIT
    }
    assert not over, (
        f"over {LIMIT} lines: {over}; split them (a module moved keeps its entry in "
        "TO_SPLIT under its new path)"
    )


def test_every_listed_module_is_still_over_the_limit() -> None:
    lengths = _lengths()
    done = {path: lengths.get(path) for path in TO_SPLIT if lengths.get(path, 0) <= LIMIT}
    assert not done, (
        f"under {LIMIT} lines now, or gone (None): {done}; delete their entries in TO_SPLIT"
    )


def test_the_walk_finds_the_package() -> None:
    # A walk that found nothing would pass both tests above.
    assert "sql/checkpoint/saver.py" in _lengths()
