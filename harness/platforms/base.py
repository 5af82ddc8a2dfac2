"""The platform interface: compile a kernel for (config, case), launch it per rank.

A kernel is named by a :class:`KernelSpec` (a module under ``v41/`` plus keyword options
for its builder).  The kernel module provides, without importing pypto at import time:

* ``abi(config, case) -> sequence`` of records with ``name``, ``shape``, ``dtype`` (torch
  dtype name) and ``role`` (``"in"``, ``"out"``, ``"inout"``) in call order;
* ``build(config, case, *, runtime_options=None, **options) -> callable`` taking the
  tensors in ABI order (a ``pypto.frontend.jit`` kernel).

``Platform.compile`` resolves and checks the ABI (no pypto here: pypto runs only inside
launch workers); ``Platform.launch`` runs one rank and returns a :class:`LaunchResult`.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROLES = ("in", "out", "inout")


class PlatformError(RuntimeError):
    """A platform cannot do what was asked (unavailable, bad program, bad tensors)."""


class LaunchError(PlatformError):
    """A launch failed; ``result`` carries the error text and the worker log path."""

    def __init__(self, result: "LaunchResult"):
        self.result = result
        super().__init__(f"launch failed: {result.error} (log: {result.log_path})")


@dataclass(frozen=True)
class KernelSpec:
    """``module`` provides ``abi`` and ``build``; ``options`` go to ``build`` (JSON-able)."""

    module: str
    options: Mapping[str, Any] = field(default_factory=dict)
    builder: str = "build"
    abi: str = "abi"

    @property
    def name(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return self.module.rsplit(".", 1)[-1] + (f"[{opts}]" if opts else "")

    @property
    def slug(self) -> str:
        """``name`` safe for a directory name."""
        return re.sub(r"[^A-Za-z0-9_.=-]+", "_", self.name).strip("_")

    def to_json(self) -> dict:
        return {"module": self.module, "options": dict(self.options), "builder": self.builder,
                "abi": self.abi}

    @classmethod
    def from_json(cls, data: Mapping) -> "KernelSpec":
        return cls(data["module"], dict(data.get("options", {})), data.get("builder", "build"),
                   data.get("abi", "abi"))


@dataclass(frozen=True)
class TensorArg:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "bfloat16"
    role: str

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)


@dataclass(frozen=True)
class Program:
    """A kernel resolved for one (config, case) on one platform."""

    platform: str
    spec: KernelSpec
    config: Any
    case: dict
    args: tuple[TensorArg, ...]

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args if a.role in ("out", "inout"))


@dataclass(frozen=True)
class CostReport:
    """Cost-model estimate of one launch on the modelled A5 (Ascend 950, 72 cores)."""

    aicore_e2e_us: float  # AICore end-to-end: (max execEnd - min execStart) / 1800 MHz
    total_cycles: int
    device_arch: str | None = None
    cores: int | None = None
    tasks: int | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class LaunchResult:
    """What one rank's launch produced.  ``ok`` False means ``error`` says why."""

    ok: bool
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    cost: CostReport | None = None
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    log_path: Path | None = None
    run_dir: Path | None = None
    rank: int = 0
    details: dict = field(default_factory=dict)  # e.g. verify summary, worker reuse

    def cost_record(self) -> dict:
        """``{"rank", "aicore_e2e_us", "total_cycles"}`` (the registry's cost record) plus
        ``tasks`` (the cost model's), ``compile_s`` and ``compile_cpu_s`` (the worker's wall
        and CPU seconds of pypto's compile) where measured, or {}."""
        if self.cost is None:
            return {}
        record = {"rank": self.rank, "aicore_e2e_us": self.cost.aicore_e2e_us,
                  "total_cycles": self.cost.total_cycles}
        measured = (("tasks", self.cost.tasks), ("compile_s", self.timings.get("compile_s")),
                    ("compile_cpu_s", self.timings.get("compile_cpu_s")))
        for key, value in measured:
            if value is not None:
                record[key] = value
        return record

    def raise_for_error(self) -> "LaunchResult":
        if not self.ok:
            raise LaunchError(self)
        return self


class Platform(abc.ABC):
    name: str = ""
    verify_level: str | None = None  # what a launch's numerics are checked at, if anything
    estimate_only: bool = False  # True: launches run the cost model only, outputs uncomputed

    @abc.abstractmethod
    def available(self) -> tuple[bool, str]:
        """(True, "") when launches can run here, else (False, reason)."""

    def compile(self, kernel_spec: KernelSpec, config, case) -> Program:
        """Resolve the kernel's ABI for ``config`` and ``case`` (no pypto work here)."""
        return Program(self.name, kernel_spec, config, case_dict(case),
                       resolve_abi(kernel_spec, config, case_dict(case)))

    @abc.abstractmethod
    def launch(self, program: Program, rank: int, tensors: Mapping[str, torch.Tensor]
               ) -> LaunchResult:
        """Run ``program`` as ``rank`` on ``tensors`` (by ABI name; not modified)."""

    def close(self) -> None:
        """Release run directories and workers."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise PlatformError(f"dtype: {name!r} is not a torch dtype name")
    return dt


def case_dict(case) -> dict:
    """A JSON-able dict of the case's axes (mapping, dataclass or None)."""
    if case is None:
        return {}
    if isinstance(case, Mapping):
        return dict(case)
    if dataclasses.is_dataclass(case):
        return dataclasses.asdict(case)
    raise PlatformError(f"case: {type(case).__name__} is neither a mapping nor a dataclass")


def resolve_abi(spec: KernelSpec, config, case: dict) -> tuple[TensorArg, ...]:
    module = importlib.import_module(spec.module)
    records = getattr(module, spec.abi)(config, case)
    args = []
    for r in records:
        arg = TensorArg(r.name, tuple(int(d) for d in r.shape), r.dtype, r.role)
        if arg.role not in ROLES:
            raise PlatformError(f"{spec.module}: arg {arg.name} role {arg.role!r} not in {ROLES}")
        torch_dtype(arg.dtype)
        args.append(arg)
    names = [a.name for a in args]
    if len(set(names)) != len(names):
        raise PlatformError(f"{spec.module}: duplicate ABI names {names}")
    return tuple(args)


def check_tensors(program: Program, tensors: Mapping[str, torch.Tensor]) -> None:
    """Raise PlatformError naming the argument whose tensor is missing or mismatched."""
    missing = [a.name for a in program.args if a.name not in tensors]
    extra = sorted(set(tensors) - {a.name for a in program.args})
    if missing or extra:
        raise PlatformError(f"{program.spec.name}: tensors missing {missing}, unexpected {extra}")
    for a in program.args:
        t = tensors[a.name]
        if not isinstance(t, torch.Tensor):
            raise PlatformError(f"{a.name}: expected a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != a.shape:
            raise PlatformError(f"{a.name}: shape {tuple(t.shape)} != ABI shape {a.shape}")
        if t.dtype != a.torch_dtype:
            raise PlatformError(f"{a.name}: dtype {t.dtype} != ABI dtype torch.{a.dtype}")
