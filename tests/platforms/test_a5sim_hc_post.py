"""a5sim: v41.hc_post through its harness entry; the reference is bit-exact against the
golden (same FP32 operation order and BF16 rounding) and wrong kernels fail the comparison."""

from __future__ import annotations

import pytest
import torch

from harness.case import Case
from harness.entries._kernel import run_with, single_launch
from harness.verdict import all_passed

ENTRY, MODULE = "hc_post", "v41.hc_post"




def run_variant(platform, case: Case, **options):
    """(verdicts, outputs, golden) of the entry's comparison for a kernel built with ``options``."""
    return run_with(platform, case, single_launch(MODULE, **options))


CASE = Case(entry=ENTRY, tokens=11)


def test_reference_is_bit_exact(numerics):
    verdicts, out, gold = run_variant(numerics, CASE)
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    assert torch.equal(out["out"], gold["out"])


@pytest.mark.parametrize("variant", ["comb_transposed", "no_post"])
def test_wrong_kernel_fails_the_comparison(numerics, variant):
    verdicts, _, _ = run_variant(numerics, CASE, variant=variant)
    bad = {(v.output, v.check) for v in verdicts if not v.passed}
    assert ("out", "row_rms") in bad, f"variant {variant} passed: {[v.line() for v in verdicts]}"


def test_missing_rounding_fails_the_storage_check(numerics):
    """``no_round`` stays inside the per-row bound (BF16 rounding is 2^-9 relative) but its
    FP32 values are not BF16 values: the entry's storage-format check fails."""
    verdicts, out, gold = run_variant(numerics, CASE, variant="no_round")
    bad = {(v.output, v.check) for v in verdicts if not v.passed}
    assert bad == {("out:bf16_values", "exact_bytes")}, [v.line() for v in verdicts]
    assert not torch.equal(out["out"], gold["out"])
