"""Choose the mutants of the guard and fence code that `tox -e mutation` runs, and report.

mutmut (configured in pyproject.toml, `[tool.mutmut]`) writes every mutant of the files it
mutates into `mutants/`, one function per mutant beside the original. This script reads
those functions back, finds what each mutant changed against the original (the first
differing node), keeps the mutants of the functions in `TARGETS`, and drops the kinds that
are not a condition (`CONDITION_KINDS`):

- kept: comparison and boolean operators (`>` for `>=`, `==` for `!=`, `and` for `or`, a
  condition forced true or false), `not` dropped, `True`/`False` swapped, numbers, `+`/`-`,
  and each term dropped from (or set to None in) a `where(...)`, `and_(...)`, `or_(...)`,
  `case(...)`, `greatest(...)` or `least(...)`: mutmut's argument removal is the "dropped
  WHERE term" mutation, `sa.update(L).where(a, b, c)` loses `b`;
- dropped: a changed string literal (an error message, a bind parameter's or a column's
  name, which fails every statement that uses it), an argument of any other call set to
  None or dropped, an assigned value set to None (each fails loudly at its first use),
  and a call's keyword option changed (`priority=True`, `transaction=False`: how a
  statement is sent, not what it decides).

    python tools/mutation/mutants.py select          # the chosen names, one a line
    python tools/mutation/mutants.py report [--md]   # per-module kill rate and survivors
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

MUTANTS = Path("mutants")

EVERY: tuple[str, ...] = ("*",)
"""Every function of the module (its conditions, as for any target)."""

TARGETS: dict[str, tuple[str, ...]] = {
    # the in-memory stores, every function (the guards and fences among them)
    "agboss_sql.memory._fencing": EVERY,
    "agboss_sql.memory.leases": EVERY,
    "agboss_sql.memory.fenced": EVERY,
    "agboss_sql.memory.queue": EVERY,
    "agboss_sql.memory.backend": EVERY,
    "agboss_sql.memory.pauses": EVERY,
    "agboss_sql.memory.records": EVERY,
    "agboss_sql.memory.limits": EVERY,
    # the decisions both store families share
    "agboss_sql.contracts.rules": (
        "fence_refusal_of",
        "lease_state_at",
        "checked_attempt",
        "checked_attempt_owner",
    ),
    # the SQL statements' conditions and the code that reads their answers
    "agboss_sql.sql._fence": (
        "FenceStatements.__init__",
        "refusal_of",
        "fence_params",
        "fenced",
    ),
    "agboss_sql.sql.leases": (
        "_held",
        "LeaseStatements.__init__",
        "SqlExecutionLeaseRepository.acquire",
        "SqlExecutionLeaseRepository.renew",
        "SqlExecutionLeaseRepository._renew_then_read",
        "SqlExecutionLeaseRepository.release",
        "SqlExecutionLeaseRepository.yield_lease",
        "SqlExecutionLeaseRepository.reclaim",
        "SqlExecutionLeaseRepository.finish",
    ),
    "agboss_sql.sql.queue": (
        "QueueStatements._build_enqueue_and_lists",
        "QueueStatements._build_claims",
        "QueueStatements._build_restarts",
        "QueueStatements._build_finishes",
        "QueueStatements._build_waits",
        "QueueStatements._build_wakes",
        "SqlChildExecutionQueueRepository.claim",
        "SqlChildExecutionQueueRepository._claim_locked",
        "SqlChildExecutionQueueRepository.restart",
        "SqlChildExecutionQueueRepository._restart_then_read",
        "SqlChildExecutionQueueRepository.finish",
        "SqlChildExecutionQueueRepository._finish",
        # the rest of the store (its wake path: unwoken, claim_wake, mark_woken)
        "QueueStatements.__init__",
        "SqlChildExecutionQueueRepository.enqueue",
        "SqlChildExecutionQueueRepository._enqueue",
        "SqlChildExecutionQueueRepository.wakeups",
        "SqlChildExecutionQueueRepository.running",
        "SqlChildExecutionQueueRepository.wait_for_children",
        "SqlChildExecutionQueueRepository._wait",
        "SqlChildExecutionQueueRepository.unwoken",
        "SqlChildExecutionQueueRepository.claim_wake",
        "SqlChildExecutionQueueRepository.mark_woken",
        "SqlChildExecutionQueueRepository.children",
    ),
    "agboss_sql.sql._queue_batch": (
        "BatchStatements.__init__",
        "BatchStatements.lock_ids",
        "BatchStatements.claim_locked",
        "BatchQueueMethods._enqueue_many",
        "BatchQueueMethods.claim_many",
        "BatchQueueMethods._claim_many_locked",
        # The batch claim's order (deepest, oldest, then queue order), out of claim_many.
        "_claim_order",
    ),
    "agboss_sql.sql.outbound": (
        "OutboundStatements.__init__",
        "SqlOutboundCallRepository.mark_pending",
        "SqlOutboundCallRepository._end",
        "SqlOutboundCallRepository._fenced_update",
        "SqlOutboundCallRepository.lease_state_of",
    ),
    "agboss_sql.sql.effects": (
        "EffectStatements.__init__",
        "SqlFencedEffectRepository._claim",
    ),
    # the SQLite dialect's parts of the fence and take statements
    "agboss_sql._dialects.sqlite": ("now_source", "greatest", "least"),
    "agboss_sql._dialects.on_conflict": ("OnConflict.upsert_where", "OnConflict.insert_or_lock"),
    # the coordination stores on SQL, every function (the queue's wake path: `_build_wakes`
    # and the store's wake methods above, the PostgreSQL wake-up listener here)
    "agboss_sql.sql._queue_finish_many": EVERY,
    "agboss_sql.sql._queue_wakeups": EVERY,
    "agboss_sql.sql._queue_rows": EVERY,
    "agboss_sql.sql._child_parents": EVERY,
    "agboss_sql.sql.pauses": EVERY,
    "agboss_sql.sql.records": EVERY,
    "agboss_sql.sql.trees": EVERY,
    "agboss_sql.sql.mesh": EVERY,
    "agboss_sql.sql.rate_limits": EVERY,
    "agboss_sql.sql.costs": EVERY,
    "agboss_sql.sql.history": EVERY,
    "agboss_sql.sql.events": EVERY,
    # the checkpoint saver's fenced paths: the lease it reads from a config, the fenced
    # write statements and the writes that pick them (run by LangGraph's conformance and
    # the reusable fenced-saver contract, agboss_sql.testing.checkpoint_saver)
    "agboss_sql.sql.checkpoint._lease": EVERY,
    "agboss_sql.sql.checkpoint._write_statements": EVERY,
    "agboss_sql.sql.checkpoint._writes": EVERY,
}

STORE_PACKAGES = ("agboss_sql/memory", "agboss_sql/sql")
"""Where the store modules live: every module under them is in `TARGETS` or in
`NOT_MUTATED` with its reason (`tests/unit/test_mutation_targets.py` checks it)."""

NOT_MUTATED: dict[str, str] = {
    "agboss_sql.memory.__init__": "exports only",
    "agboss_sql.sql.__init__": "exports only",
    "agboss_sql.sql.checkpoint.__init__": "exports only",
    "agboss_sql.sql.timeouts": "exports only",
    "agboss_sql.sql._base": (
        "the stores' base classes: JSON in and out and the identity hash (every store's "
        "round trip fails without them), no decision of a store"
    ),
    "agboss_sql.sql._column_types": "column types of the schema, no decision",
    "agboss_sql.sql.schema": "the tables' definitions, no decision",
    "agboss_sql.sql.migrate": "schema migrations, proven by tests/migrations, no store decision",
    "agboss_sql.sql.statements": (
        "how a statement is compiled and sent (the statement cache, results), not what it "
        "decides; every store statement runs through it"
    ),
    "agboss_sql.sql.connection": (
        "the connection: retries, typed errors, an unknown commit outcome (the faults "
        "command and tests/faults prove them), not a store's decision"
    ),
    "agboss_sql.sql._backoff": "the connection's retry pauses",
    "agboss_sql.sql._deadline": "the connection's statement deadline (tests/faults)",
    "agboss_sql.sql._progress": "the connection's record of how far a step got",
    "agboss_sql.sql._runner": "the connection's runner interface",
    "agboss_sql.sql._inline_runner": "the connection's SQLite runner",
    "agboss_sql.sql._inline_work": "the connection's SQLite work transaction",
    "agboss_sql.sql._gate": (
        "the SQLite runner's connection gate (its mutants are killed by tests/unit/test_gate.py)"
    ),
    "agboss_sql.sql._effect_connection": (
        "the handle a fenced effect's work gets, which ends with the work: its refusals are "
        "each tested on every database (tests/stores/test_sql_fenced_effects.py)"
    ),
    "agboss_sql.sql._pool_runner": "the connection's server runner",
    "agboss_sql.sql.inspect": "the operator's read-only views (`agboss-sql inspect`), no store",
    "agboss_sql.sql._inspect_rows": "the operator's read-only views, no store",
    "agboss_sql.sql._tree_view": "the operator's read-only view of a tree, no store",
    "agboss_sql.sql.checkpoint.saver": (
        "the saver's public face: each method hands over to the reads and writes"
    ),
    "agboss_sql.sql.checkpoint._aio": (
        "the saver's deletes, copies and prunes: unfenced maintenance, proven by "
        "tests/checkpoint and LangGraph's own saver suite (tests/langgraph_suite)"
    ),
    "agboss_sql.sql.checkpoint._reads": "the saver's reads, unfenced (tests/checkpoint)",
    "agboss_sql.sql.checkpoint._delta": (
        "the saver's DeltaChannel history: unfenced reads, checked against the base class's "
        "walk for every checkpoint of a forked thread (tests/checkpoint/test_delta.py)"
    ),
    "agboss_sql.sql.checkpoint._statements": (
        "the saver's read, list, delete and copy statements, unfenced (the fenced writes are "
        "`_write_statements`)"
    ),
    "agboss_sql.sql.checkpoint._core": "the saver's keys, size checks and hashes, unfenced",
    "agboss_sql.sql.checkpoint._appends": "the saver's value encoding, unfenced",
    "agboss_sql.sql.checkpoint._bridge": "the saver's synchronous bridge, unfenced",
    "agboss_sql.sql.checkpoint._decoded": "the saver's value decoding, unfenced",
    "agboss_sql.sql.checkpoint._layout": "the saver's row layout, no decision",
    "agboss_sql.sql.checkpoint._sync": "the saver's synchronous database, unfenced",
    "agboss_sql.sql.checkpoint._sync_drivers": "the saver's synchronous drivers, unfenced",
    "agboss_sql.sql.checkpoint._values": "the saver's value rows, unfenced",
    "agboss_sql.sql.checkpoint.importing": (
        "threads brought over from another saver through the saver's public methods, "
        "unfenced (tests/checkpoint/test_import.py)"
    ),
}
"""The modules under `STORE_PACKAGES` not mutated, each with why: none is a store's
decision (its conditions are not what a store guarantees, or they are proven elsewhere)."""


def store_modules(root: Path = Path(".")) -> list[str]:
    """Every module under `STORE_PACKAGES` (dotted names), in path order."""
    found = []
    for package in STORE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            found.append(".".join(path.relative_to(root).with_suffix("").parts))
    return found


CONDITION_CALLS = {"where", "and_", "or_", "case", "greatest", "least", "not_"}


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str
    function: str
    line: int
    kind: str
    before: str
    after: str


def _mutant_functions(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    found: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in tree.body:
        bodies = node.body if isinstance(node, ast.ClassDef) else [node]
        for item in bodies:
            if (
                isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                and "__mutmut_" in item.name
            ):
                found[item.name] = item
    return found


def _first_difference(
    a: ast.AST, b: ast.AST, parents: tuple[ast.AST, ast.AST] | None
) -> tuple[ast.AST, ast.AST, tuple[ast.AST, ast.AST] | None] | None:
    """The first node where `a` and `b` differ, each with its parent."""
    if type(a) is not type(b):
        return a, b, parents
    for field in a._fields:
        va, vb = getattr(a, field, None), getattr(b, field, None)
        if isinstance(va, list) and isinstance(vb, list):
            if len(va) != len(vb):
                return a, b, parents
            for xa, xb in zip(va, vb, strict=True):
                if isinstance(xa, ast.AST) and isinstance(xb, ast.AST):
                    found = _first_difference(xa, xb, (a, b))
                    if found:
                        return found
                elif xa != xb:
                    return a, b, parents
        elif isinstance(va, ast.AST) and isinstance(vb, ast.AST):
            found = _first_difference(va, vb, (a, b))
            if found:
                return found
        elif isinstance(va, ast.AST) or isinstance(vb, ast.AST) or va != vb:
            return a, b, parents
    return None


def _body(function: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.Module:
    return ast.Module(body=function.body, type_ignores=[])


def _call_name(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute):
            return func.attr
        if isinstance(func, ast.Name):
            return func.id
    return ""


def _kind(a: ast.AST, b: ast.AST, parent: ast.AST | None) -> str:
    if isinstance(parent, ast.keyword):
        # An option of a call (`priority=True`, `transaction=False`): how a statement is
        # sent, not what it decides.
        return "keyword argument"
    if isinstance(a, ast.Constant) and isinstance(b, ast.Constant):
        if isinstance(a.value, str):
            return "string"
        return "number"
    if isinstance(a, ast.Call) and isinstance(b, ast.Call):
        name = _call_name(a)
        return f"argument of {name}()" if name in CONDITION_CALLS else "argument"
    if isinstance(parent, ast.Call) and isinstance(b, ast.Constant) and b.value is None:
        name = _call_name(parent)
        return f"argument of {name}()" if name in CONDITION_CALLS else "argument"
    if isinstance(a, (ast.Compare, ast.cmpop)):
        return "comparison"
    if isinstance(a, (ast.BoolOp, ast.boolop)):
        return "boolean"
    if isinstance(a, ast.UnaryOp) or isinstance(parent, ast.UnaryOp):
        return "unary"
    if isinstance(a, (ast.BinOp, ast.operator)):
        return "arithmetic"
    if isinstance(a, ast.Name) and a.id in ("True", "False"):
        return "boolean"
    if isinstance(a, ast.Constant) and a.value in (True, False):
        return "boolean"
    if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        return "assignment"
    return type(a).__name__.lower()


def _source(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:
        return type(node).__name__


def _source_lines(module: str) -> dict[str, int]:
    """The line of each function of `module`'s source ("Class.method" or "function")."""
    path = Path(module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines[f"{node.name}.{item.name}"] = item.lineno
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines[node.name] = node.lineno
    return lines


def _functions(
    functions: tuple[str, ...], defs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]
) -> tuple[str, ...]:
    """`functions`, or with `EVERY` each function mutmut mutated in the module
    ("Class.method" or "function", from its `__mutmut_orig` copy)."""
    if functions != EVERY:
        return functions
    found = []
    for name in defs:
        if not name.endswith("__mutmut_orig"):
            continue
        mangled = name[: -len("__mutmut_orig")]
        if mangled.startswith("xǁ"):
            cls, _, method = mangled[len("xǁ") :].partition("ǁ")
            found.append(f"{cls}.{method}")
        elif mangled.startswith("x_"):
            found.append(mangled[len("x_") :])
    return tuple(found)


def mutants() -> list[Mutant]:
    found: list[Mutant] = []
    for module, functions in TARGETS.items():
        path = MUTANTS / (module.replace(".", "/") + ".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defs = _mutant_functions(tree)
        source_lines = _source_lines(module)
        for function in _functions(functions, defs):
            cls, _, method = function.rpartition(".")
            prefix = f"xǁ{cls}ǁ{method}__mutmut_" if cls else f"x_{method}__mutmut_"
            original = defs.get(prefix + "orig")
            if original is None:
                continue
            for name, node in defs.items():
                suffix = name[len(prefix) :]
                if not name.startswith(prefix) or not suffix.isdigit():
                    continue
                diff = _first_difference(_body(original), _body(node), None)
                if diff is None:
                    continue
                a, b, parents = diff
                parent = parents[0] if parents else None
                kind = _kind(a, b, parent)
                if isinstance(a, (ast.cmpop, ast.boolop, ast.operator)) and parents:
                    a, b = parents
                found.append(
                    Mutant(
                        name=f"{module}.{name}",
                        module=module,
                        function=function,
                        line=source_lines.get(function, 0)
                        + getattr(a, "lineno", original.lineno)
                        - original.lineno,
                        kind=kind,
                        before=_source(a),
                        after=_source(b),
                    )
                )
    return found


CONDITION_KINDS = {"comparison", "boolean", "unary", "number", "arithmetic", "augassign", "name"}
"""The mutants of a condition: an operator, `and`/`or`, `not`, `True`/`False`, a number."""


def chosen(all_mutants: list[Mutant]) -> list[Mutant]:
    """The mutants of conditions: `CONDITION_KINDS`, and a term dropped from (or set to
    None in) a `where(...)`, `and_(...)`, `or_(...)`, `case(...)`, `greatest(...)`."""
    return [
        mutant
        for mutant in all_mutants
        if mutant.kind in CONDITION_KINDS or mutant.kind.startswith("argument of")
    ]


def _results() -> dict[str, int | None]:
    results: dict[str, int | None] = {}
    for meta in MUTANTS.rglob("*.py.meta"):
        results.update(json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"])
    return results


def _status(code: int | None) -> str:
    if code is None:
        return "not run"
    if code in (1, 3):
        return "killed"
    if code == 0:
        return "survived"
    if code in (-24, 24, 36, 152, 255):
        return "timeout"
    if code == 5:
        return "no tests"
    if code == 33:
        return "no tests"
    return f"exit {code}"


def report(markdown: bool) -> int:
    results = _results()
    picked = chosen(mutants())
    per_module: dict[str, Counter[str]] = defaultdict(Counter)
    survivors: list[Mutant] = []
    for mutant in picked:
        status = _status(results.get(mutant.name))
        per_module[mutant.module][status] += 1
        if status in ("survived", "no tests"):
            survivors.append(mutant)
    total: Counter[str] = Counter()
    rows = []
    for module in TARGETS:
        counts = per_module[module]
        total.update(counts)
        rows.append((module, counts))
    rows.append(("total", total))
    if markdown:
        print("| module | mutants | killed | timeout | survived | not run | kill rate |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for module, counts in rows:
        run = sum(counts.values()) - counts["not run"]
        dead = counts["killed"] + counts["timeout"]
        rate = f"{100 * dead / run:.1f}%" if run else "-"
        alive = counts["survived"] + counts["no tests"]
        if markdown:
            print(
                f"| `{module}` | {sum(counts.values())} | {counts['killed']} | "
                f"{counts['timeout']} | {alive} | {counts['not run']} | {rate} |"
            )
        else:
            print(
                f"{module:32} {sum(counts.values()):5} killed {counts['killed']:5} timeout "
                f"{counts['timeout']:3} survived {alive:3} not-run {counts['not run']:4} {rate}"
            )
    print()
    for mutant in survivors:
        status = _status(results.get(mutant.name))
        print(
            f"- `{mutant.name.rsplit('.', 1)[-1]}` ({mutant.module}:{mutant.line}, {mutant.kind}, "
            f"{status}): `{mutant.before}` -> `{mutant.after}`"
            if markdown
            else f"{mutant.name}  line {mutant.line} [{mutant.kind}] {status}\n"
            f"    {mutant.before}\n -> {mutant.after}"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("select", "report", "kinds"))
    parser.add_argument("--md", action="store_true")
    args = parser.parse_args()
    if args.command == "select":
        for mutant in chosen(mutants()):
            print(mutant.name)
        return 0
    if args.command == "kinds":
        all_mutants = mutants()
        picked = {m.name for m in chosen(all_mutants)}
        counts = Counter((m.kind, m.name in picked) for m in all_mutants)
        for (kind, kept), n in sorted(counts.items()):
            print(f"{n:5} {'kept' if kept else 'dropped':7} {kind}")
        return 0
    return report(args.md)


if __name__ == "__main__":
    sys.exit(main())
