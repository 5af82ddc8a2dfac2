"""``a5sim``: pypto 0.2.0 kernels executed numerically on the CPU, timed by the A5 cost model.

Each launch runs in a worker subprocess (:mod:`harness.platforms.worker`) that imports
pypto from the DAV_3510 package overlay with the Ascend 950 cost-model config
(:mod:`harness.platforms.pypto_env`), feeds the real input tensors to pypto's
pass-verify calculator (the torch-backed interpreter of the compiled graph) and runs the
full path: compile to ALL_COMPLETE, interpret, then the cost model, which copies the
interpreted outputs back into the kernel's tensors.

The estimated time is read from ``CostModelSimulationOutput``: AICore end-to-end
= (max execEnd - min execStart) / 1800 MHz (the cost model's fixed clock, see
:mod:`harness.platforms.topology`) over the AIC/AIV lanes of
``_simulate.swim.json``, total cycles from ``_simulate.stat.report.txt``.  It is
deterministic run to run.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path

import torch

from harness.platforms import lifeline, pypto_env, topology, verify, worker
from harness.platforms import verify as verify_mod  # __init__'s ``verify`` argument shadows it
from harness.platforms.base import (CostReport, LaunchResult, Platform, PlatformError, Program,
                                    check_tensors)

VERIFY_LEVELS = verify.VERIFY_LEVELS  # "tensor": tensor graph only; "lowered": + every pass
ENV_COST_MODEL = "V41_A5SIM_COST_MODEL"  # "0": numerics only, no estimate (default "1")


def cost_model_from_env() -> bool:
    """False when ``V41_A5SIM_COST_MODEL=0`` (launches interpret but get no estimate), True
    when unset or ``1``; PlatformError naming the variable for any other value."""
    value = os.environ.get(ENV_COST_MODEL, "1")
    if value not in ("0", "1"):
        raise PlatformError(f"{ENV_COST_MODEL}: {value!r} is not one of ('0', '1')")
    return value == "1"


def verify_level_from_env() -> str:
    """The verify level named by ``V41_VERIFY`` (default ``tensor``); PlatformError naming
    ``V41_VERIFY`` and the allowed values otherwise."""
    try:
        return verify.level_from_env()
    except verify.VerifyLevelError as err:
        raise PlatformError(str(err)) from None


CYCLES_PER_US = topology.SIM_CLOCK_MHZ  # the clock the cost model converts with (topology.py)


def read_cost_report(output_root: Path) -> CostReport | None:
    """Cost report of the newest ``output_*`` under ``output_root`` (None if absent)."""
    runs = sorted(Path(output_root).glob("output_*/CostModelSimulationOutput"),
                  key=lambda p: p.stat().st_mtime)
    if not runs:
        return None
    cm = runs[-1]
    try:
        lanes = json.loads((cm / "_simulate.swim.json").read_text())
        stat = (cm / "_simulate.stat.report.txt").read_text()
    except OSError:
        return None
    spans = [(t["execStart"], t["execEnd"]) for lane in lanes
             if lane.get("coreType") in ("AIC", "AIV") for t in lane.get("tasks", [])]
    m = re.search(r"Total Cycles\.+:\s+(\d+)", stat)
    if not spans or m is None:
        return None
    cores = re.search(r"Core Machine Count\.+:\s+(\d+)", stat)
    arch = None
    ini = cm / "_simulate.config.ini"
    if ini.exists():
        a = re.search(r"deviceArch = (\S+)", ini.read_text())
        arch = a.group(1) if a else None
    e2e = (max(e for _, e in spans) - min(s for s, _ in spans)) / CYCLES_PER_US
    return CostReport(round(e2e, 3), int(m.group(1)), arch,
                      int(cores.group(1)) if cores else None, len(spans))


class A5SimPlatform(Platform):
    """CPU execution of pypto kernels in a persistent worker subprocess.

    ``arch`` is ``"a5"`` (DAV_3510 compile target, Ascend 950 cost model) or ``"a2a3"``
    (the stock package).  ``run_root`` defaults to a fresh temp dir removed by
    :meth:`close` unless ``V41_KEEP_RUN_DIR=1``; launch ``n`` uses ``run_root/launch-n-rank-r``
    and, unless kept, only its small files survive the launch (pypto's ``output/`` is
    dropped after the cost report is read).

    ``verify`` is the pass-verify level (:data:`VERIFY_LEVELS`; None reads ``V41_VERIFY``):
    a verifier verdict other than PASS/NO_COMPARE fails the launch, naming the stage.
    ``verify="cost"`` (only by argument, never from the environment) compiles and runs the
    cost model without the interpreter: :attr:`estimate_only` is True, outputs are not
    computed, and the runner refuses to compare them.
    ``cost_model=False`` (None reads ``V41_A5SIM_COST_MODEL``) is the converse: launches
    interpret and are checked as usual but skip the cost model, so they carry no estimate
    (the same output bits in about half the time; for FLASH numerics runs, whose
    estimates come from ``python -m harness.bench --estimate-only``).
    Launches are served one at a time by a worker that keeps pypto loaded
    (:class:`harness.platforms.worker.Worker`), replaced every ``V41_WORKER_JOBS``
    launches; it and the run root go away with this process however it ends.
    """

    name = "a5sim"

    def __init__(self, arch: str = "a5", run_root: Path | None = None,
                 timeout_s: float | None = 1800.0, verify: str | None = None,
                 cost_model: bool | None = None):
        if arch not in pypto_env.ARCHES:
            raise PlatformError(f"arch: {arch!r} is not one of {pypto_env.ARCHES}")
        if verify is None:
            verify = verify_level_from_env()
        elif verify not in VERIFY_LEVELS + (verify_mod.ESTIMATE_LEVEL,):
            raise PlatformError(f"verify: {verify!r} is not one of "
                                f"{VERIFY_LEVELS + (verify_mod.ESTIMATE_LEVEL,)}")
        self.verify_level = verify
        self.estimate_only = verify == verify_mod.ESTIMATE_LEVEL
        self.cost_model = cost_model_from_env() if cost_model is None else bool(cost_model)
        if self.estimate_only and not self.cost_model:
            raise PlatformError(f"cost_model: False leaves nothing to run at verify="
                                f"{verify_mod.ESTIMATE_LEVEL!r} (no interpreter, no estimate)")
        self.arch = arch
        self.timeout_s = timeout_s
        self._run_root = Path(run_root) if run_root else None
        self._owns_root = run_root is None
        self._counter = itertools.count(1)  # next() is atomic: launches may run in threads
        self._finalizer = None
        self._worker: worker.Worker | None = None
        self._lock = threading.Lock()  # one launch at a time on the worker

    @property
    def run_root(self) -> Path:
        if self._run_root is None:
            self._run_root = pypto_env.make_run_dir()
            if not pypto_env.keep_run_dir():
                lifeline.janitor().watch_path(self._run_root)
        if self._finalizer is None:
            self._worker = worker.Worker(self._run_root, arch=self.arch, run_mode="sim",
                                         drop_env=("ASCEND_HOME_PATH",))
            self._finalizer = weakref.finalize(self, _release, self._worker, self._run_root,
                                               self._owns_root)
        return self._run_root

    def available(self) -> tuple[bool, str]:
        try:
            pypto_env.installed_pypto_dir()
        except pypto_env.PyptoEnvError as err:
            return False, str(err)
        if shutil.which("cmake") is None and not pypto_env.calculator_path().exists():
            return False, "a5sim: cmake not found and no cached pypto calculator to load"
        return True, ""

    def launch(self, program: Program, rank: int, tensors: Mapping[str, torch.Tensor]
               ) -> LaunchResult:
        if program.platform != self.name:
            raise PlatformError(f"program compiled for {program.platform}, not {self.name}")
        check_tensors(program, tensors)
        n = next(self._counter)
        job_dir = self.run_root / f"launch-{n:04d}-{program.spec.slug}-rank{rank}"
        with self._lock:
            return worker.launch_program(job_dir, program, rank, tensors, arch=self.arch,
                                         run_mode="sim", timeout=self.timeout_s,
                                         drop_env=("ASCEND_HOME_PATH",),
                                         verify=self.verify_level, worker=self._worker,
                                         cost_model=self.cost_model)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # stops the worker, removes the run root (unless kept), once
            self._finalizer = None
            self._worker = None
        self._run_root = None if self._owns_root else self._run_root


def _release(work: worker.Worker, run_root: Path, owned: bool) -> None:
    """Stop the platform's worker; remove its run root if the platform made it."""
    work.close()
    if owned:
        pypto_env.cleanup_run_dir(run_root)
        lifeline.janitor().forget_path(run_root)


if __name__ == "__main__":  # python -m harness.platforms.a5sim --describe
    import sys
    sys.exit(topology.main(sys.argv[1:]))
