"""a5sim: v41.hc_pre and v41.hc_head (the final collapse) through their harness entries;
the reference is bit-exact against the golden (same FP32 operation order) and wrong kernels
fail the comparison."""

from __future__ import annotations

import pytest
import torch

from harness.case import Case
from harness.entries._kernel import run_with, single_launch
from harness.verdict import all_passed

ENTRIES = ["hc_pre", "hc_head"]
WRONG = [("hc_pre", "normalized"), ("hc_pre", "lane0"), ("hc_head", "normalized")]


def run_variant(platform, entry: str, **options):
    """(verdicts, outputs, golden) of ``entry``'s comparison for a kernel built with ``options``."""
    case = Case(entry=entry, tokens=11, kind="onehot")
    return run_with(platform, case, single_launch(f"v41.{entry}", **options))


@pytest.mark.parametrize("entry", ENTRIES)
def test_reference_is_bit_exact(numerics, entry):
    verdicts, out, gold = run_variant(numerics, entry)
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    assert torch.equal(out["y"], gold["y"])


@pytest.mark.parametrize("entry,variant", WRONG)
def test_wrong_kernel_fails_the_comparison(numerics, entry, variant):
    verdicts, _, _ = run_variant(numerics, entry, variant=variant)
    bad = {(v.output, v.check) for v in verdicts if not v.passed}
    assert ("y", "row_rms") in bad, f"variant {variant} passed: {[v.line() for v in verdicts]}"
