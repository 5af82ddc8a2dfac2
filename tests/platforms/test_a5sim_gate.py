"""a5sim: v41.gate through its harness entry; wrong kernels fail the comparison (indices
exactly, weights by the per-row bound, padding rows exactly index 0 / weight 0) and an
active count outside [0, T] is rejected on the host before any launch."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.case import Case
from harness.entries import gate as entry_mod
from harness.entries._kernel import run_with
from harness.fixtures import clone_tensors
from harness.verdict import all_passed
from platform_stubs import NoLaunch

ENTRY = "gate"
PADDED = Case(entry=ENTRY, tokens=50, active_tokens=21)  # two routed tiles, two zero tiles


def run_variant(platform, case: Case, **options):
    """(verdicts, outputs, golden) of the entry's comparison for a kernel built with ``options``."""
    return run_with(platform, case, entry_mod.kernel_sut(**options))


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


@pytest.mark.parametrize("variant,case,expect", [
    ("unbiased_select", Case(entry=ENTRY, tokens=21), ("indices", "exact_bytes")),
    ("biased_weights", Case(entry=ENTRY, tokens=21), ("weights", "row_rms")),
    ("higher_index_ties", Case(entry=ENTRY, tokens=6, kind="ties"), ("indices", "exact_bytes")),
])
def test_wrong_kernel_fails_the_comparison(numerics, variant, case, expect):
    verdicts, out, gold = run_variant(numerics, case, variant=variant)
    bad = {(v.output, v.check) for v in verdicts if not v.passed}
    assert expect in bad, f"variant {variant} passed: {[v.line() for v in verdicts]}"
    if variant == "higher_index_ties":  # lanes 1 and 2 tie with expert E-1: it wins instead
        assert gold["indices"][:, 0].tolist() == [1] * case.tokens
        assert out["indices"][:, 0].tolist() == [case.config.moe.n_routed_experts - 1] * case.tokens


@pytest.mark.parametrize("variant", ["route_padding", "skip_padding"])
def test_padding_rows_written_wrong_fail_the_padding_check(numerics, variant):
    verdicts, out, gold = run_variant(numerics, PADDED, variant=variant)
    bad = failing(verdicts)
    assert bad == {("indices", "zero_rows"), ("weights", "zero_rows")}, \
        [v.line() for v in verdicts if not v.passed]
    zero = next(v for v in verdicts if (v.output, v.check) == ("weights", "zero_rows"))
    assert set(zero.failing_rows) == set(range(PADDED.active, PADDED.tokens))
    assert torch.equal(out["indices"][:PADDED.active], gold["indices"][:PADDED.active])


@pytest.mark.parametrize("case", [PADDED, Case(entry=ENTRY, tokens=8, active_tokens=0),
                                  Case(entry=ENTRY, tokens=16, active_tokens=16)])
def test_padding_rows_get_index_zero_and_weight_zero(numerics, case):
    verdicts, out, gold = run_variant(numerics, case)
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    n = case.active
    assert ("weights", "zero_rows") in {(v.output, v.check) for v in verdicts}
    assert (out["indices"][n:] == 0).all() and (out["weights"][n:] == 0).all()
    if n:  # active rows really routed: positive weights summing to routed_scaling_factor
        w = out["weights"][:n].double()
        scale = case.config.moe.routed_scaling_factor
        assert (w > 0).all()
        assert torch.allclose(w.sum(-1), torch.full((n,), scale, dtype=torch.float64))


@pytest.mark.parametrize("bad,match", [
    (torch.tensor([51], dtype=torch.int32), r"num_tokens: 51 outside \[0, T=50\]"),
    (torch.tensor([-1], dtype=torch.int32), r"num_tokens: -1 outside \[0, T=50\]"),
    (torch.tensor([21], dtype=torch.int64), r"num_tokens: must be INT32 \[1\]"),
    (torch.tensor([21, 0], dtype=torch.int32), r"num_tokens: must be INT32 \[1\]"),
])
def test_host_rejects_bad_active_count_before_launching(bad, match):
    inputs = registry.get(ENTRY).build_inputs(PADDED.config, PADDED)
    inputs["num_tokens"] = bad
    before = clone_tensors(inputs)
    with pytest.raises(ValueError, match=match):
        entry_mod.kernel_sut()(NoLaunch(), PADDED.config, PADDED, inputs)
    assert all(torch.equal(inputs[k], before[k]) for k in inputs)


def test_default_matrix_has_an_inactive_suffix_case():
    assert any(c.active < c.tokens for c in registry.get(ENTRY).matrix)
