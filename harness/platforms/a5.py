"""``a5``: v41 kernels on Ascend A5 cards through pypto's NPU run mode.

Each launch runs in a worker subprocess (as on ``a5sim``) that imports pypto from the
DAV_3510 overlay with CANN's runtime (``ASCEND_HOME_PATH`` set), moves the tensors to
``npu:<card>`` (the rank's allocated card), calls the kernel with ``run_mode=NPU`` and copies the ``out`` / ``inout``
tensors back.  No cost report: device timing belongs to a profiler.  Untested here: this
machine has no card; :meth:`A5Platform.available` says why a launch cannot run.
"""

from __future__ import annotations

import glob
import importlib.util
import itertools
import os
import weakref
from collections.abc import Mapping
from pathlib import Path

import torch

from harness.platforms import pypto_env, worker
from harness.platforms.base import LaunchResult, Platform, PlatformError, Program, check_tensors


class A5Platform(Platform):
    name = "a5"

    def __init__(self, run_root: Path | None = None, timeout_s: float | None = 1800.0,
                 devices: tuple[int, ...] | None = None):
        """``devices``: the card ids allocated to this process (``--device``); rank r runs
        on ``devices[r]``.  Without them rank r runs on card r."""
        self.timeout_s = timeout_s
        self.devices = tuple(devices) if devices is not None else None
        self._run_root = Path(run_root) if run_root else None
        self._owns_root = run_root is None
        self._counter = itertools.count(1)  # next() is atomic: launches may run in threads
        self._finalizer = None

    def available(self) -> tuple[bool, str]:
        if not os.environ.get("ASCEND_HOME_PATH"):
            return False, "a5: no CANN runtime (ASCEND_HOME_PATH is not set)"
        if importlib.util.find_spec("torch_npu") is None:
            return False, "a5: torch_npu is not installed"
        if not glob.glob("/dev/davinci[0-9]*"):
            return False, "a5: no Ascend device (/dev/davinci* absent)"
        return True, ""

    def device_of(self, rank: int) -> int:
        """The card id rank ``rank`` launches on."""
        if self.devices is None:
            return rank
        if not 0 <= rank < len(self.devices):
            raise PlatformError(f"rank: {rank} has no allocated card (devices {self.devices})")
        return self.devices[rank]

    @property
    def run_root(self) -> Path:
        if self._run_root is None:
            self._run_root = pypto_env.make_run_dir(prefix="v41-a5-")
            self._finalizer = weakref.finalize(self, pypto_env.cleanup_run_dir, self._run_root)
        return self._run_root

    def launch(self, program: Program, rank: int, tensors: Mapping[str, torch.Tensor]
               ) -> LaunchResult:
        ok, why = self.available()
        if not ok:
            raise PlatformError(why)
        if program.platform != self.name:
            raise PlatformError(f"program compiled for {program.platform}, not {self.name}")
        check_tensors(program, tensors)
        n = next(self._counter)
        job_dir = self.run_root / f"launch-{n:04d}-{program.spec.slug}-rank{rank}"
        return worker.launch_program(job_dir, program, rank, tensors, arch="a5",
                                     run_mode="npu", timeout=self.timeout_s,
                                     device=self.device_of(rank))

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # removes the run root (unless V41_KEEP_RUN_DIR=1), once
            self._finalizer = None
        self._run_root = None if self._owns_root else self._run_root
