"""`tox -e mutation`: mutmut over the guard and fence code, then the report.

1. `mutmut run` on one mutant: writes every mutant into `mutants/` and records which tests
   reach which function (kept in `mutants/` for the next runs);
2. `mutants.py select`: the mutants of the guard and fence functions, conditions only in
   the statement builders;
3. `mutmut run` on those: each mutant against the tests that reach its function, first
   failure ends it (the tests: pyproject.toml, `[tool.mutmut]`);
4. `mutants.py report`: the kill rate per module and every surviving mutant.

    python tools/mutation/run.py [--max-children N] [--fresh] [--only 'NAME-PATTERN' ...]
    python tools/mutation/run.py --rerun-survivors [--only 'NAME-PATTERN' ...]

`--fresh` removes `mutants/` first (after a change to the code or the tests: mutmut keeps
the results of mutants it ran). `--rerun-survivors` runs the survivors of the last run
again (after adding the cases that should kill them); `--only` picks some mutants by name
pattern (`*` matches anything), e.g. `--only 'agboss_sql.memory.pauses.*'` for one module.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from fnmatch import fnmatch
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MUTANTS = ROOT / "mutants"
SEED_MUTANT = "agboss_sql.memory._fencing.x_raise_mark__mutmut_1"


def _mutmut(*args: str) -> int:
    mutmut = Path(sys.executable).with_name("mutmut")
    command = [str(mutmut) if mutmut.exists() else "mutmut", *args]
    print(
        "+",
        " ".join(command[:5]),
        f"... ({len(command) - 5} more)" if len(command) > 5 else "",
        flush=True,
    )
    return subprocess.call(command, cwd=ROOT)


BUILDER_TESTS: dict[str, tuple[str, ...]] = {
    # builder (mangled function name prefix) -> the modules whose tests run its statements
    "agboss_sql.sql._fence.xǁFenceStatementsǁ": ("agboss_sql.sql._fence.",),
    "agboss_sql.sql.leases.xǁLeaseStatementsǁ": ("agboss_sql.sql.leases.",),
    "agboss_sql.sql.leases.x__held": ("agboss_sql.sql.leases.",),
    "agboss_sql.sql.queue.xǁQueueStatementsǁ": ("agboss_sql.sql.queue.",),
    "agboss_sql.sql.outbound.xǁOutboundStatementsǁ": ("agboss_sql.sql.outbound.",),
    "agboss_sql.sql.effects.xǁEffectStatementsǁ": ("agboss_sql.sql.effects.",),
    "agboss_sql._dialects.on_conflict.xǁOnConflictǁupsert_where": ("agboss_sql.sql.leases.",),
    "agboss_sql._dialects.on_conflict.xǁOnConflictǁinsert_or_lock": ("agboss_sql.sql.effects.",),
    "agboss_sql._dialects.sqlite.x_greatest": ("agboss_sql.sql.leases.",),
    "agboss_sql._dialects.sqlite.x_least": ("agboss_sql.sql.leases.",),
    "agboss_sql._dialects.sqlite.x_now_source": (
        "agboss_sql.sql.leases.",
        "agboss_sql.sql._fence.",
    ),
}
"""A connection builds its statements once (`SqlConnection.prepared`) and reuses them, so
mutmut's record of the tests that call a builder names only the first test of each
connection. A builder's mutant must meet every test that runs its statements: the tests of
the store functions of its module (one more store call per test is all it takes)."""


def _builders(by_function: dict[str, list[str]]) -> dict[str, tuple[str, ...]]:
    """`BUILDER_TESTS`, and in every other SQL module its statement classes (`...Statements`)
    and its module-level functions (the helpers that build a statement's terms, `_move`,
    `_the_pause`, ...; a row's decoder gains tests it did not need), each with its own
    module's tests: statement sets are built once per process and dialect, so the stats run
    records their builders under the first test only."""
    builders = dict(BUILDER_TESTS)
    for name in by_function:
        if not name.startswith("agboss_sql.sql."):
            continue
        if "xǁ" in name:
            module, _, mangled = name.partition(".xǁ")
            cls = mangled.partition("ǁ")[0]
            if not cls.endswith("Statements"):
                continue
            prefix = f"{module}.xǁ{cls}ǁ"
        else:
            module, _, function = name.partition(".x_")
            if not function:
                continue
            prefix = name
        if not any(prefix.startswith(b) for b in builders):
            builders[prefix] = (f"{module}.",)
    return builders


def _widen_builder_tests() -> None:
    path = MUTANTS / "mutmut-stats.json"
    stats = json.loads(path.read_text(encoding="utf-8"))
    by_function: dict[str, list[str]] = stats["tests_by_mangled_function_name"]
    builders = _builders(by_function)
    for builder, modules in builders.items():
        users = {
            test
            for name, tests in by_function.items()
            if name.startswith(modules)
            for test in tests
        }
        for name in by_function:
            if name.startswith(builder):
                by_function[name] = sorted(users | set(by_function[name]))
    path.write_text(json.dumps(stats, indent=2), encoding="utf-8")


def _chosen() -> list[str]:
    out = subprocess.run(
        [sys.executable, str(HERE / "mutants.py"), "select"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()


def _forget(names: set[str]) -> None:
    """Drop the recorded results of `names`, so that mutmut runs them again."""
    for meta in MUTANTS.rglob("*.py.meta"):
        data = json.loads(meta.read_text(encoding="utf-8"))
        codes = data["exit_code_by_key"]
        changed = False
        for name in names & codes.keys():
            codes[name] = None
            changed = True
        if changed:
            meta.write_text(json.dumps(data, indent=4), encoding="utf-8")


def _codes() -> dict[str, int | None]:
    codes: dict[str, int | None] = {}
    for meta in MUTANTS.rglob("*.py.meta"):
        codes.update(json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"])
    return codes


def _survivors(chosen: list[str]) -> set[str]:
    codes = _codes()
    return {name for name in chosen if codes.get(name) in (0, 5, 33)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--rerun-survivors", action="store_true")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="only the mutants whose name matches this pattern (`*` matches anything)",
    )
    args = parser.parse_args()
    started = time.monotonic()
    # The explorer's shallower search for each mutant, without its time bound.
    os.environ["AGBOSS_MUTATION_RUN"] = "1"
    # Mutants run side by side: each test process takes its own temporary SQLite file.
    os.environ.pop("AGBOSS_TEST_DATABASE_URL", None)
    os.environ.pop("AGBOSS_TEST_DATABASE_URLS", None)
    if args.fresh and MUTANTS.exists():
        shutil.rmtree(MUTANTS)
    children = ["--max-children", str(args.max_children)]
    if not MUTANTS.exists():
        # Generation and the test-to-function map; the one mutant's result is kept.
        _mutmut("run", *children, SEED_MUTANT)
    _widen_builder_tests()
    chosen = _chosen()
    if args.rerun_survivors:
        again = _survivors(chosen)
        if args.only:
            again = {name for name in again if any(fnmatch(name, p) for p in args.only)}
        _forget(again)
        chosen = sorted(again)
    else:
        # mutmut runs every mutant it is named, also those it ran: name the new ones only.
        codes = _codes()
        chosen = [name for name in chosen if codes.get(name) is None]
        if args.only:
            chosen = [name for name in chosen if any(fnmatch(name, p) for p in args.only)]
    print(f"{len(chosen)} mutants chosen", flush=True)
    if chosen:
        _mutmut("run", *children, *chosen)
    subprocess.call([sys.executable, str(HERE / "mutants.py"), "report"], cwd=ROOT)
    print(f"mutation run: {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
