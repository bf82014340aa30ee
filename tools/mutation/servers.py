"""Mutants on a server database: one mutant at a time per database, verdict per mutant.

The SQLite run (`run.py`) cannot judge the statements and branches only the servers execute
(the MySQL-family paths without `RETURNING`, the Galera certification writes, the
conditions that matter only under a server's concurrency). This runs chosen mutants of
`mutants/` (mutmut's copy of the package, a switch per function) against a server: for each
mutant, pytest runs inside `mutants/` with `MUTANT_UNDER_TEST` naming it, the same tests as
the SQLite run (the SQL conformance suite and the SQL explorer's world test, at the
`AGBOSS_MUTATION_RUN=1` depth), first failure ending it, and
`AGBOSS_TEST_DATABASE_URL` the server's database.

A database is shared by everything that runs on it, so a mutant has its database to itself:
each `--url` is one worker that runs one mutant after another; several `--url`s (different
databases) run that many mutants side by side, never two on one URL.

    python tools/mutation/servers.py --url URL [--url URL2] --not-executed-on-sqlite
    python tools/mutation/servers.py --url URL --only 'NAME-PATTERN' ...
    python tools/mutation/servers.py --galera "$(bash dialects/galera/ready.sh)" --group galera
    python tools/mutation/servers.py --report [--md]

`--galera URLS` (the cluster's node URLs, as `dialects/galera/ready.sh` prints them) runs
the mutants with the instances spread over the nodes and adds `tests/galera`. Verdicts go
to `mutants/servers.json` (keyed by database kind and mutant), so a run stopped part-way
goes on where it stopped; `--again` runs named mutants again. `mutants/` is made by
mutmut's generation step when absent (`run.py` makes the same; `--fresh` there removes it).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path
from queue import Empty, Queue

from run import _chosen as selected_mutants  # the SQLite runner beside this file

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MUTANTS = ROOT / "mutants"
RESULTS = MUTANTS / "servers.json"

TESTS = (
    "tests/stores/test_conformance_sql.py",
    "tests/explorer/test_explorer_sql.py::test_the_sql_set_passes_every_world",
    # Real conflicts forced on the claim (a trigger): its retry path, which no race reaches.
    "tests/stores/test_sql_claim_conflicts.py",
    # A lease moved on between a MySQL-family renewal's two statements.
    "tests/stores/test_sql_leases.py::"
    "test_a_renewal_whose_lease_moves_on_between_its_two_statements_answers_its_own_floor",
    # A take that waited for another transaction's lock on the lease row answers the time
    # left after the wait (a server's clock read as the row comes back; skipped on SQLite).
    "tests/stores/test_sql_leases.py::"
    "test_a_take_that_waited_for_the_row_lock_reports_what_is_left_after_the_wait",
    # An enqueue that waits past its lock bound: on the MySQL family a duplicate is an
    # error of the insert, and no other error of the enqueue may be taken for one.
    "tests/stores/test_sql_child_queue.py::"
    "test_an_enqueue_that_waits_past_its_lock_bound_is_a_lock_timeout_not_a_duplicate",
    # A batch claim's ties on PostgreSQL with the table's statistics (rows returned in
    # their physical order, not the queue's).
    "tests/stores/test_queue_batch.py::"
    "test_a_batch_claim_answers_ties_in_queue_order_whatever_order_the_rows_come_in",
    # The child queue's wake-up listener (PostgreSQL LISTEN) under real faults: its session
    # killed, an unreachable or silent server, close(), a wait's timeout (skipped elsewhere).
    "tests/stores/test_queue_wakeups_faults.py",
    # The checkpoint saver's fenced writes: PostgreSQL folds a put into one statement,
    # MariaDB sends it as a script, SQLite as separate statements.
    # LangGraph's conformance and the reusable fenced-saver contract select them, as in the
    # SQLite run (pyproject.toml).
    "tests/checkpoint/test_conformance.py",
    "tests/checkpoint/test_saver_contract.py::TestSqlSaver",
    # A delete of a base run between a fenced put's base check and its commit (MySQL family).
    "tests/checkpoint/test_base_lock.py",
)
GALERA_TESTS = ("tests/galera",)

_QC = "agboss_sql.sql.queue.xǁQueueStatementsǁ_build_claims__mutmut_"
_QS = "agboss_sql.sql.queue.xǁQueueStatementsǁ_build_restarts__mutmut_"
_QR = "agboss_sql.sql.queue.xǁSqlChildExecutionQueueRepositoryǁ"
_QB = "agboss_sql.sql._queue_batch.xǁBatchQueueMethodsǁ"
_L = "agboss_sql.sql.leases.xǁLeaseStatementsǁ__init____mutmut_"
_LR = "agboss_sql.sql.leases.xǁSqlExecutionLeaseRepositoryǁ"
_E = "agboss_sql.sql.effects.xǁEffectStatementsǁ__init____mutmut_"
_ER = "agboss_sql.sql.effects.xǁSqlFencedEffectRepositoryǁ"


def _names(prefix: str, numbers: Iterable[int]) -> list[str]:
    return [f"{prefix}{n}" for n in numbers]


NOT_EXECUTED_ON_SQLITE: dict[str, list[str]] = {
    # The MySQL-family paths: no `UPDATE … RETURNING` (the claim, restart and renewal lock
    # then move then read), no `INSERT … ON CONFLICT … RETURNING` (the fenced effect's
    # claim inserts, then reads the row a unique violation names).
    "mysql": [
        *_names(_QC, (55, 62, 67, 71)),  # lock_next (next_row)
        *_names(_QC, (85, 86, 87, 88, 90, 94)),  # claim_locked
        *_names(_QS, (46, 48)),  # read_claimed
        *_names(_QR + "_claim_locked__mutmut_", (1, 2, 5, 10, 11, 12, 20, 26, 34, 35, 36, 39)),
        *_names(_QR + "_claim_locked__mutmut_", (56, 57)),
        *_names(_QR + "_restart_then_read__mutmut_", (5, 6, 12, 13, 14)),
        *_names(_QR + "claim__mutmut_", (23, 24, 25, 26, 27, 35, 36, 37, 38, 41)),
        *_names(_L, (282, 283, 284, 285, 286, 290)),  # read
        *_names(_LR + "_renew_then_read__mutmut_", (5, 6, 12, 13, 15, 16, 24, 25)),
        *_names(_LR + "reclaim__mutmut_", (35, 36, 38, 39)),  # the branch without RETURNING
        *_names(_E, (48, 49)),  # returns_claimed: the capability test that picks the path
        *_names(_E, (62, 63)),  # read
        *_names(_ER + "_claim__mutmut_", (20, 33, 34, 35)),  # the claim without RETURNING
    ],
    # A cluster that certifies write sets (Galera) only. The finish no longer has a write
    # of its own there (every finisher writes the parent's count, on every database); the
    # wait's (`ParentCountStatements.count_wait`) is in no mutated function.
    "galera": [],
    # The claim's retry after a certification conflict and its spread past the head of
    # the queue: in the MySQL-family code, but taken only where `certified_writes` holds.
    "galera-claim": [
        *_names(_QR + "_claim_locked__mutmut_", (2, 5, 10, 11, 12)),
        *_names(_QR + "claim__mutmut_", (23, 24, 25, 26, 27, 35, 36, 37, 38, 41)),
    ],
    # The batch claim's retry after a certification conflict and its spread past the head
    # (`claim_many`, `_claim_many_locked`): as `claim`'s, taken only where `certified_writes`
    # holds (`tests/stores/test_sql_claim_conflicts.py` runs its cases on both claims).
    "galera-batch-claim": [
        *_names(_QB + "claim_many__mutmut_", (37, 38, 39, 40, 51, 52, 53, 54, 57)),
        *_names(_QB + "_claim_many_locked__mutmut_", (3, 6, 11, 12, 13)),
    ],
    # Conditions that matter only with concurrent writers (SQLite runs one at a time).
    "concurrency": [
        *_names(_QC, (9, 22)),  # LIMIT 1 of the claim's scalar subquery
        _QC + "45",  # the claim's `status = 'queued'` re-check
    ],
}
"""The mutants of the SQLite run's "not executed on SQLite" list, by mutmut's numbering of
the current source (a change to a mutated function renumbers its mutants: check the names
against `mutants.py report` after regenerating)."""


def _generate() -> None:
    """mutmut's generation step alone (no test-to-function map: this runner picks its own
    tests): copies the package into `mutants/` and writes every mutant."""
    code = (
        "import os\n"
        "from mutmut.__main__ import create_mutants\n"
        "from mutmut.mutation.trampoline import set_mutant_under_test\n"
        "from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, "
        "setup_source_paths\n"
        "os.makedirs('mutants', exist_ok=True)\n"
        "set_mutant_under_test('mutant_generation')\n"
        "copy_src_dir(); copy_also_copy_files(); setup_source_paths()\n"
        f"print(create_mutants({os.cpu_count() or 2}))\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def _kind_of(url: str) -> str:
    scheme = url.split(":", 1)[0].split("+", 1)[0]
    return {"postgres": "postgresql", "mariadb": "mysql"}.get(scheme, scheme)


def _load() -> dict[str, dict[str, dict[str, object]]]:
    if RESULTS.exists():
        loaded: dict[str, dict[str, dict[str, object]]] = json.loads(
            RESULTS.read_text(encoding="utf-8")
        )
        return loaded
    return {}


_LOCK = threading.Lock()


def _save(kind: str, name: str, verdict: dict[str, object]) -> None:
    # Two runs on different databases may share the file: a lock across processes too.
    with _LOCK, (MUTANTS / "servers.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = _load()
        results.setdefault(kind, {})[name] = verdict
        RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True), encoding="utf-8")


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


KEYWORD = ""
"""`--keyword`: a pytest `-k` expression narrowing the tests of every mutant."""

_LIVE: set[subprocess.Popen[bytes]] = set()
"""The test processes running now (each in a process group of its own), ended with us."""


def _end_live(signum: int, frame: object) -> None:
    for process in list(_LIVE):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    raise SystemExit(128 + signum)


def run_one(
    mutant: str,
    url: str,
    galera: list[str] | None,
    timeout_s: float,
    log_dir: Path,
    only: list[str] | None = None,
    deselect: list[str] | None = None,
) -> dict[str, object]:
    """Run the tests (or `only` these) on one mutant (`""`: the unmutated code) against
    `url`: the verdict `killed` (with the first failing test), `survived` or `timeout`."""
    env = {
        **os.environ,
        "MUTANT_UNDER_TEST": mutant,
        "AGBOSS_MUTATION_RUN": "1",
        "AGBOSS_TEST_DATABASE_URL": url,
        "PYTHONPATH": str(MUTANTS),
    }
    env.pop("AGBOSS_TEST_DATABASE_URLS", None)
    env.pop("AGBOSS_GALERA_URLS", None)
    tests = list(TESTS)
    if galera:
        env["AGBOSS_TEST_DATABASE_URLS"] = " ".join(galera)
        env["AGBOSS_GALERA_URLS"] = " ".join(galera)
        tests = [*GALERA_TESTS, *tests]
    if only:
        tests = only
    if KEYWORD and not only:
        tests = [*tests, "-k", KEYWORD]
    for test in deselect or ():
        tests = [*tests, "--deselect", test]
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-x",
        "-q",
        "-rfE",
        "--no-header",
        *tests,
    ]
    log = _run_log(log_dir, mutant, confirm=bool(only))
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        process = subprocess.Popen(
            command,
            cwd=MUTANTS,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _LIVE.add(process)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
        finally:
            _LIVE.discard(process)
    seconds = round(time.monotonic() - started, 1)
    text = log.read_text(encoding="utf-8", errors="replace")
    if code is None:
        return {"verdict": "timeout", "seconds": seconds, "log": str(log)}
    if code == 0:
        return {"verdict": "survived", "seconds": seconds}
    failed = _FAILED.findall(text)
    if code == 1 and failed:
        return {"verdict": "killed", "by": failed[0], "seconds": seconds}
    return {"verdict": f"error (pytest exit {code})", "seconds": seconds, "log": str(log)}


def _run_log(log_dir: Path, mutant: str, *, confirm: bool = False) -> Path:
    """Where a run of `mutant` (`""`: the unmutated code) writes its output."""
    return log_dir / f"{mutant.rsplit('.', 1)[-1] or 'clean'}{'.confirm' if confirm else ''}.log"


def judge(
    mutant: str,
    url: str,
    galera: list[str] | None,
    timeout_s: float,
    log_dir: Path,
    recorded: dict[str, object] | None = None,
) -> dict[str, object]:
    """The mutant's verdict, a kill confirmed: the failing test alone, run again on the
    mutant, fails again (a test that failed from the machine's load, not from the mutant,
    passes then). A kill not confirmed runs the set again without that test (up to three
    runs): the verdict is then that of the other tests, the test named in `deselected`."""
    if recorded is not None and recorded["verdict"] == "killed" and "deselected" not in recorded:
        # A kill recorded before it was confirmed: confirm it alone first.
        again = run_one(mutant, url, galera, timeout_s, log_dir, only=[str(recorded["by"])])
        if again["verdict"] == "killed":
            return {**recorded, "confirmed": True}
    deselected: list[str] = []
    unconfirmed_logs: list[str] = []
    for _ in range(3):
        verdict = run_one(mutant, url, galera, timeout_s, log_dir, deselect=deselected)
        if deselected:
            verdict["deselected"] = list(deselected)
            verdict["unconfirmed_logs"] = list(unconfirmed_logs)
        if verdict["verdict"] != "killed":
            return verdict
        again = run_one(mutant, url, galera, timeout_s, log_dir, only=[str(verdict["by"])])
        if again["verdict"] == "killed":
            return {**verdict, "confirmed": True}
        # It passed alone on the mutant: run the set again without it, and keep the log of
        # the failure (the next run writes the same file) to read what the load did.
        kept = _run_log(log_dir, mutant).with_suffix(f".unconfirmed-{len(deselected) + 1}.log")
        _run_log(log_dir, mutant).replace(kept)
        unconfirmed_logs.append(str(kept))
        deselected.append(str(verdict["by"]))
    return {**verdict, "verdict": "killed (unconfirmed)"}


def _select(args: argparse.Namespace) -> list[str]:
    chosen: list[str] = []
    for group in args.group:
        chosen += NOT_EXECUTED_ON_SQLITE[group]
    if args.only:
        chosen += [n for n in selected_mutants() if any(fnmatch(n, p) for p in args.only)]
    return list(dict.fromkeys(chosen))


def report(markdown: bool) -> int:
    results = _load()
    group_of = {n: g for g, names in NOT_EXECUTED_ON_SQLITE.items() for n in names}
    for kind, verdicts in sorted(results.items()):
        counts: dict[str, int] = {}
        for verdict in verdicts.values():
            key = str(verdict["verdict"])
            counts[key] = counts.get(key, 0) + 1
        total = sum(float(str(v["seconds"])) for v in verdicts.values())
        print(f"{kind}: {len(verdicts)} mutants, {counts}, {total:.0f} s of mutant runs")
        for name, verdict in sorted(verdicts.items()):
            short = name.rsplit(".", 1)[-1]
            module = name.rsplit(".", 1)[0]
            by = verdict.get("by", "")
            if markdown:
                print(
                    f"| `{module.removeprefix('agboss_sql.')}` `{short}` | "
                    f"{group_of.get(name, '-')} | {verdict['verdict']} | {by} |"
                )
            else:
                print(f"  {verdict['verdict']:9} {short}  {by}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", action="append", default=[], help="a database (one worker)")
    parser.add_argument("--galera", help="the cluster's node URLs (whitespace-separated)")
    parser.add_argument(
        "--group",
        action="append",
        default=[],
        choices=sorted(NOT_EXECUTED_ON_SQLITE),
        help="a group of the SQLite run's not-executed mutants",
    )
    parser.add_argument("--not-executed-on-sqlite", action="store_true", help="every group of them")
    parser.add_argument("--only", action="append", default=[], help="a mutant name pattern")
    parser.add_argument("--again", action="store_true", help="run mutants with a verdict again")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant")
    parser.add_argument(
        "--keyword", default="", help="pytest -k: only these tests (a narrower verdict)"
    )
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--md", action="store_true")
    args = parser.parse_args()
    if args.report:
        return report(args.md)
    if args.not_executed_on_sqlite:
        args.group = ["mysql", "concurrency"] if not args.galera else ["galera", "galera-claim"]
    global KEYWORD
    KEYWORD = args.keyword
    galera = args.galera.split() if args.galera else None
    urls = [galera[0]] if galera else args.url
    if not urls:
        parser.error("name a database: --url URL (or --galera URLS)")
    kind = "galera" if galera else _kind_of(urls[0])
    if len({_kind_of(u) for u in urls}) != 1 or len(set(urls)) != len(urls):
        parser.error("the --url databases must be distinct databases of one kind")
    if not MUTANTS.exists():
        _generate()
    chosen = _select(args)
    done = _load().get(kind, {})
    todo = [
        n
        for n in chosen
        if args.again
        or n not in done
        or (str(done[n]["verdict"]).startswith("killed") and not done[n].get("confirmed"))
    ]
    print(f"{kind}: {len(chosen)} mutants chosen, {len(todo)} to run", flush=True)
    log_dir = MUTANTS / "server-logs" / kind
    log_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _end_live)
    started = time.monotonic()
    # The unmutated code must pass on every database first, or no verdict means anything.
    for url in urls:
        clean = run_one("", url, galera, args.timeout, log_dir)
        print(f"clean run on {url}: {clean}", flush=True)
        if clean["verdict"] != "survived":
            return 1
    work: Queue[str] = Queue()
    for name in todo:
        work.put(name)

    def worker(url: str) -> None:
        while True:
            try:
                name = work.get_nowait()
            except Empty:
                return
            verdict = judge(
                name, url, galera, args.timeout, log_dir, None if args.again else done.get(name)
            )
            if KEYWORD:
                verdict["keyword"] = KEYWORD
            _save(kind, name, verdict)
            print(f"{verdict['verdict']:9} {name.rsplit('.', 1)[-1]} {verdict}", flush=True)

    threads = [threading.Thread(target=worker, args=(url,)) for url in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"{kind}: {len(todo)} mutants in {time.monotonic() - started:.0f} s", flush=True)
    return report(False)


if __name__ == "__main__":
    sys.exit(main())
