"""Start, approve, cancel and read orders from any machine: a client engine runs nothing.

python -m order_saga.client --url URL start o-1 --cents 4200 --items book,pen --approval
python -m order_saga.client --url URL approve o-1
python -m order_saga.client --url URL cancel o-2
python -m order_saga.client --url URL status o-1
python -m order_saga.client --url URL result o-1
"""

from __future__ import annotations

import argparse
import asyncio
import json

from agboss_sql.runtime import Engine
from order_saga.app import app


async def main(args: argparse.Namespace) -> None:
    async with Engine(app, url=args.url, work=False) as engine:
        if args.command == "start":
            order = {
                "id": args.id,
                "cents": args.cents,
                "items": [item for item in args.items.split(",") if item],
                "needs_approval": args.approval,
            }
            await engine.start("order", order, id=args.id)
            print(f"started {args.id}")
        elif args.command == "approve":
            await engine.resume(args.id, {"approved": True})
            print(f"approved {args.id}")
        elif args.command == "cancel":
            cancelled = await engine.cancel(args.id)
            print(f"cancelled {args.id}" if cancelled else f"{args.id} had already closed")
        elif args.command == "status":
            status = await engine.status(args.id)
            pause = status.pending_pause
            print(
                f"{args.id}: {status.state.value}" + (f", waiting on {pause.name}" if pause else "")
            )
        else:
            print(json.dumps(await engine.result(args.id, timeout_s=args.timeout)))


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m order_saga.client")
    parser.add_argument("--url", required=True)
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start")
    start.add_argument("id")
    start.add_argument("--cents", type=int, default=4200)
    start.add_argument("--items", default="book,pen")
    start.add_argument("--approval", action="store_true")
    for name in ("approve", "cancel", "status"):
        commands.add_parser(name).add_argument("id")
    result = commands.add_parser("result")
    result.add_argument("id")
    result.add_argument("--timeout", type=float, default=60.0)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
