"""Run one case: fixture, system under test, golden, comparison, optional save.

The system under test runs before the golden (on its own copies of the inputs) so a
reference buffer can never hand the kernel its answer.  On an estimate-only platform
(a5sim's ``cost`` level: no interpreter) the SUT runs for its cost records alone and the
result is ``estimate``: no golden, no comparison, nothing saved.  Any exception in the SUT becomes
an ``error`` result with its message; an unavailable platform becomes ``skip`` with the
platform's reason; a missing SUT is ``skip`` naming what is missing, never a pass.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field

from harness import registry
from harness.case import Case, CaseError, validate_case
from harness.fixtures import clone_tensors
from harness.verdict import Verdict, all_passed


@dataclass
class CaseResult:
    case: Case
    sut: str
    status: str  # pass | fail | skip | error | estimate (cost model only, nothing compared)
    verdicts: list[Verdict] = field(default_factory=list)
    costs: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    reason: str = ""
    data_dir: str | None = None
    verify_level: str | None = None  # the platform's verify level when a kernel ran

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def sut_kind(self) -> str:
        """``kernel`` or ``golden-alt`` from the ``sut`` label; ``none`` without a SUT."""
        return sut_kind(self.sut)

    def estimated_a5_us(self) -> float | None:
        """Largest per-rank AICore end-to-end estimate of the cost model, if any."""
        times = [c["aicore_e2e_us"] for c in self.costs if c.get("aicore_e2e_us") is not None]
        return max(times) if times else None

    def failure_text(self) -> str:
        if self.status in ("skip", "error"):
            return f"{self.case.case_id}: {self.status}: {self.reason}"
        bad = [v.line() for v in self.verdicts if not v.passed]
        return "\n".join([f"{self.case.case_id}: {len(bad)} failing checks", *bad])


def sut_kind(label: str) -> str:
    """The kind of a SUT label (``kernel:...``, ``golden-alt:...`` or ``none``)."""
    kind = label.split(":", 1)[0]
    return kind if kind in ("kernel", "golden-alt") else "none"


def load_platform(name: str, devices: tuple[int, ...] | None = None,
                  cost_model: bool | None = None):
    """The platform object for ``name``; card platforms get the allocated ``devices``,
    a5sim ``cost_model`` (None: ``V41_A5SIM_COST_MODEL``, on by default)."""
    from harness.platforms import get_platform
    if name == "a5":
        return get_platform(name, devices=devices)
    return get_platform(name, cost_model=cost_model)


def run_case(case: Case, *, save_root: str | None = None, cards_available: int | None = None,
             platform=None, devices: tuple[int, ...] | None = None) -> CaseResult:
    """Run ``case`` end to end and return its result (never raises for SUT failures)."""
    entry = registry.get(case.entry)
    validate_case(case, entry.support, cards_available)
    if save_root is not None and getattr(platform, "estimate_only", False):
        raise ValueError("save_root: an estimate-only platform computes no outputs to save")
    start = time.perf_counter()
    label, sut = entry.sut_for(case.platform)
    if sut is None:
        return CaseResult(case, label, "skip",
                          reason=f"no v41 kernel for {case.entry} on platform {case.platform} yet")
    owned = None
    if label.startswith("kernel:") and platform is None:
        platform = owned = load_platform(case.platform, devices)
    try:
        result = _run(case, entry, label, sut, platform, save_root, start)
        if label.startswith("kernel:") and platform is not None and result.status != "skip":
            result.verify_level = getattr(platform, "verify_level", None)
        return result
    finally:
        if owned is not None:
            owned.close()


def _run(case, entry, label, sut, platform, save_root, start) -> CaseResult:
    if platform is not None:
        ok, why = platform.available()
        if not ok:
            return CaseResult(case, label, "skip", reason=why)
    cfg = case.config
    if label.startswith("kernel:"):
        from harness import launch_record
        launch_record.note_case(case)
    inputs = entry.build_inputs(cfg, case)
    try:
        produced = sut(platform, cfg, case, clone_tensors(inputs))
    except (CaseError, ValueError) as err:
        return CaseResult(case, label, "error", reason=f"{type(err).__name__}: {err}",
                          seconds=time.perf_counter() - start)
    except Exception as err:  # noqa: BLE001 - any SUT crash is this case's failure
        tb = traceback.format_exc(limit=3)
        return CaseResult(case, label, "error", reason=f"{type(err).__name__}: {err}\n{tb}",
                          seconds=time.perf_counter() - start)
    if label.startswith("kernel:") and getattr(platform, "estimate_only", False):
        return CaseResult(case, label, "estimate", costs=produced.costs,
                          seconds=time.perf_counter() - start,
                          reason="cost model only: outputs not computed, nothing compared")
    golden = entry.golden(cfg, case, clone_tensors(inputs))
    try:
        verdicts = entry.compare(cfg, case, inputs, golden, produced.outputs)
    except (KeyError, ValueError) as err:  # e.g. a missing or misshaped SUT output
        return CaseResult(case, label, "error", costs=produced.costs,
                          reason=f"comparison impossible: {type(err).__name__}: {err}",
                          seconds=time.perf_counter() - start)
    if not verdicts:
        raise RuntimeError(f"entry {entry.name}: compare returned no verdicts (nothing checked)")
    status = "pass" if all_passed(verdicts) else "fail"
    result = CaseResult(case, label, status, verdicts, produced.costs,
                        time.perf_counter() - start)
    if label.startswith("kernel:") and platform is not None:  # set before save_case records it
        result.verify_level = getattr(platform, "verify_level", None)
    if save_root is not None:
        from harness.data import save_case
        result.data_dir = str(save_case(save_root, result, inputs, golden, produced.outputs))
    return result
