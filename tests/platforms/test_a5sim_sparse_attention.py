"""a5sim: v41.sparse_attention through its harness entry; wrong kernels (sink ignored, sink
in the numerator, -1 keys unmasked, wrong softmax scale) fail the per-row bound."""

from __future__ import annotations

import pytest
import torch

from harness.case import Case
from harness.entries._kernel import run_with, single_launch

ENTRY, MODULE = "sparse_attention", "v41.sparse_attention"
CASE = Case(entry=ENTRY, tokens=5)


def run_variant(platform, case: Case, **options):
    """(verdicts, outputs, golden) of the entry's comparison for a kernel built with ``options``."""
    return run_with(platform, case, single_launch(MODULE, **options))


@pytest.mark.parametrize("variant,expect", [
    ("no_sink", {"finite", "row_rms"}),  # finite: the fully masked token divides 0 by 0
    ("sink_numerator", {"row_rms", "row_peak"}),
    ("unmasked", {"row_rms", "row_peak"}),
    ("wrong_scale", {"row_rms", "row_peak"}),
])
def test_wrong_kernel_fails_the_comparison(a5sim, variant, expect):
    verdicts, out, gold = run_variant(a5sim, CASE, variant=variant)
    bad = {v.check for v in verdicts if not v.passed and v.output == "out"}
    assert expect <= bad, f"variant {variant}: {[v.line() for v in verdicts]}"


def test_reference_passes_and_masked_token_is_zero(a5sim):
    verdicts, out, gold = run_variant(a5sim, CASE)
    assert all(v.passed for v in verdicts), [v.line() for v in verdicts if not v.passed]
    assert torch.equal(out["out"][2], torch.zeros_like(out["out"][2]))  # no valid key
