"""Backends: how one node becomes one fresh process holding its cards.

``task-submit`` (the A5 CI machines' device queue) when it is on ``PATH``: the daemon picks
and locks the cards and exports ``TASK_DEVICE``; this runner only bounds how many clients
wait at once and reads back, from the client's output, which cards the node got, when it
started, and whether the daemon or the client's wait cut it short. Otherwise the local
backend leases card ids from ``ci.pool.CardPool`` and passes them as ``--device`` itself.
Inside a task-submit job (``TASKQUEUE_INSIDE`` set) the queue refuses nested submission, so
``auto`` runs the nodes locally on the cards the job holds (``TASK_DEVICE``).
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

from ci.pool import CardPool, Outcome

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

    def interpret(self, o: Outcome, text: str) -> dict:
        """What the pool saw: leased cards, wait for a lease, run time, its own timeout."""
        return {"devices": o.devices, "queued": o.queued, "seconds": o.seconds,
                "timed_out": o.timed_out, "reason": "", "extra": "",
                "cancel": "killed while running" if o.began else "not started"}


START = "ci.queue: start"   # first line of every task-submit node: wall time and TASK_DEVICE
_START = re.compile(rf"^{re.escape(START)} (?P<t>\d+(?:\.\d+)?) cards (?P<ids>[\d,]+)\s*$",
                    re.M)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# What the real client and daemon print (Chinese, as they do on the A5 machines):
_MAX_TIME = re.compile(r"\[taskqueue\] 任务超时 \((\d+)s\)")   # daemon killed it at --max-time
_WAIT = re.compile(r"等待超时 \((\d+)s\)")                        # client's --timeout ran out
_WITHDRAWN = re.compile(r"已取消(?:排队中|仍在排队)的任务")          # client withdrew its task
_REFUSED = re.compile(r"^错误: ?(.+)$", re.M)                        # client refusal (exit 1)
_NESTED = "禁止在 task-daemon 内部嵌套提交"


def read_client_output(text: str) -> dict:
    """Facts in a ``task-submit --run`` client's output (stdout and stderr, task log included).

    ``start``/``devices``: from this runner's own first line (``START``, the wall time and
    ``$TASK_DEVICE``); ``max_time``: the daemon's kill line; ``wait``: the client's wait ran out;
    ``withdrawn``: the client took its task back out of the queue; ``refused``: the client's
    first ``错误:`` line.
    """
    text = _ANSI.sub("", text)
    start, max_time, wait = _START.search(text), _MAX_TIME.search(text), _WAIT.search(text)
    refused = _REFUSED.search(text)
    return {"start": float(start["t"]) if start else None,
            "devices": [int(x) for x in start["ids"].split(",") if x] if start else None,
            "max_time": int(max_time[1]) if max_time else None,
            "wait": int(wait[1]) if wait else None,
            "withdrawn": bool(_WITHDRAWN.search(text)),
            "refused": refused[1].strip() if refused else None,
            "nested": _NESTED in text}


class TaskSubmitBackend:
    """``task-submit --device auto --device-num N --max-time T --timeout W --run '...'``.

    ``--max-time`` is the daemon's kill deadline for the node (its own default is 300 s);
    ``--timeout`` is how long the client waits in the queue plus the run. Both take whole
    seconds and read 0 as "no limit", so fractions round up. The runner kills the client
    process group 60 s after ``--timeout`` in case it hangs.
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
        no_cards = "task-submit exported no TASK_DEVICE"
        steps = [f'echo "{START} $(date +%s.%N) cards ${{TASK_DEVICE:?{no_cards}}}"',
                 f"cd {shlex.quote(str(self.root))}"]
        if self.activate:
            steps.append(f"source {shlex.quote(self.activate)}")
        steps.append(f'{shlex.join(inner)} "$TASK_DEVICE"')
        return " && ".join(steps)

    def argv(self, node: dict, ids: list[int] | None = None) -> list[str]:
        return [self.exe, "--device", "auto", "--device-num", str(node["cards"]),
                "--max-time", str(math.ceil(self.timeout)), "--timeout", str(math.ceil(self.wait)),
                "--run", self.run_string(node)]

    def watchdog(self, timeout: float) -> float:
        return self.wait + 60

    def interpret(self, o: Outcome, text: str) -> dict:
        """Cards, queue wait and run time as the queue reported them; why it stopped.

        ``reason`` replaces the generic verdict note when pytest never ran (the client's own
        refusal); ``extra`` is appended (what cut the node short); ``cancel`` describes a node
        of a cancelled run (withdrawn from the queue, or killed while running).
        """
        c = read_client_output(text)
        ran = c["start"] is not None
        if ran:   # wall clocks: the client's start and end vs the node's own first line
            queued, seconds = max(0.0, c["start"] - o.began), max(0.0, o.ended - c["start"])
        else:
            queued, seconds = o.seconds, 0.0
        extra = []
        if c["max_time"] is not None:
            extra.append(f"task-submit daemon killed it at --max-time {c['max_time']}s")
        if c["wait"] is not None:
            extra.append(f"task-submit client stopped waiting at --submit-wait {c['wait']}s"
                         + ("; withdrawn from the queue before it ran" if c["withdrawn"]
                            else "; it had started" if ran else ""))
        reason = ""
        if c["refused"] and not ran and c["wait"] is None:
            why = (" (nested submission: TASKQUEUE_INSIDE is set)" if c["nested"] else "")
            reason = f"task-submit refused{why}: {c['refused']}"
        cancel = ("withdrawn from the task-submit queue before it ran" if c["withdrawn"]
                  else "killed while running" if ran else "not started")
        return {"devices": c["devices"], "queued": queued, "seconds": seconds,
                "timed_out": o.timed_out or c["max_time"] is not None or c["wait"] is not None,
                "reason": reason, "extra": "; ".join(extra), "cancel": cancel}


def job_cards() -> list[int] | None:
    """Card ids a task-submit job holds (``TASK_DEVICE``), or None when not inside a job."""
    if not os.environ.get("TASKQUEUE_INSIDE"):
        return None
    held = os.environ.get("TASK_DEVICE", "").replace(" ", "")
    if not re.fullmatch(r"\d+(,\d+)*", held):
        raise SystemExit("ci.queue: inside a task-submit job (TASKQUEUE_INSIDE is set) that "
                         f"holds no card (TASK_DEVICE={held!r}): submit the runner with "
                         "--device auto --device-num N, or force --backend local")
    return [int(x) for x in held.split(",")]


def choose(kind: str, *, root: Path, python: str, cards: list[int] | None, jobs: int | None,
           timeout: float, wait: float, activate: str | None):
    """``kind`` is ``auto`` (task-submit if on PATH), ``task-submit`` or ``local``.

    Inside a task-submit job the queue refuses nested submission: ``task-submit`` is refused
    here, and ``auto`` runs locally on the job's cards (``cards`` must be among them).
    """
    if kind != "local" and os.environ.get("TASKQUEUE_INSIDE"):
        if kind == "task-submit":
            raise SystemExit("ci.queue: --backend task-submit inside a task-submit job "
                             "(TASKQUEUE_INSIDE is set): the queue refuses nested submission; "
                             "use --backend auto to run the nodes on this job's cards")
        held = job_cards()
        if cards is not None and not set(cards) <= set(held):
            raise SystemExit(f"ci.queue: --cards/--devices {cards} are not all among the cards "
                             f"this task-submit job holds (TASK_DEVICE={held})")
        return LocalBackend(python, cards if cards is not None else held, jobs)
    exe = shutil.which("task-submit")
    if kind == "task-submit" or (kind == "auto" and exe):
        if not exe:
            raise SystemExit("ci.queue: --backend task-submit but no task-submit on PATH")
        return TaskSubmitBackend(root, python, exe, timeout, wait, activate, jobs or 8)
    return LocalBackend(python, cards, jobs)
