"""harness.compare.budget: the C2A attention budget (rel-L2 1 %, row 2 %, cosine 0.9999)."""

import math

import pytest
import torch

from harness.compare.budget import check_c2a_budget, cosine
from harness.verdict import all_passed


def _ref(rows=64, width=256, seed=0):
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(seed))


def _noise(like, rel, seed=1):
    """Noise whose L2 norm, row by row, is ``rel`` times the row norm of ``like``."""
    n = torch.randn(like.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    n = n / n.norm(dim=-1, keepdim=True) * like.double().norm(dim=-1, keepdim=True)
    return (rel * n).to(like.dtype)


def _by_check(vs):
    return {v.check: v for v in vs}


def test_good_output_passes_every_check():
    ref = _ref()
    vs = check_c2a_budget("attn_out", ref + _noise(ref, 0.005), ref)
    assert [v.check for v in vs] == ["finite", "rel_l2", "row_rel_l2", "cosine"]
    assert all_passed(vs)


def test_one_row_at_three_percent_fails_the_row_budget_only():
    ref = _ref()
    actual = ref.clone()
    actual[41] += _noise(ref[41:42], 0.03)[0]
    v = _by_check(check_c2a_budget("attn_out", actual, ref))
    assert v["rel_l2"].passed and v["cosine"].passed  # the global metrics dilute it
    row = v["row_rel_l2"]
    assert not row.passed and row.row == 41 and row.failing_rows == (41,) and row.bound == 0.02
    assert row.measured == pytest.approx(0.03, rel=1e-3)
    assert v["rel_l2"].row == 41  # the global verdict still points at the worst row


def test_uniform_error_fails_global_rel_l2_and_cosine():
    ref = _ref()
    v = _by_check(check_c2a_budget("attn_out", ref + _noise(ref, 0.015), ref))
    assert not v["rel_l2"].passed and v["rel_l2"].bound == 0.01
    assert v["rel_l2"].measured == pytest.approx(0.015, rel=1e-3)
    assert not v["cosine"].passed and v["cosine"].relation == ">=" and v["cosine"].bound == 0.9999
    assert v["row_rel_l2"].passed  # 1.5 % per row is inside the 2 % row budget
    assert len(v["rel_l2"].failing_rows) == 64  # every row is above the 1 % global budget


def test_zero_reference_row_must_be_exactly_zero():
    ref = _ref(rows=8)
    ref[2] = 0.0
    actual = ref.clone()
    assert all_passed(check_c2a_budget("attn_out", actual, ref))
    actual[2, 0] = 1e-6
    v = _by_check(check_c2a_budget("attn_out", actual, ref))["row_rel_l2"]
    assert not v.passed and v.row == 2 and v.measured == math.inf


def test_nan_fails_finite_and_inactive_rows_are_excluded():
    ref = _ref(rows=8)
    actual = ref.clone()
    actual[6, 3] = math.nan
    v = _by_check(check_c2a_budget("attn_out", actual, ref))
    assert not v["finite"].passed and v["finite"].row == 6
    assert not v["rel_l2"].passed and not v["cosine"].passed
    assert all_passed(check_c2a_budget("attn_out", actual, ref, rows=slice(0, 6)))


def test_cosine_conventions():
    z = torch.zeros(4)
    assert cosine(z, z) == 1.0 and cosine(torch.ones(4), z) == 0.0
    assert cosine(torch.ones(4), -torch.ones(4)) == pytest.approx(-1.0)


def test_shape_mismatch_is_misuse():
    with pytest.raises(ValueError, match=r"attn_out: actual shape \(2, 3\) != reference shape \(3, 2\)"):
        check_c2a_budget("attn_out", torch.zeros(2, 3), torch.zeros(3, 2))
