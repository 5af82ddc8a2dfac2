"""a5sim: v41.hc_pre through its harness entry; the reference is bit-exact against the
golden (same FP32 operation order) and wrong kernels fail the comparison."""

from __future__ import annotations

import pytest
import torch

from harness.case import Case
from harness.entries._kernel import run_with, single_launch
from harness.verdict import all_passed

ENTRY, MODULE = "hc_pre", "v41.hc_pre"




def run_variant(platform, case: Case, **options):
    """(verdicts, outputs, golden) of the entry's comparison for a kernel built with ``options``."""
    return run_with(platform, case, single_launch(MODULE, **options))


CASE = Case(entry=ENTRY, tokens=11, kind="onehot")


def test_reference_is_bit_exact(a5sim):
    verdicts, out, gold = run_variant(a5sim, CASE)
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    assert torch.equal(out["y"], gold["y"])


@pytest.mark.parametrize("variant", ["normalized", "lane0"])
def test_wrong_kernel_fails_the_comparison(a5sim, variant):
    verdicts, _, _ = run_variant(a5sim, CASE, variant=variant)
    bad = {(v.output, v.check) for v in verdicts if not v.passed}
    assert ("y", "row_rms") in bad, f"variant {variant} passed: {[v.line() for v in verdicts]}"
