"""Launch workers never outlive the process that started them.

Two mechanisms, because neither covers every way a parent dies:

* :func:`worker_preexec` -- run in the worker between fork and exec: Linux
  ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` kills the worker when the thread that started it
  ends (only used when that thread is the main thread, which lives as long as the process).
* :class:`Janitor` -- one tiny helper process per parent (its own session, so a Ctrl-C or a
  process-group kill aimed at the parent's group does not reach it) reading a pipe whose
  only write end the parent holds.  The parent registers worker process groups and run
  folders on it; when the pipe reaches EOF (the parent exited, was SIGTERMed or SIGKILLed)
  the janitor kills every registered group and removes every registered folder.

This file runs as a plain script for the janitor (``python lifeline.py``): it imports
only the standard library, never torch or pypto.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1


def worker_preexec(parent_pid: int):
    """A ``preexec_fn`` that makes the child die with SIGKILL when its parent does."""
    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


def spawn_kwargs() -> dict:
    """Popen keyword arguments for a worker: own session (killable as a group) and, from
    the main thread, the parent-death signal."""
    kwargs = {"start_new_session": True}
    if threading.current_thread() is threading.main_thread():
        kwargs["preexec_fn"] = worker_preexec(os.getpid())
    return kwargs


class Janitor:
    """Parent-side handle of the janitor process (see the module docstring)."""

    def __init__(self):
        read_end, self._write = os.pipe()  # both non-inheritable: workers never hold them
        self.proc = subprocess.Popen([sys.executable, "-S", str(Path(__file__).resolve())],
                                     stdin=read_end, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True,
                                     close_fds=True)
        os.close(read_end)
        self._lock = threading.Lock()

    def _send(self, line: str) -> None:
        with self._lock:
            try:
                os.write(self._write, (line + "\n").encode())
            except OSError:
                pass  # the janitor is gone: nothing more it can do for us

    def watch_group(self, pgid: int) -> None:
        self._send(f"+pg {pgid}")

    def forget_group(self, pgid: int) -> None:
        self._send(f"-pg {pgid}")

    def watch_path(self, path: Path) -> None:
        self._send(f"+path {Path(path).resolve()}")

    def forget_path(self, path: Path) -> None:
        self._send(f"-path {Path(path).resolve()}")


_JANITOR: tuple[int, Janitor] | None = None
_JANITOR_LOCK = threading.Lock()


def janitor() -> Janitor:
    """This process's janitor (started on first use; a forked child gets its own)."""
    global _JANITOR
    with _JANITOR_LOCK:
        if _JANITOR is None or _JANITOR[0] != os.getpid() or _JANITOR[1].proc.poll() is not None:
            _JANITOR = (os.getpid(), Janitor())
        return _JANITOR[1]


# ---- janitor process ------------------------------------------------------------------

def _kill_group(pgid: int, wait_s: float = 10.0) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:  # until init has reaped it
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)


def janitor_main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    groups: set[int] = set()
    paths: set[str] = set()
    for raw in sys.stdin.buffer:
        kind, _, value = raw.decode(errors="replace").rstrip("\n").partition(" ")
        if kind == "+pg":
            groups.add(int(value))
        elif kind == "-pg":
            groups.discard(int(value))
        elif kind == "+path":
            paths.add(value)
        elif kind == "-path":
            paths.discard(value)
    for pgid in groups:  # EOF: the parent is gone
        _kill_group(pgid)
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    janitor_main()
