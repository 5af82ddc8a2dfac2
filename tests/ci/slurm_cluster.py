"""A throw-away single-node Slurm cluster for the queue-runner tests.

``SlurmCluster(base)`` writes a munge key, ``slurm.conf`` and ``gres.conf`` (``cards`` GRES of
one name backed by placeholder device files) under ``base``, starts ``munged``, ``slurmctld``
and ``slurmd`` in the foreground as its own children on free private ports, and waits
(bounded) until the node is idle. ``stop()`` cancels every job, stops the daemons and any
process they left behind (job steps carry the cluster's token in their environment).
Every daemon is private to the instance: two instances (two xdist workers) can coexist.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo",
            "squeue")
TOKEN_VAR = "V41_SLURM_CLUSTER"


def missing_binaries() -> list[str]:
    """Names of the Slurm/munge programs not found on PATH (nor in /usr/sbin)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [d for d in PROGRAMS if shutil.which(d, path=path) is None]


def _exe(name: str) -> str:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    found = shutil.which(name, path=path)
    if found is None:
        raise FileNotFoundError(name)
    return found


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


SLURM_CONF = """\
ClusterName={cluster}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={base}/munge.socket
CredType=cred/munge
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd.pid
SlurmctldLogFile={base}/slurmctld.log
SlurmdLogFile={base}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
KillWait={kill_wait}
MinJobAge=600
InactiveLimit=0
SlurmdTimeout=60
SlurmctldTimeout=60
GresTypes={gres}
NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={slurmd_port} CPUs={cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={cpus} ThreadsPerCore=1 RealMemory=1000 Gres={gres}:{cards} State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """One slurmctld + one slurmd (node ``node``) with ``cards`` GRES ``gres`` (ids 0..cards-1)."""

    def __init__(self, base: Path, *, cards: int = 8, gres: str = "npu", cpus: int = 8,
                 partition: str = "ci", kill_wait: int = 2, tag: str = "0"):
        self.base = Path(base)
        self.cards, self.gres, self.cpus, self.partition = cards, gres, cpus, partition
        self.kill_wait = kill_wait
        self.node = f"ciq{tag}"
        self.cluster = f"ciq{tag}"
        self.token = secrets.token_hex(8)
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = self.base / "slurm.conf"

    # -- environment a client needs -------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """Variables for clients of this cluster: its config, and the token that marks every
        process of its jobs (sbatch exports it) for ``stop``."""
        return {"SLURM_CONF": str(self.conf), TOKEN_VAR: self.token}

    def devices(self) -> list[Path]:
        return [self.base / "dev" / f"{self.gres}{i}" for i in range(self.cards)]

    # -- lifecycle -----------------------------------------------------------------------
    def write_config(self) -> None:
        b = self.base
        for d in ("state", "spool", "dev"):
            (b / d).mkdir(parents=True, exist_ok=True)
        for dev in self.devices():
            dev.write_text("")   # placeholder device file: only its path and index matter
        key = b / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        ctld_port, slurmd_port = _free_ports(2)
        self.conf.write_text(SLURM_CONF.format(
            cluster=self.cluster, host=socket.gethostname(), ctld_port=ctld_port,
            slurmd_port=slurmd_port, user=pwd.getpwuid(os.getuid()).pw_name, base=b,
            gres=self.gres, node=self.node, cpus=self.cpus, cards=self.cards,
            partition=self.partition, kill_wait=self.kill_wait))
        (b / "gres.conf").write_text(
            f"NodeName={self.node} Name={self.gres} File={b}/dev/{self.gres}[0-{self.cards - 1}]\n")

    def start(self, timeout: float = 60.0) -> "SlurmCluster":
        """Start the daemons and wait until the node is idle; raises (after stopping) if not."""
        self.write_config()
        env = {**os.environ, **self.env}
        b = self.base
        try:
            self._spawn("munged", [_exe("munged"), "-F", "--force", f"--socket={b}/munge.socket",
                                   f"--key-file={b}/munge.key", f"--pid-file={b}/munged.pid",
                                   f"--log-file={b}/munged.log", f"--seed-file={b}/munged.seed"],
                        env)
            self._wait(lambda: (b / "munge.socket").exists(), 10, "munged socket")
            self._spawn("slurmctld", [_exe("slurmctld"), "-D", "-i", "-f", str(self.conf)], env)
            self._spawn("slurmd", [_exe("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)],
                        env)
            self._wait(lambda: self.node_state() == "idle", timeout, f"node {self.node} idle")
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, argv: list[str], env: dict) -> None:
        log = open(self.base / f"{name}.stdout", "wb")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env,
                                            start_new_session=True)
        log.close()

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} while waiting for "
                                       f"{what}:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"no {what} after {timeout:g}s:\n{self.logs()}")

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        return subprocess.run([_exe(argv[0]), *argv[1:]], capture_output=True, text=True,
                              env={**os.environ, **self.env}, check=check, timeout=30)

    def node_state(self) -> str:
        p = self.run("sinfo", "-h", "-n", self.node, "-o", "%T", check=False)
        return p.stdout.strip().rstrip("*~#") if p.returncode == 0 else ""

    def logs(self, tail: int = 30) -> str:
        out = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log", "slurmctld.stdout",
                     "slurmd.stdout", "munged.stdout"):
            path = self.base / name
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-tail:]
                out.append(f"--- {name}\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel all jobs, stop slurmd, slurmctld and munged, then anything they left behind."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.run("scancel", "--full", f"--partition={self.partition}", check=False)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and self.run(
                        "squeue", "-h", "-o", "%i", check=False).stdout.strip():
                    time.sleep(0.2)
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.get(name)
            if p is None:
                continue
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        self._kill_tagged()

    def _kill_tagged(self) -> None:
        """SIGKILL every process carrying this cluster's token (slurmstepd and its jobs)."""
        needle = f"{TOKEN_VAR}={self.token}".encode() + b"\0"
        for pid in (int(n) for n in os.listdir("/proc") if n.isdigit()):
            if pid == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{pid}/environ").read_bytes():
                    os.kill(pid, signal.SIGKILL)
