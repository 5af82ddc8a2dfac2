"""harness.compare.ratio: ratio_allclose and ratio_reldiff (reference-facts 6.2)."""

import math

import pytest
import torch

from harness.compare.ratio import ratio_allclose, ratio_reldiff
from harness.verdict import all_passed


def _by_check(vs):
    return {v.check: v for v in vs}


def _with_bad(n_bad, shape=(10, 100), delta=1.0):
    ref = torch.ones(shape)
    actual = ref.clone()
    actual.view(-1)[torch.arange(n_bad) * 97 % ref.numel()] += delta
    return actual, ref


def test_ratio_allclose_passes_up_to_the_allowed_fraction():
    actual, ref = _with_bad(5)  # 5/1000 = 0.5 %
    vs = ratio_allclose("pre_mix", actual, ref, atol=1e-4, rtol=1e-4, max_error_ratio=0.005)
    assert all_passed(vs)
    v = _by_check(vs)["ratio_allclose"]
    assert v.measured == pytest.approx(0.005) and v.bound == 0.005 and "within 99.5000%" in v.detail


def test_ratio_allclose_fails_one_over_and_reports_fraction_and_worst_element():
    actual, ref = _with_bad(6)
    actual[9, 99] += 5.0  # the worst element
    v = _by_check(ratio_allclose("pre_mix", actual, ref, atol=1e-4, rtol=1e-4))["ratio_allclose"]
    assert not v.passed and v.measured == pytest.approx(0.007) and v.row == 9
    assert "col 99" in v.detail and len(v.failing_rows) >= 2


def test_ratio_allclose_any_nan_fails_even_under_the_quota():
    actual, ref = _with_bad(0)
    actual[3, 4] = math.nan
    v = _by_check(ratio_allclose("pre_mix", actual, ref, atol=1e-4, rtol=1e-4))
    assert not v["finite"].passed and v["finite"].row == 3
    assert v["ratio_allclose"].measured == pytest.approx(0.001) and v["ratio_allclose"].row == 3


def test_ratio_allclose_relative_tolerance_scales_with_reference():
    ref = torch.full((2, 4), 1000.0)
    actual = ref + 0.5  # 0.5 <= 1e-4 + 1e-3*1000
    assert all_passed(ratio_allclose("x", actual, ref, atol=1e-4, rtol=1e-3, max_error_ratio=0.0))
    assert not all_passed(ratio_allclose("x", actual, ref, atol=1e-4, rtol=1e-4, max_error_ratio=0.0))


def test_ratio_reldiff_formula_on_crafted_points():
    ref = torch.tensor([[1.0, 1.0, 1.0, 1e-6]])
    # d=0.005 (< thd, good); d=0.5 (rdiff 0.5/1.5, bad); d=0.009 (good); tiny values: floor keeps good
    actual = torch.tensor([[1.005, 1.5, 0.991, 2e-6]])
    v = _by_check(ratio_reldiff("moe", actual, ref, diff_thd=0.01, pct_thd=0.25, max_diff_hd=0.5))
    assert v["reldiff_ratio"].passed and v["reldiff_ratio"].measured == pytest.approx(0.25)
    assert v["reldiff_peak"].passed and v["reldiff_peak"].measured == pytest.approx(0.5 / (1.5 + 1e-9))
    v = _by_check(ratio_reldiff("moe", actual, ref, diff_thd=0.01, pct_thd=0.2, max_diff_hd=0.3))
    assert not v["reldiff_ratio"].passed and not v["reldiff_peak"].passed
    assert v["reldiff_peak"].relation == "<" and v["reldiff_peak"].bound == 0.3


def test_ratio_reldiff_non_finite_reference_or_actual_fails():
    ref = torch.ones(3, 4)
    ref[1, 1] = math.inf
    v = _by_check(ratio_reldiff("moe", torch.ones(3, 4), ref))
    assert not v["finite"].passed and v["finite"].row == 1
    assert all_passed(ratio_reldiff("moe", torch.ones(3, 4), torch.ones(3, 4)))


def test_rows_selection_and_misuse():
    actual, ref = _with_bad(0, shape=(4, 8))
    actual[3] = 99.0
    assert all_passed(ratio_allclose("x", actual, ref, atol=0, rtol=0, max_error_ratio=0, rows=slice(0, 3)))
    with pytest.raises(ValueError, match="x: actual shape"):
        ratio_reldiff("x", actual, ref[:2])
