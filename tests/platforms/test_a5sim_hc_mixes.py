"""a5sim: v41.hc_mixes through its harness entry; wrong kernels fail the comparison, and
the Sinkhorn pass count is pinned on the "sharp" fixture (the contract bound alone cannot
see one pass more or less)."""

from __future__ import annotations

import pytest

from harness.case import Case
from harness.entries._kernel import run_with, single_launch

ENTRY, MODULE = "hc_mixes", "v41.hc_mixes"




def run_variant(platform, case: Case, **options):
    """(verdicts, outputs, golden) of the entry's comparison for a kernel built with ``options``."""
    return run_with(platform, case, single_launch(MODULE, **options))


SHARP = Case(entry=ENTRY, tokens=19, kind="sharp")


@pytest.mark.parametrize("variant,expect", [
    ("row_last", {("comb", "row_rms")}),
    ("no_rms", {("pre", "row_rms"), ("post", "row_rms"), ("comb", "row_rms")}),
    ("half_sinkhorn", {("comb", "row_rms")}),
    # one pass short stays inside the contract bound: only the pass-count check sees it
    ("short_sinkhorn", {("comb:sinkhorn_passes", "row_rms")}),
])
def test_wrong_kernel_fails_the_comparison(a5sim, variant, expect):
    verdicts, _, _ = run_variant(a5sim, SHARP, variant=variant)
    bad = {(v.output, v.check) for v in verdicts if not v.passed}
    assert expect <= bad, f"variant {variant}: {[v.line() for v in verdicts if not v.passed]}"
    if variant == "short_sinkhorn":
        assert {o for o, _ in bad} == {"comb:sinkhorn_passes"}
