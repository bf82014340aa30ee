"""The operator's views of a live database: `trees` (every tree with its status, holder,
epoch, age, children pending and pauses), `show` (one tree's steps, children, pauses,
compensations and lease moves in one timeline) and `queue` (the child queue's depth by
state, its oldest waiting child, the claims of each instance).

Each reads with `SELECT`s only (`agboss_sql.sql.inspect`) and never creates a database
or a table: a SQLite file that does not exist, or a database not at the head revision, is
refused with the command that makes it. `--json` prints one JSON document for machines;
otherwise tables: drawn with `rich` on a terminal when it is installed (the `lab` extra
has it; the library does not need it), as plain aligned text otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from agboss_sql.cli._common import (
    MISUSED,
    CommandFailed,
    add_url_argument,
    existing_database,
    require_head,
    shown,
)
from agboss_sql.cli._inspect import iso_ms, span_ms

STATUSES = ("queued", "running", "paused", "succeeded", "failed", "cancelled")
"""A tree's root record statuses (`queued`: waiting for its children)."""


def _json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document (for machines)"
    )


def _print_json(document: dict[str, Any]) -> None:
    print(json.dumps(document, indent=2, default=str, sort_keys=False))


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print `rows` under `columns`: a `rich` table on a terminal when rich is installed,
    else (a pipe, a file, no rich) plain text with each column padded to its widest cell,
    one row a line, which `grep` and `cut` read."""
    cells = [["" if cell is None else str(cell) for cell in row] for row in rows]
    drawn = _rich_table(title, columns, cells) if sys.stdout.isatty() else None
    if drawn is not None:
        return
    widths = [len(name) for name in columns]
    for row in cells:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]
    print(title)
    for row in [list(columns), *cells]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def _rich_table(title: str, columns: Sequence[str], cells: list[list[str]]) -> bool | None:
    """Draw the table with rich; `None` when rich is not installed."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        return None
    drawn = Table(title=title, title_justify="left")
    for name in columns:
        drawn.add_column(name, overflow="fold")
    for row in cells:
        drawn.add_row(*row)
    Console(highlight=False).print(drawn)
    return True


def _limit(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return number


def _database(args: argparse.Namespace) -> str:
    url = existing_database(args)
    require_head(url)
    return url


async def _with_connection(url: str, read: Any) -> Any:
    from agboss_sql.sql.connection import SqlConnection

    connection = SqlConnection(url)
    try:
        return await read(connection)
    finally:
        await connection.close()


# --- trees -----------------------------------------------------------------------------


def _trees_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument("--status", choices=STATUSES, help="only the trees of this status")
    parser.add_argument("--tenant", help="only the trees of this tenant")
    parser.add_argument(
        "--limit", type=_limit, default=50, help="the most recently changed trees to show"
    )
    _json_argument(parser)


def _trees(args: argparse.Namespace) -> int:
    import asyncio

    from agboss_sql.sql.inspect import list_trees

    url = _database(args)
    listed = asyncio.run(
        _with_connection(
            url,
            lambda connection: list_trees(
                connection, status=args.status, tenant=args.tenant, limit=args.limit
            ),
        )
    )
    if args.json:
        _print_json(listed.as_json())
        return 0
    print(f"database: {shown(url)} at {iso_ms(listed.now)}")
    if not listed.trees:
        print("no trees" + _filters(args))
        return 0
    rows = [
        (
            tree.tenant_id,
            tree.tree,
            tree.workflow,
            tree.status,
            tree.holder or "-",
            tree.epoch if tree.epoch is not None else "-",
            tree.lease or "-",
            span_ms(tree.age_ms),
            tree.children_pending,
            ", ".join(tree.pauses) or "-",
        )
        for tree in listed.trees
    ]
    columns = ("tenant", "tree", "workflow", "status", "holder", "epoch", "lease", "age")
    table(
        f"{len(rows)} trees{_filters(args)}, most recently changed first",
        (*columns, "children pending", "pauses pending"),
        rows,
    )
    if len(rows) == listed.limit:
        print(f"(the first {listed.limit}: --limit shows more)")
    return 0


def _filters(args: argparse.Namespace) -> str:
    said = [f"status {args.status}"] if args.status else []
    said += [f"tenant {args.tenant}"] if args.tenant else []
    return f" ({', '.join(said)})" if said else ""


# --- show ------------------------------------------------------------------------------


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    parser.add_argument("tree", metavar="TREE", help="the tree's id (its root execution id)")
    parser.add_argument("--tenant", default="default", help="its tenant (default: %(default)s)")
    _json_argument(parser)


def _show(args: argparse.Namespace) -> int:
    import asyncio

    from agboss_sql.sql.inspect import tree_view

    if not args.tree:
        raise CommandFailed("TREE must not be empty: `agboss-sql trees` lists them", MISUSED)
    url = _database(args)
    view = asyncio.run(
        _with_connection(url, lambda connection: tree_view(connection, args.tenant, args.tree))
    )
    if view is None:
        raise CommandFailed(
            f"no tree {args.tree!r} of tenant {args.tenant!r} in {shown(url)}: "
            f"`agboss-sql trees --url {shown(url)}` lists the trees (--tenant names another)"
        )
    if args.json:
        _print_json(view.as_json())
        return 0
    lease = view.leases.get(view.tree)
    print(f"tree {view.tenant_id}/{view.tree}: {view.workflow}, {view.status}")
    print(f"  input: {_brief(view.input)}")
    if view.outcome is not None:
        print(f"  outcome: {_brief(view.outcome)}")
    if lease is not None:
        print(f"  lease: {lease['holder']} at epoch {lease['epoch']}, {lease['state']}")
    print(
        f"  created {iso_ms(view.created_at)} ({span_ms(view.now - view.created_at)} ago), "
        f"changed {iso_ms(view.updated_at)}"
    )
    replayed = sum(1 for step in view.steps if step["replays"])
    children = Counter(child["status"] for child in view.children)
    pauses = Counter(pause["status"] for pause in view.pauses)
    undone = sum(1 for undo in view.compensations if undo.get("done"))
    print(
        f"  {len(view.steps)} steps and effects ({replayed} answered again by a later epoch), "
        f"{len(view.children)} children{_counts(children)}, {len(view.pauses)} pauses"
        f"{_counts(pauses)}, {len(view.calls)} outbound calls, {len(view.compensations)} "
        f"compensations ({undone} marked done), {len(view.lease_moves)} lease moves"
    )
    if view.truncated:
        print("  (children deeper than the view follows are not shown)")
    rows = [
        (
            iso_ms(moment.at),
            f"+{span_ms(moment.at - view.created_at)}",
            moment.execution,
            moment.what,
            moment.detail,
        )
        for moment in view.timeline
    ]
    table("timeline", ("time", "since start", "execution", "what", "detail"), rows)
    return 0


def _brief(value: Any, limit: int = 200) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _counts(counts: Counter[str]) -> str:
    return (
        f" ({', '.join(f'{n} {state}' for state, n in sorted(counts.items()))})" if counts else ""
    )


# --- queue -----------------------------------------------------------------------------


def _queue_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    _json_argument(parser)


def _queue(args: argparse.Namespace) -> int:
    import asyncio

    from agboss_sql.sql.inspect import queue_view

    url = _database(args)
    view = asyncio.run(_with_connection(url, queue_view))
    if args.json:
        _print_json(view.as_json())
        return 0
    print(f"database: {shown(url)} at {iso_ms(view.now)}")
    table("children by state", ("state", "children"), list(view.depth.items()))
    if view.oldest_queued is None:
        print("oldest waiting: none (no child is queued)")
    else:
        waited = span_ms(view.oldest_queued_ms or 0)
        print(f"oldest waiting: {view.oldest_queued}, queued {waited} ago")
    print(f"parents' wakes owed: {view.wakes_owed}")
    states = sorted({state for claims in view.claims.values() for state in claims})
    if view.claims:
        table(
            "claims per instance (the last claim of each child)",
            ("instance", *states),
            [
                (who, *(claims.get(state, 0) for state in states))
                for who, claims in view.claims.items()
            ],
        )
    else:
        print("claims per instance: none yet")
    if view.trees:
        table("trees by status", ("status", "trees"), list(view.trees.items()))
    sys.stdout.flush()
    return 0
