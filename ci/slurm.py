"""Slurm backend: each node becomes one batch job asking for its cards as a GRES.

The runner starts one client per node, ``python -m ci.slurm submit ... -- NODE COMMAND``,
which

1. submits a batch job with ``sbatch --gres=NAME:CARDS --time=MINUTES --job-name=NODEID
   --nodes=1 --ntasks=1 --chdir=ROOT --output=SPOOL/%j.log --no-requeue [--partition P]
   [--account A]``; the job's output is streamed into the client's stdout (the node log), so
   the runner's root and ``--out`` folder must be on storage the compute nodes share;
2. inside the job, ``python -m ci.slurm launch`` reads the card ids Slurm allocated from the
   job's detailed record (``scontrol show job -d``: ``GRES=npu:2(IDX:4-5)``, the indices of
   the ``gres.conf`` device files; Slurm exports no index variable for a GRES without a
   plugin), prints them on a ``START`` line and execs the node command with ``--device IDS``;
   a job whose record names no such allocation fails instead of inventing ids;
3. polls ``scontrol show job`` until the job ends, then prints an ``END`` line with Slurm's
   state, exit code and reason, and exits non-zero unless the job COMPLETED.

Slurm keeps time limits in whole minutes and checks them about every 30 s, so ``--time`` is
the node timeout rounded up to minutes and Slurm (not the runner) cancels a hung node, with
state TIMEOUT and reason TimeLimit; the runner's own watchdog is only a fallback. A job still
pending after ``--submit-wait`` seconds is cancelled and reported with its pending reason; a
client that gets SIGTERM (a cancelled run) cancels its job first.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ci.pool import TOKEN_VAR, Outcome
from ci.submit import node_argv

CLIENTS = ("sbatch", "scontrol", "scancel")
START = "ci.slurm: start"   # in-job launcher: wall time, job id, node, allocated card ids
END = "ci.slurm: end"       # client: Slurm's final state, exit code and reason
_START = re.compile(rf"^{re.escape(START)} (?P<t>\d+(?:\.\d+)?) job (?P<job>\d+) "
                    r"node (?P<host>\S+) cards (?P<ids>\d+(?:,\d+)*)\s*$", re.M)
_END = re.compile(rf"^{re.escape(END)} job=(?P<job>\S+) state=(?P<state>\S+) "
                  r"exit=(?P<exit>\S+) reason=(?P<reason>.*)$", re.M)
_STEPD = re.compile(r"\*\*\* ((?:JOB|STEP) \S+ ON \S+ \S+ AT .*?) \*\*\*")   # slurmstepd's notice
GRES_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
SLURM_WORD = re.compile(r"[A-Za-z0-9_.,-]+")   # a partition (or list) or account name
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING",
          "SIGNALING", "STAGE_OUT", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
          "RESV_DEL_HOLD", "STOPPED"}
TIMED_OUT = {"TIMEOUT", "DEADLINE"}


def missing_clients() -> list[str]:
    """Slurm client commands this backend needs that are not on PATH."""
    return [c for c in CLIENTS if shutil.which(c) is None]


def check_flags(parser: argparse.ArgumentParser, args) -> None:
    """Refuse Slurm flags without ``--backend slurm``, malformed names, pool flags with Slurm,
    and a missing Slurm client (``parser.error``, exit 2); default ``--gres-name`` to npu."""
    given = [f for f, v in (("--partition", args.partition), ("--account", args.account),
                            ("--gres-name", args.gres_name)) if v is not None]
    if args.backend != "slurm":
        if given:
            parser.error(f"{', '.join(given)} apply only to --backend slurm")
        return
    args.gres_name = "npu" if args.gres_name is None else args.gres_name
    if not GRES_NAME.fullmatch(args.gres_name):
        parser.error(f"--gres-name: expected a GRES name matching {GRES_NAME.pattern} "
                     f"(e.g. npu), got {args.gres_name!r}")
    for flag, value in (("--partition", args.partition), ("--account", args.account)):
        if value is not None and not SLURM_WORD.fullmatch(value):
            parser.error(f"{flag}: expected letters, digits, '_.,-' only, got {value!r}")
    if args.cards is not None or args.devices is not None:
        parser.error("--cards/--devices size the local pool; with --backend slurm Slurm "
                     "allocates the cards (--gres-name, --partition)")
    if not args.list and missing_clients():
        parser.error(f"--backend slurm: {', '.join(missing_clients())} not on PATH")


def time_limit_minutes(seconds: float) -> int:
    """Slurm ``--time`` for a node timeout: whole minutes, rounded up, at least 1."""
    return max(1, math.ceil(seconds / 60))


def expand_ids(text: str) -> list[int]:
    """``"0-1,4,6-7"`` -> ``[0, 1, 4, 6, 7]`` (Slurm's index list syntax)."""
    ids: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        ids += range(int(lo), int(hi or lo) + 1)
    return ids


def allocated_ids(job_record: str, gres: str) -> list[int] | None:
    """Card indices of GRES ``gres`` in a ``scontrol show job -d`` record, or None.

    The detail line reads ``Nodes=n1 CPU_IDs=0 Mem=0 GRES=npu:2(IDX:0-1)`` (a typed GRES
    ``npu:910b:2(IDX:...)``; several GRES are comma separated).
    """
    pat = re.compile(rf"(?:^|[=,]){re.escape(gres)}(?::[^:(,\s]+)*\(IDX:([0-9,-]+)\)")
    found = [expand_ids(m[1]) for line in job_record.splitlines()
             if line.strip().startswith("Nodes=") for m in pat.finditer(line)]
    return sorted(i for ids in found for i in ids) if found else None


def job_field(record: str, key: str) -> str | None:
    """Value of ``key=`` in a ``scontrol show job`` record (values without spaces)."""
    m = re.search(rf"(?:^|\s){re.escape(key)}=(\S*)", record)
    return m[1] if m else None


def read_node_output(text: str) -> dict:
    """The launcher's START line (wall time, card ids) and the client's last END line."""
    start = _START.search(text)
    ends = list(_END.finditer(text))
    end = ends[-1] if ends else None
    return {"start": float(start["t"]) if start else None,
            "devices": [int(x) for x in start["ids"].split(",")] if start else None,
            "job": end["job"] if end else (start["job"] if start else None),
            "state": end["state"] if end else None,
            "exit": end["exit"] if end else None,
            "reason": end["reason"].strip() if end else None,
            "notice": notices[-1] if (notices := _STEPD.findall(text)) else None}


class SlurmBackend:
    """One client process per node; Slurm queues the jobs and picks the cards."""

    name = "slurm"
    pool = None

    def __init__(self, root: Path, *, spool: Path, python: str = sys.executable,
                 gres: str = "npu", partition: str | None = None, account: str | None = None,
                 timeout: float = 900, wait: float = 3600, activate: str | None = None,
                 jobs: int | None = None):
        if not GRES_NAME.fullmatch(gres):
            raise ValueError(f"--gres-name must match {GRES_NAME.pattern}, got {gres!r}")
        self.root, self.spool, self.python = Path(root), Path(spool), python
        self.gres, self.partition, self.account = gres, partition, account
        self.minutes, self.wait, self.activate = time_limit_minutes(timeout), wait, activate
        self.jobs = jobs or 8
        atexit.register(self.cancel_leftovers)

    def argv(self, node: dict, ids: list[int] | None = None) -> list[str]:
        inner = node_argv(node, self.python, "IDS")[:-1]   # ids come from Slurm, in the job
        argv = [self.python, "-m", "ci.slurm", "submit", "--job-name", node["nodeid"],
                "--gres", self.gres, "--cards", str(node["cards"]),
                "--minutes", str(self.minutes), "--wait", f"{self.wait:g}",
                "--chdir", str(self.root), "--spool", str(self.spool), "--python", self.python]
        for flag, value in (("--partition", self.partition), ("--account", self.account),
                            ("--activate", self.activate)):
            if value:
                argv += [flag, value]
        return [*argv, "--", *inner]

    def watchdog(self, timeout: float) -> float:
        """Fallback only: queue wait + Slurm's limit + its ~30 s check period and kill wait."""
        return self.wait + self.minutes * 60 + 180

    def interpret(self, o: Outcome, text: str) -> dict:
        """Allocated cards, queue wait and run time from the node log; Slurm's verdict."""
        s = read_node_output(text)
        if s["start"] is not None:
            queued, seconds = max(0.0, s["start"] - o.began), max(0.0, o.ended - s["start"])
        else:
            queued, seconds = o.seconds, 0.0
        reason, extra = "", ""
        if s["state"] == "COMPLETED":
            extra = f"slurm job {s['job']} COMPLETED"
        elif s["state"] is not None:
            why = f": {s['reason']}" if s["reason"] not in ("None", "-", "") else ""
            reason = (f"slurm job {s['job']} {s['state']}{why} (exit {s['exit']})"
                      + (f"; {s['notice']}" if s["notice"] else ""))
        elif not o.timed_out and not o.cancelled:
            reason = "the Slurm client reported no job state (see the log)"
        return {"devices": s["devices"], "queued": queued, "seconds": seconds,
                "timed_out": o.timed_out or s["state"] in TIMED_OUT,
                "reason": reason, "extra": extra,
                "cancel": ("cancelled while running" if s["start"] is not None
                           else "cancelled in the Slurm queue before it ran")}

    def cancel_leftovers(self) -> None:
        """scancel the jobs of clients that died without cleaning up (``SPOOL/<id>.active``)."""
        for marker in self.spool.glob("*.active") if self.spool.is_dir() else []:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["scancel", marker.stem], capture_output=True, timeout=30)
                marker.unlink()


# -- the client (runs on the submitting host) ----------------------------------------------

class _Cancelled(Exception):
    pass


_cancelling = []


def _raise_cancelled(*_):
    """Signal handler: raise once (the runner signals the group and then each process, so a
    second SIGTERM must not interrupt the cancellation it started)."""
    if not _cancelling:
        _cancelling.append(True)
        raise _Cancelled


def batch_script(args) -> str:
    launch = [args.python, "-m", "ci.slurm", "launch", "--gres", args.gres,
              "--cards", str(args.cards), "--", *args.command]
    lines = ["#!/bin/bash"]
    if args.activate:
        lines.append(f"source {shlex.quote(args.activate)}")
    lines.append(f"exec {shlex.join(launch)}")
    return "\n".join(lines) + "\n"


def sbatch_argv(args) -> list[str]:
    argv = ["sbatch", "--parsable", f"--job-name={args.job_name}",
            f"--gres={args.gres}:{args.cards}", f"--time={args.minutes}", "--nodes=1",
            "--ntasks=1", f"--chdir={args.chdir}", f"--output={args.spool}/%j.log",
            "--open-mode=truncate", "--no-requeue", "--export=ALL"]
    if args.partition:
        argv.append(f"--partition={args.partition}")
    if args.account:
        argv.append(f"--account={args.account}")
    return argv


def _say(text: str) -> None:
    sys.stdout.buffer.write((text + "\n").encode())
    sys.stdout.buffer.flush()


def _scontrol(job: str) -> str | None:
    """``scontrol show job -o JOB``; None on a transient error, "" once Slurm forgot it."""
    try:
        p = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True,
                           text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None
    if p.returncode == 0:
        return p.stdout
    return "" if "Invalid job id" in p.stderr else None


class _Tail:
    """Copies new bytes of the job's output file to stdout."""

    def __init__(self, path: Path):
        self.path, self.pos = path, 0

    def pump(self) -> None:
        with contextlib.suppress(FileNotFoundError), open(self.path, "rb") as f:
            f.seek(self.pos)
            data = f.read()
            self.pos += len(data)
            if data:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()


def submit_main(args) -> int:
    """Submit, stream, wait; print the END line; exit 0 only for a COMPLETED job with exit 0."""
    Path(args.spool).mkdir(parents=True, exist_ok=True)
    # The job's processes belong to Slurm: without the runner's token, the runner's sweep of
    # a node's processes (same host on a one-node cluster) cannot race Slurm's own handling.
    env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
    signals = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)   # held until the job id is recorded
    p = subprocess.run(sbatch_argv(args), input=batch_script(args), capture_output=True,
                       text=True, env=env)
    job = p.stdout.strip().split(";")[0]
    if p.returncode != 0 or not job.isdigit():
        why = " ".join((p.stderr or p.stdout).split()) or f"sbatch exit {p.returncode}"
        _say(f"{END} job=- state=REJECTED exit={p.returncode} reason={why}")
        return 1
    active = Path(args.spool) / f"{job}.active"
    active.touch()
    for sig in signals:
        signal.signal(sig, _raise_cancelled)
    tail, t0, delay, record, forgotten = _Tail(Path(args.spool) / f"{job}.log"), \
        time.monotonic(), 0.25, "", 0
    state = note = None
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)   # a held SIGTERM lands here
        while True:
            got = _scontrol(job)
            tail.pump()
            if got == "":
                forgotten += 1
                if forgotten >= 3:
                    state, note = "UNKNOWN", "Slurm no longer knows the job"
                    break
            elif got:
                record = got
                state = job_field(record, "JobState")
                if state not in ACTIVE:
                    break
                if state == "PENDING" and time.monotonic() - t0 > args.wait:
                    subprocess.run(["scancel", job], capture_output=True, timeout=60)
                    note = (f"still pending after --submit-wait {args.wait:g}s "
                            f"(Slurm reason {job_field(record, 'Reason')}); cancelled")
                    break
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)
    except _Cancelled:
        if subprocess.run(["scancel", job], capture_output=True, timeout=60).returncode == 0:
            active.unlink(missing_ok=True)
        tail.pump()
        _say(f"{END} job={job} state=CANCELLED exit=- reason=the runner was cancelled")
        return 143
    time.sleep(0.3)   # slurmstepd's last words (e.g. the time-limit line) land in the file
    tail.pump()
    active.unlink(missing_ok=True)
    exit_code = job_field(record, "ExitCode") or "-"
    reason = note or job_field(record, "Reason") or "-"
    _say(f"{END} job={job} state={state} exit={exit_code} reason={reason}")
    status = exit_code.split(":")[0]
    if state == "COMPLETED" and not note:
        return int(status) if status.isdigit() else 1
    return int(status) if status.isdigit() and int(status) else 1


# -- the launcher (runs inside the job) ----------------------------------------------------

def launch_main(args) -> int:
    """Read this job's allocated card ids from Slurm and exec the node command with them."""
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        print("ci.slurm launch: SLURM_JOB_ID is not set: not inside a Slurm job", flush=True)
        return 3
    p = subprocess.run(["scontrol", "show", "job", "-d", job], capture_output=True, text=True,
                       timeout=60)
    ids = allocated_ids(p.stdout, args.gres) if p.returncode == 0 else None
    if ids is None or len(ids) != args.cards:
        print(f"ci.slurm launch: job {job} record shows GRES {args.gres} ids {ids}, expected "
              f"{args.cards} (scontrol exit {p.returncode}): refusing to guess card ids\n"
              f"{p.stdout}{p.stderr}", flush=True)
        return 3
    host = os.environ.get("SLURMD_NODENAME", "?")
    print(f"{START} {time.time():.3f} job {job} node {host} cards {','.join(map(str, ids))}",
          flush=True)
    argv = [*args.command, ",".join(map(str, ids))]
    os.execvp(argv[0], argv)
    return 127   # not reached


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ci.slurm", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("submit", help="submit one node as a batch job and wait for it")
    s.add_argument("--job-name", required=True)
    s.add_argument("--gres", required=True)
    s.add_argument("--cards", type=int, required=True)
    s.add_argument("--minutes", type=int, required=True)
    s.add_argument("--wait", type=float, required=True)
    s.add_argument("--chdir", required=True)
    s.add_argument("--spool", required=True)
    s.add_argument("--python", default=sys.executable)
    s.add_argument("--partition")
    s.add_argument("--account")
    s.add_argument("--activate")
    s.add_argument("command", nargs=argparse.REMAINDER)
    la = sub.add_parser("launch", help="(inside the job) exec the node with its card ids")
    la.add_argument("--gres", required=True)
    la.add_argument("--cards", type=int, required=True)
    la.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("a node command after -- is required")
    return submit_main(args) if args.mode == "submit" else launch_main(args)


if __name__ == "__main__":
    sys.exit(main())
