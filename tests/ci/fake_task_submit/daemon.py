"""Stand-in for the npu-taskqueue root daemon, written from its documented protocol.

``python daemon.py STATE``: polls ``STATE/pending`` and starts a task once its whole card
count is free in ``STATE/available_devices`` (lowest free ids, backfilling smaller tasks), in
its own session with ``TASK_DEVICE`` (comma list of physical ids), ``TASKQUEUE_INSIDE=1`` and
``TASKQUEUE_TASK_ID`` added to the submitter's environment snapshot, output in
``logs/<id>.log``. At ``max_time`` seconds (0 = no limit) it appends the real daemon's line
``[taskqueue] 任务超时 (Ns)，已自动终止`` to the log, SIGTERMs the task's group and SIGKILLs it
``FAKE_TQ_KILL_GRACE`` seconds later (default 1; the real daemon waits 3). ``kill/<id>``
requests the same termination. When the task ends, leftovers of its session or carrying its
marker are killed, the cards are released and ``done/<id>.json`` holds ``exit_code``
(128 + signal for a signalled task, as bash's ``wait`` reports it). SIGTERM stops the daemon
and its tasks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from layout import Layout  # noqa: E402

POLL = 0.05
KILL_GRACE = float(os.environ.get("FAKE_TQ_KILL_GRACE", "1"))


class Running:
    def __init__(self, task_id: str, spec: dict, devices: list[int], proc, log: Path):
        self.id, self.spec, self.devices, self.proc, self.log = task_id, spec, devices, proc, log
        self.t0 = time.monotonic()
        self.start = time.time()
        self.term_at: float | None = None
        self.timed_out = False


def _leftovers(sid: int, task_id: str) -> list[int]:
    marker = f"TASKQUEUE_TASK_ID={task_id}".encode() + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] in ("Z", "X"):
                continue
            if int(fields[3]) == sid or marker in Path(f"/proc/{name}/environ").read_bytes():
                found.append(int(name))
        except (OSError, IndexError, ValueError):
            pass
    return [p for p in found if p != os.getpid()]


def _signal(r: Running, sig) -> None:
    for pid in [r.proc.pid, *_leftovers(r.proc.pid, r.id)]:
        try:
            os.killpg(pid, sig) if pid == r.proc.pid else os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class Daemon:
    def __init__(self, state: Path):
        self.q = Layout(state).make()
        self.running: dict[str, Running] = {}
        self.stop = False

    def busy(self) -> set[int]:
        return {d for r in self.running.values() for d in r.devices}

    def schedule(self) -> None:
        pending = sorted(self.q.pending.glob("task_*.json"), key=lambda p: p.stat().st_mtime)
        for path in pending:
            try:
                spec = json.loads(path.read_text())
            except (OSError, ValueError):
                continue   # withdrawn meanwhile, or half written
            free = [d for d in self.q.pool() if d not in self.busy()]
            if spec["cards"] > len(free):
                continue   # backfill: a smaller task further back may still fit
            task_id = path.stem
            try:
                os.rename(path, self.q.task(self.q.running, task_id))   # claim (atomic)
            except FileNotFoundError:
                continue   # the client withdrew it first
            self.launch(task_id, spec, free[:spec["cards"]])

    def launch(self, task_id: str, spec: dict, devices: list[int]) -> None:
        ids = ",".join(map(str, devices))
        for d in devices:
            (self.q.locks / f"npu_device_{d}.lock").write_text(f"task={task_id}\n")
        env = {**spec["env"], "TASKQUEUE_INSIDE": "1", "TASKQUEUE_TASK_ID": task_id,
               "TASK_DEVICE": ids}
        log = self.q.logs / f"{task_id}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(["bash", "-c", spec["command"]], cwd=spec["cwd"], env=env,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.running[task_id] = Running(task_id, spec, devices, proc, log)
        self.q.event(ev="start", id=task_id, devices=devices)

    def police(self) -> None:
        now = time.monotonic()
        for r in self.running.values():
            limit = r.spec["max_time"]
            if r.term_at is None and limit > 0 and now - r.t0 >= limit:
                with open(r.log, "a") as f:
                    f.write(f"[taskqueue] 任务超时 ({limit}s)，已自动终止\n")
                r.timed_out, r.term_at = True, now
                _signal(r, signal.SIGTERM)
            elif r.term_at is None and (self.q.kill / r.id).exists():
                (self.q.kill / r.id).unlink()
                r.term_at = now
                _signal(r, signal.SIGTERM)
            elif r.term_at is not None and now - r.term_at >= KILL_GRACE:
                _signal(r, signal.SIGKILL)

    def reap(self, force: bool = False) -> None:
        for task_id, r in list(self.running.items()):
            rc = r.proc.poll()
            if rc is None and not force:
                continue
            if rc is None:
                _signal(r, signal.SIGKILL)
                rc = r.proc.wait()
            for pid in _leftovers(r.proc.pid, task_id):   # the task's stray descendants
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            rc = 128 - rc if rc < 0 else rc
            done = {"exit_code": rc, "devices": r.devices, "start": r.start,
                    "finish": time.time(), "timed_out": r.timed_out}
            tmp = self.q.done / f".{task_id}.tmp"
            tmp.write_text(json.dumps(done))
            os.rename(tmp, self.q.task(self.q.done, task_id))   # clients never read half a file
            self.q.task(self.q.running, task_id).unlink(missing_ok=True)
            for d in r.devices:
                (self.q.locks / f"npu_device_{d}.lock").unlink(missing_ok=True)
            del self.running[task_id]
            self.q.event(ev="end", id=task_id, devices=r.devices, rc=rc, timed_out=r.timed_out)

    def serve(self) -> None:
        def stop(*_):
            self.stop = True
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        (self.q.root / "daemon.pid").write_text(str(os.getpid()))
        while not self.stop:
            self.reap()
            self.police()
            self.schedule()
            time.sleep(POLL)
        for r in self.running.values():
            _signal(r, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE
        while any(r.proc.poll() is None for r in self.running.values()) \
                and time.monotonic() < deadline:
            time.sleep(POLL)
        self.reap(force=True)
        (self.q.root / "daemon.pid").unlink(missing_ok=True)


if __name__ == "__main__":
    Daemon(Path(sys.argv[1])).serve()
