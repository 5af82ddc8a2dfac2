"""Every v41 kernel's TINY cases pass with pass-level verification (``verify="lowered"``):
the tensor graph and each lowering pass through InferDynShape agree on the real inputs, and
the outputs pass the entry's comparison."""

from __future__ import annotations

import pytest

from harness import registry
from harness.runner import run_case


def _kernel_tiny_cases():
    params = []
    for name, entry in registry.entries().items():
        if not entry.sut_for("a5sim")[0].startswith("kernel:"):
            continue
        params += [pytest.param(case, id=case.case_id) for case in entry.matrix
                   if case.preset == "tiny"]
    return params


def test_every_kernel_entry_has_a_tiny_case():
    kernels = {n for n, e in registry.entries().items()
               if e.sut_for("a5sim")[0].startswith("kernel:")}
    covered = {p.values[0].entry for p in _kernel_tiny_cases()}
    assert kernels and covered == kernels


@pytest.mark.parametrize("case", _kernel_tiny_cases())
def test_tiny_case_passes_at_lowered(lowered, case):
    result = run_case(case, platform=lowered)
    assert result.status == "pass", result.failure_text()
    assert result.verify_level == "lowered"
