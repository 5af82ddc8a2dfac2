"""a5sim: v41.gate through its harness entry; wrong kernels fail the comparison (indices
exactly, weights by the per-row bound)."""

from __future__ import annotations

import pytest

from harness.case import Case
from harness.entries._kernel import run_with, single_launch

ENTRY, MODULE = "gate", "v41.gate"




def run_variant(platform, case: Case, **options):
    """(verdicts, outputs, golden) of the entry's comparison for a kernel built with ``options``."""
    return run_with(platform, case, single_launch(MODULE, **options))


@pytest.mark.parametrize("variant,case,expect", [
    ("unbiased_select", Case(entry=ENTRY, tokens=21), ("indices", "exact_bytes")),
    ("biased_weights", Case(entry=ENTRY, tokens=21), ("weights", "row_rms")),
    ("higher_index_ties", Case(entry=ENTRY, tokens=6, kind="ties"), ("indices", "exact_bytes")),
])
def test_wrong_kernel_fails_the_comparison(a5sim, variant, case, expect):
    verdicts, out, gold = run_variant(a5sim, case, variant=variant)
    bad = {(v.output, v.check) for v in verdicts if not v.passed}
    assert expect in bad, f"variant {variant} passed: {[v.line() for v in verdicts]}"
    if variant == "higher_index_ties":  # lanes 1 and 2 tie with expert E-1: it wins instead
        assert gold["indices"][:, 0].tolist() == [1] * case.tokens
        assert out["indices"][:, 0].tolist() == [case.config.moe.n_routed_experts - 1] * case.tokens
