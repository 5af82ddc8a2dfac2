"""Where the stand-in task queue keeps its state (one temp folder per test).

``available_devices`` (the pool), ``pending/ running/ done/ withdrawn/`` (one JSON file per
task; claiming and withdrawing are atomic renames, so a task is taken by exactly one side),
``kill/`` (kill requests), ``logs/`` (task output), ``locks/npu_device_<id>.lock`` (one per held
card) and ``events.jsonl`` (submit/start/end/withdrawn records the tests read).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

DIRS = ("pending", "running", "done", "withdrawn", "kill", "logs", "locks")


class Layout:
    def __init__(self, root):
        self.root = Path(root)
        for name in DIRS:
            setattr(self, name, self.root / name)

    def make(self, pool: str | None = None) -> "Layout":
        for name in DIRS:
            getattr(self, name).mkdir(parents=True, exist_ok=True)
        if pool is not None:
            (self.root / "available_devices").write_text(pool + "\n")
        return self

    def pool(self) -> list[int]:
        text = (self.root / "available_devices").read_text().strip()
        return [int(x) for x in text.split(",") if x]

    def task(self, folder: Path, task_id: str) -> Path:
        return folder / f"{task_id}.json"

    def event(self, **fields) -> None:
        line = json.dumps({"t": time.time(), **fields}) + "\n"
        fd = os.open(self.root / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())   # one write per line: safe from several processes
        finally:
            os.close(fd)

    def events(self) -> list[dict]:
        path = self.root / "events.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def ids(self, folder: Path) -> list[str]:
        return sorted(p.stem for p in folder.glob("task_*.json"))
