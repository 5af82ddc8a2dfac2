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
def test_wrong_kernel_fails_the_comparison(numerics, variant, expect):
    verdicts, _, _ = run_variant(numerics, SHARP, variant=variant)
    bad = {(v.output, v.check) for v in verdicts if not v.passed}
    assert expect <= bad, f"variant {variant}: {[v.line() for v in verdicts if not v.passed]}"
    if variant == "short_sinkhorn":
        assert {o for o, _ in bad} == {"comb:sinkhorn_passes"}


@pytest.mark.parametrize("tokens", [100, 200])
def test_large_launch_schedules_hold_the_bounds(numerics, tokens):
    """The BIG_ROW_TILE schedule (T=100: a 96-row tile and a 4-row tail) and the
    HUGE_ROW_TILE one (T=200: 192 + 8), with their gathered K-tile partials and 8-row
    Sinkhorn tiles, hold every bound (the default matrix's TINY cases take the one-tile and
    the split-K schedules)."""
    verdicts, outputs, _ = run_variant(numerics, Case(entry=ENTRY, tokens=tokens))
    assert {v.output for v in verdicts} >= {"pre", "post", "comb"}
    assert all(v.passed for v in verdicts), [v.line() for v in verdicts if not v.passed]
    assert outputs["comb"].shape[0] == tokens


def test_large_launch_sinkhorn_is_compared(numerics):
    """Half the Sinkhorn passes in the BIG_ROW_TILE schedule's 8-row Sinkhorn tiles fail comb
    on the "sharp" fixture (on "mixed" data they stay inside the bound)."""
    verdicts, _, _ = run_variant(numerics, Case(entry=ENTRY, tokens=100, kind="sharp"),
                                 variant="half_sinkhorn")
    assert ("comb", "row_rms") in {(v.output, v.check) for v in verdicts if not v.passed}
