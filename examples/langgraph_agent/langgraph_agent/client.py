"""Start, approve, reject, cancel and read agent threads from any machine (a client engine
runs nothing).

python -m langgraph_agent.client --url URL start t-1 --items book,pen
python -m langgraph_agent.client --url URL status t-1
python -m langgraph_agent.client --url URL approve t-1      # or: reject t-1
python -m langgraph_agent.client --url URL result t-1
python -m langgraph_agent.client --url URL messages t-1
python -m langgraph_agent.client --url URL cancel t-1
"""

from __future__ import annotations

import argparse
import asyncio
import json

from agboss_sql.runtime import Engine
from agboss_sql.runtime.graphs import thread_state
from langgraph_agent.app import app


async def main(args: argparse.Namespace) -> None:
    async with Engine(app, url=args.url, work=False) as engine:
        if args.command == "start":
            items = [item for item in args.items.split(",") if item]
            request = {"messages": [{"role": "user", "content": "buy " + ", ".join(items)}]}
            await engine.start("agent", {**request, "items": items}, id=args.id)
            print(f"started {args.id}")
        elif args.command in ("approve", "reject"):
            await engine.resume(args.id, {"approved": args.command == "approve"})
            print(f"{args.command}d {args.id}")
        elif args.command == "cancel":
            cancelled = await engine.cancel(args.id)
            print(f"cancelled {args.id}" if cancelled else f"{args.id} had already closed")
        elif args.command == "status":
            status = await engine.status(args.id)
            pause = status.pending_pause
            print(
                f"{args.id}: {status.state.value}"
                + (f", waiting on approval of {json.dumps(pause.request)}" if pause else "")
            )
        elif args.command == "messages":
            state = await thread_state(engine, args.id)
            for message in state.values.get("messages", []):
                print(f"{message.type}: {message.content}")
        else:
            print(json.dumps(await engine.result(args.id, timeout_s=args.timeout)))


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m langgraph_agent.client")
    parser.add_argument("--url", required=True)
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start")
    start.add_argument("id")
    start.add_argument("--items", default="book,pen")
    for name in ("approve", "reject", "cancel", "status", "messages"):
        commands.add_parser(name).add_argument("id")
    result = commands.add_parser("result")
    result.add_argument("id")
    result.add_argument("--timeout", type=float, default=60.0)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
