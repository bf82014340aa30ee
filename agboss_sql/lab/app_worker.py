"""A worker process of the cluster running a workflow app:

    python -m agboss_sql.lab.app_worker CONFIG.json

`CONFIG.json` (written by the cluster) names the app (`"app": "module:attr"`), the
database (`"url"`), the instance id and the engine's settings. The process is what
`agboss-sql worker --app ... --commands` runs: an `Engine` taking JSON-line commands on
standard input and writing its events as JSON lines on standard output.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from agboss_sql.runtime.serve import load_workflows, serve


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    config: dict[str, Any] = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    workflows = load_workflows(str(config["app"]))
    return asyncio.run(
        serve(
            workflows,
            url=config.get("url"),
            instance_id=config.get("instance_id"),
            lease_ms=int(config.get("lease_ms", 30_000)),
            max_concurrent_steps=int(config.get("max_concurrent_steps", 8)),
            shutdown_ms=int(config.get("shutdown_ms", 10_000)),
            commands=True,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
