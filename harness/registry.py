"""The entry registry: every validated operator is one :class:`Entry` record.

An entry is data: what its axes accept (:class:`~harness.case.Support`), its default CI
matrix, a deterministic fixture builder, its golden, its system under test per platform,
and its comparison (which also encodes its cache-ownership map).  The runner, report,
save/replay, pytest parametrization and the queue runner are generic over entries:
adding a mode is adding one entry module under ``harness/entries/``.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from goldens.config import V41Config
from harness.case import Case, CaseError, Support

Tensors = dict[str, torch.Tensor]


@dataclass
class SutOutput:
    """What a system under test produced: outputs by name and one cost record per launch
    (``{"rank", "aicore_e2e_us", "total_cycles"}``; empty when the platform has none)."""

    outputs: Tensors
    costs: list[dict] = field(default_factory=list)


# (platform object, config, case, inputs) -> SutOutput; inputs are the SUT's own copies
SutFn = Callable[[object, V41Config, Case, Tensors], SutOutput]


@dataclass(frozen=True)
class Work:
    """What one launch must do, for the bench roofline: ``bytes`` moved to or from HBM
    (every gathered row counted per gather, tables only for the rows read, outputs for the
    rows written) and ``flops`` per compute dtype (keys of
    ``harness.platforms.topology.COMPUTE_DTYPES``: cube ``bf16``/``fp8``/``fp32``,
    ``vector_fp32`` for elementwise work)."""

    bytes: int
    flops: dict[str, int] = field(default_factory=dict)


def tensor_bytes(*tensors: torch.Tensor) -> int:
    """Total storage bytes of ``tensors`` (each moved once)."""
    return sum(t.numel() * t.element_size() for t in tensors)


# (config, case, inputs from build_inputs) -> Work
WorkFn = Callable[[V41Config, Case, Tensors], Work]


@dataclass(frozen=True)
class Entry:
    """One validated operator.

    ``build_inputs(config, case)`` is deterministic in ``case.seed`` and returns every
    tensor the operator reads or writes (output buffers pre-filled with a sentinel).
    ``golden(config, case, inputs)`` returns the reference outputs (and updated caches).
    ``compare(config, case, inputs, golden, actual)`` returns verdicts.
    ``kernels`` maps a platform name to the kernel path; ``alternate`` is a second path
    through the goldens that serves (and is labelled as such) where no kernel exists yet.
    """

    name: str
    description: str
    support: Support
    matrix: tuple[Case, ...]
    build_inputs: Callable[[V41Config, Case], Tensors]
    golden: Callable[[V41Config, Case, Tensors], Tensors]
    compare: Callable[[V41Config, Case, Tensors, Tensors, Tensors], list]
    kernels: dict[str, SutFn] = field(default_factory=dict)
    alternate: SutFn | None = None
    alternate_label: str = ""
    slow_cases: tuple[Case, ...] = ()  # FLASH-shape cases, run under the `slow` marker
    # The matrix cases a default pytest run takes (None: all of them); the others carry the
    # `matrix` marker and run when the run selects (harness.pytest_plugin).
    representative: tuple[Case, ...] | None = None
    work: WorkFn | None = None  # bytes and FLOPs of one case, for the bench roofline

    def sut_for(self, platform: str) -> tuple[str, SutFn | None]:
        """(label, function) of the system under test on ``platform``."""
        if platform in self.kernels:
            return f"kernel:{self.name}", self.kernels[platform]
        if self.alternate is not None and platform in ALTERNATE_PLATFORMS:
            return f"golden-alt:{self.alternate_label or self.name}", self.alternate
        return "none", None


# A second golden path validates the harness and goldens on the CPU platform only: on
# cards it would pass without testing any kernel.
ALTERNATE_PLATFORMS = ("a5sim",)

_ENTRIES: dict[str, Entry] = {}


def register(entry: Entry) -> Entry:
    if entry.name in _ENTRIES and _ENTRIES[entry.name] is not entry:
        raise ValueError(f"entry: {entry.name!r} is registered twice")
    _ENTRIES[entry.name] = entry
    return entry


@contextlib.contextmanager
def registered(*new: Entry):
    """Register ``new`` entries for the duration of a ``with`` block (tests, experiments)."""
    for e in new:
        register(e)
    try:
        yield new
    finally:
        for e in new:
            _ENTRIES.pop(e.name, None)


def _load_all() -> None:
    import harness.entries as pkg
    for mod in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"harness.entries.{mod.name}")


def entries() -> dict[str, Entry]:
    """All registered entries, by name (entry modules are imported on first use)."""
    _load_all()
    return dict(sorted(_ENTRIES.items()))


class UnknownEntryError(CaseError, KeyError):
    """An entry name that is not registered.  A :class:`CaseError` for front ends and a
    ``KeyError`` for lookups; its text is the plain message (no ``KeyError`` quoting)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def get(name: str) -> Entry:
    """The entry called ``name``; :class:`UnknownEntryError` naming close matches if none."""
    all_entries = entries()
    if name not in all_entries:
        close = difflib.get_close_matches(name, list(all_entries), n=3)
        hint = (f"did you mean {' or '.join(close)}?" if close
                else f"known: {', '.join(all_entries)}")
        raise UnknownEntryError(f"entry: {name} is not registered; {hint}")
    return all_entries[name]
