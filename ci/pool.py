"""Local scheduler: a pool of virtual cards, one fresh process group per node.

A node starts only when its whole card count can be leased from the pool, so two running
nodes never hold the same card; the lease is returned only after every process of the node
is gone. Each node runs with ``start_new_session=True`` and a unique ``CI_QUEUE_TOKEN`` in its
environment: at the timeout (or when the node exits leaving processes behind) the runner
signals its process group *and* every process carrying the token, so a grandchild that called
``setsid`` cannot keep the cards. When the runner is cancelled (SIGINT/SIGTERM raised as
``KeyboardInterrupt``/``SystemExit`` inside ``run_all``) every running node gets SIGTERM and
``grace`` seconds to exit on its own -- a ``task-submit`` client needs that to withdraw its
queued task -- before SIGKILL; each node is then reported as a cancelled ``Outcome``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

TOKEN_VAR = "CI_QUEUE_TOKEN"


class CardPool:
    """Leases sets of card ids; prefers the lowest contiguous run of free ids."""

    def __init__(self, ids):
        self.ids = sorted(set(int(i) for i in ids))
        self.free = set(self.ids)

    def allocate(self, n: int) -> list[int] | None:
        if n < 1 or n > len(self.free):
            return None
        runs = (self.ids[k:k + n] for k in range(len(self.ids) - n + 1))
        lease = next((w for w in runs if self.free.issuperset(w)), sorted(self.free)[:n])
        self.free.difference_update(lease)
        return list(lease)

    def release(self, ids) -> None:
        ids = set(ids)
        if ids & self.free or not ids <= set(self.ids):
            raise RuntimeError(f"release of cards not leased: {sorted(ids)}")
        self.free |= ids


@dataclass
class Job:
    key: str
    cards: int
    argv: Callable[[list[int] | None], list[str]]   # card ids (None: backend allocates)
    log: Path
    timeout: float


@dataclass
class Outcome:
    job: Job
    devices: list[int] | None
    rc: int | None
    seconds: float                # run time (process start to end)
    timed_out: bool = False
    note: str = ""
    queued: float = 0.0           # waiting for a lease / a free slot before the start
    began: float = 0.0            # wall clock (time.time) of the process start; 0 = never
    ended: float = 0.0            # wall clock of the end
    cancelled: bool = False       # the runner was cancelled before this node finished


@dataclass
class _Running:
    job: Job
    proc: subprocess.Popen
    devices: list[int] | None
    token: str
    t0: float
    log: object = field(repr=False)
    wall0: float = 0.0
    queued: float = 0.0


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()   # [state, ppid, pgrp, ...]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def members(pgid: int, token: str) -> set[int]:
    """Live processes in process group ``pgid`` or carrying ``token`` in their environment."""
    needle = f"{TOKEN_VAR}={token}".encode() + b"\0"
    found = set()
    for pid in (int(n) for n in os.listdir("/proc") if n.isdigit()):
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        try:
            if int(st[2]) == pgid or needle in Path(f"/proc/{pid}/environ").read_bytes():
                found.add(pid)
        except OSError:
            pass
    found.discard(os.getpid())
    return found


def terminate(proc: subprocess.Popen, token: str, grace: float) -> int:
    """SIGTERM the node's group and tagged processes, SIGKILL after ``grace`` s, reap;
    returns how many processes were alive when the sweep began."""
    return terminate_all([(proc, token)], grace)[0]


def terminate_all(nodes: list[tuple[subprocess.Popen, str]], grace: float) -> list[int]:
    """``terminate`` for several nodes at once: all get SIGTERM together and share one
    ``grace`` period before SIGKILL (a cancelled run does not wait ``grace`` per node)."""
    def live(proc, token) -> set[int]:
        return {p for p in members(proc.pid, token) | {proc.pid} if alive(p)}

    left = []
    for proc, token in nodes:   # start_new_session: the leader's pid is the group id
        found = members(proc.pid, token)
        if proc.poll() is None:
            found.add(proc.pid)
        left.append(found)
    counts = [len(found) for found in left]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        if not any(left):
            break
        for (proc, _), found in zip(nodes, left):
            for target in ([None, *found] if found else []):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig) if target is None else os.kill(target, sig)
        deadline = time.monotonic() + wait
        while any(left) and time.monotonic() < deadline:
            time.sleep(0.05)
            for i, (proc, token) in enumerate(nodes):
                proc.poll()
                left[i] = live(proc, token) if left[i] else set()
    for proc, _ in nodes:
        proc.wait()
    return counts


@contextlib.contextmanager
def signals_held():
    """Hold off SIGINT/SIGTERM (main thread only) so a second cancel cannot cut the cleanup."""
    saved = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            saved[sig] = signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def run_all(jobs: list[Job], *, pool: CardPool | None, max_parallel: int, cwd: Path,
            env: dict | None = None, grace: float = 5.0, poll: float = 0.05,
            on_done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run every job; largest card counts are offered first, smaller ones backfill.

    On cancellation (an exception, e.g. the ``SystemExit`` of a SIGTERM handler) the running
    nodes are terminated with ``grace`` and, like the nodes not started yet, reported through
    ``on_done`` as ``cancelled`` outcomes; then the exception propagates.
    """
    pending = sorted(jobs, key=lambda j: -j.cards)
    outcomes: list[Outcome] = []
    t_start = time.monotonic()

    def finish(o: Outcome) -> None:
        outcomes.append(o)
        on_done and on_done(o)

    for j in [j for j in pending if pool is not None and j.cards > len(pool.ids)]:
        pending.remove(j)   # would wait forever: fail it up front instead of deadlocking
        finish(Outcome(j, None, None, 0.0, note=f"needs {j.cards} cards, pool has {len(pool.ids)}"))
    running: list[_Running] = []
    try:
        while pending or running:
            i = 0
            while i < len(pending) and len(running) < max_parallel:
                job = pending[i]
                ids = pool.allocate(job.cards) if pool is not None else None
                if pool is not None and ids is None:
                    i += 1
                    continue
                pending.pop(i)
                try:
                    running.append(_start(job, ids, cwd, env, time.monotonic() - t_start))
                except OSError as e:   # e.g. the interpreter or task-submit vanished
                    pool is not None and pool.release(ids)
                    finish(Outcome(job, ids, None, 0.0, note=f"could not start: {e}",
                                   queued=time.monotonic() - t_start))
            now = time.monotonic()
            for r in list(running):
                rc = r.proc.poll()
                timed_out = rc is None and now - r.t0 >= r.job.timeout
                if rc is None and not timed_out:
                    continue
                stray = terminate(r.proc, r.token, grace if timed_out else 1.0)
                r.log.close()
                running.remove(r)
                if pool is not None:
                    pool.release(r.devices)
                note = (f"killed after {r.job.timeout:g}s timeout" if timed_out
                        else f"killed {stray} leftover process(es)" if stray else "")
                finish(Outcome(r.job, r.devices, None if timed_out else rc,
                               time.monotonic() - r.t0, timed_out, note, r.queued, r.wall0,
                               time.time()))
            time.sleep(poll)
    except BaseException:
        with signals_held():
            _cancel(running, pending, pool, grace, time.monotonic() - t_start, finish)
        raise
    return outcomes


def _cancel(running: list[_Running], pending: list[Job], pool, grace: float, waited: float,
            finish: Callable[[Outcome], None]) -> None:
    """Terminate the running nodes together (``grace`` before SIGKILL) and report every
    unfinished node as cancelled."""
    terminate_all([(r.proc, r.token) for r in running], grace)
    for r in running:
        r.log.close()
        if pool is not None:
            pool.release(r.devices)
        finish(Outcome(r.job, r.devices, r.proc.returncode, time.monotonic() - r.t0,
                       queued=r.queued, began=r.wall0, ended=time.time(), cancelled=True))
    for job in pending:
        finish(Outcome(job, None, None, 0.0, queued=waited, cancelled=True))


def _start(job: Job, ids, cwd: Path, env: dict | None, queued: float = 0.0) -> _Running:
    token = uuid.uuid4().hex
    job.log.parent.mkdir(parents=True, exist_ok=True)
    log = open(job.log, "wb")
    env = {**(env if env is not None else os.environ), TOKEN_VAR: token}
    wall0 = time.time()
    proc = subprocess.Popen(job.argv(ids), cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    return _Running(job, proc, ids, token, time.monotonic(), log, wall0, queued)
