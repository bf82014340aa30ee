"""The README's runnable saver example runs as written (on a SQLite file of its own)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_saver_example_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    example = next(block for block in blocks if "asyncio.run(main())" in block)
    script = tmp_path / "example.py"
    script.write_text(example)
    root = str(README.parent)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['hello', 'reply 1', 'again', 'reply 3']"
