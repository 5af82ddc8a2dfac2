"""Backends: how one node becomes one fresh process holding its cards.

``task-submit`` (the A5 CI machines' device queue) when it is on ``PATH``: the daemon picks
and locks the cards and exports ``TASK_DEVICE``; this runner only bounds how many clients
wait at once. Otherwise the local backend leases virtual card ids from ``ci.pool.CardPool``
and passes them as ``--device`` itself.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

from ci.pool import CardPool

AXES = ("tp", "dp", "ep")


def axis_flags(node: dict) -> list[str]:
    """``--tp/--dp/--ep`` for the axes the node has (and that are not None)."""
    out: list[str] = []
    for axis in AXES:
        value = node.get("axes", {}).get(axis)
        if value is not None:
            out += [f"--{axis}", str(value)]
    return out


def node_argv(node: dict, python: str, devices: str) -> list[str]:
    """The queued command of a node; ``devices`` is a comma list of card ids."""
    if node.get("kind") == "cli":   # sweep: the entry's CLI over its matrix
        entry = node["entry"]
        cli = [python, entry] if entry.endswith(".py") else [python, "-m", "harness", "run", entry]
        return [*cli, *node.get("args", []), *axis_flags(node), "-d", devices]
    return [python, "-m", "pytest", node["nodeid"], "-p", "no:cacheprovider", "-q",
            *axis_flags(node), *node.get("args", []), "--device", devices]


class LocalBackend:
    name = "local"

    def __init__(self, python: str = sys.executable, cards: list[int] | None = None,
                 jobs: int | None = None):
        self.python = python
        self.pool = CardPool(cards if cards is not None else range(8))
        self.jobs = jobs or len(self.pool.ids)

    def argv(self, node: dict, ids: list[int] | None) -> list[str]:
        return node_argv(node, self.python, ",".join(map(str, ids or [])))

    def watchdog(self, timeout: float) -> float:
        return timeout


class TaskSubmitBackend:
    """``task-submit --device auto --device-num N --max-time T --timeout W --run '...'``.

    ``--max-time`` is the daemon's kill deadline for the node (its own default is 300 s);
    ``--timeout`` is how long the client waits in the queue plus the run. The runner kills
    the client process group ``grace`` seconds after ``--timeout`` in case it hangs.
    """

    name = "task-submit"
    pool = None

    def __init__(self, root: Path, python: str = "python", exe: str = "task-submit",
                 timeout: float = 900, wait: float = 3600, activate: str | None = None,
                 jobs: int = 8):
        self.root, self.python, self.exe = Path(root), python, exe
        self.timeout, self.wait, self.activate, self.jobs = timeout, wait, activate, jobs

    def run_string(self, node: dict) -> str:
        inner = node_argv(node, self.python, "DEVICES")[:-1]   # device list comes from the queue
        steps = [f"cd {shlex.quote(str(self.root))}"]
        if self.activate:
            steps.append(f"source {shlex.quote(self.activate)}")
        steps.append(f'{shlex.join(inner)} "$TASK_DEVICE"')
        return " && ".join(steps)

    def argv(self, node: dict, ids: list[int] | None = None) -> list[str]:
        return [self.exe, "--device", "auto", "--device-num", str(node["cards"]),
                "--max-time", str(int(self.timeout)), "--timeout", str(int(self.wait)),
                "--run", self.run_string(node)]

    def watchdog(self, timeout: float) -> float:
        return self.wait + 60


def choose(kind: str, *, root: Path, python: str, cards: list[int] | None, jobs: int | None,
           timeout: float, wait: float, activate: str | None):
    """``kind`` is ``auto`` (task-submit if on PATH), ``task-submit`` or ``local``."""
    exe = shutil.which("task-submit")
    if kind == "task-submit" or (kind == "auto" and exe):
        if not exe:
            raise SystemExit("ci.queue: --backend task-submit but no task-submit on PATH")
        return TaskSubmitBackend(root, python, exe, timeout, wait, activate, jobs or 8)
    return LocalBackend(python, cards, jobs)
