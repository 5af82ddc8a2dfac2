"""Local scheduler: a pool of virtual cards, one fresh process group per node.

A node starts only when its whole card count can be leased from the pool, so two running
nodes never hold the same card; the lease is returned only after every process of the node
is gone. Each node runs with ``start_new_session=True`` and a unique ``CI_QUEUE_TOKEN`` in its
environment: at the timeout (or when the node exits leaving processes behind) the runner
signals its process group *and* every process carrying the token, so a grandchild that called
``setsid`` cannot keep the cards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
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
    seconds: float
    timed_out: bool = False
    note: str = ""


@dataclass
class _Running:
    job: Job
    proc: subprocess.Popen
    devices: list[int] | None
    token: str
    t0: float
    log: object = field(repr=False)


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
    pgid = proc.pid   # start_new_session: the leader's pid is the group id
    left = members(pgid, token)
    if proc.poll() is None:
        left.add(proc.pid)
    count = len(left)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        if not left:
            break
        for target in [None, *left]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig) if target is None else os.kill(target, sig)
        deadline = time.monotonic() + wait
        while left and time.monotonic() < deadline:
            proc.poll()
            time.sleep(0.02)
            left = {p for p in members(pgid, token) | {proc.pid} if alive(p)}
    proc.wait()
    return count


def run_all(jobs: list[Job], *, pool: CardPool | None, max_parallel: int, cwd: Path,
            env: dict | None = None, grace: float = 5.0, poll: float = 0.05,
            on_done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run every job; largest card counts are offered first, smaller ones backfill."""
    pending = sorted(jobs, key=lambda j: -j.cards)
    outcomes: list[Outcome] = []

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
                    running.append(_start(job, ids, cwd, env))
                except OSError as e:   # e.g. the interpreter or task-submit vanished
                    pool is not None and pool.release(ids)
                    finish(Outcome(job, ids, None, 0.0, note=f"could not start: {e}"))
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
                               time.monotonic() - r.t0, timed_out, note))
            time.sleep(poll)
    finally:
        for r in running:
            terminate(r.proc, r.token, 0.0)
            r.log.close()
    return outcomes


def _start(job: Job, ids, cwd: Path, env: dict | None) -> _Running:
    token = uuid.uuid4().hex
    job.log.parent.mkdir(parents=True, exist_ok=True)
    log = open(job.log, "wb")
    env = {**(env if env is not None else os.environ), TOKEN_VAR: token}
    proc = subprocess.Popen(job.argv(ids), cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    return _Running(job, proc, ids, token, time.monotonic(), log)
