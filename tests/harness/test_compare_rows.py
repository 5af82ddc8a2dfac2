"""harness.compare.rows: the contract per-row bound, zero rows, sentinels."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.compare.rows import check_row_bound, check_sentinel, check_zero_rows
from harness.verdict import all_passed


def _ref(rows=64, width=128, seed=0, dtype=torch.float32):
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _by_check(verdicts):
    return {v.check: v for v in verdicts}


def _rms(x):
    return float(x.double().square().mean().sqrt())


def test_good_rows_pass_all_three_checks():
    ref = _ref()
    actual = ref * (1 + 1e-3)
    vs = check_row_bound("attn_out", actual, ref)
    assert [v.check for v in vs] == ["finite", "row_rms", "row_peak"]
    assert all_passed(vs) and all(v.margin > 0 for v in vs[1:])


def test_one_bad_row_among_many_fails_although_the_global_rms_passes():
    ref = _ref(rows=100)
    actual = ref.clone()
    signs = torch.sign(torch.randn(128, generator=torch.Generator().manual_seed(1)))
    actual[37] += 0.02 * ref[37].abs().mean() * signs
    assert _rms(actual - ref) <= 0.01 * _rms(ref)  # a global RMS gate would pass
    v = _by_check(check_row_bound("attn_out", actual, ref))["row_rms"]
    assert not v.passed and v.row == 37 and v.failing_rows == (37,)
    assert v.bound == pytest.approx(1e-6 + 0.01 * _rms(ref[37]))
    assert "row 37" in v.detail and "RMS(a-r)" in v.detail


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_single_non_finite_value_fails_its_row(bad):
    ref = _ref(dtype=torch.bfloat16)
    actual = ref.clone()
    actual[5, 17] = bad
    v = _by_check(check_row_bound("attn_out", actual, ref))
    assert not v["finite"].passed and v["finite"].row == 5 and v["finite"].measured == 1
    assert v["finite"].failing_rows == (5,) and v["finite"].bound == 0
    assert not v["row_rms"].passed and v["row_rms"].failing_rows == (5,)


def test_peak_outlier_with_tiny_rms_fails_the_peak_bound_only():
    ref = _ref(width=512)
    actual = ref.clone()
    rms11 = _rms(ref[11])
    actual[11, 300] += 0.1 * rms11  # RMS error 0.1/sqrt(512) = 0.0044 of RMS(r)
    v = _by_check(check_row_bound("attn_out", actual, ref))
    assert v["row_rms"].passed
    assert not v["row_peak"].passed and v["row_peak"].row == 11 and v["row_peak"].failing_rows == (11,)
    assert v["row_peak"].bound == pytest.approx(1e-5 + 0.05 * rms11)
    assert v["row_peak"].measured == pytest.approx(0.1 * rms11, rel=1e-5)


def test_near_zero_reference_row_uses_the_absolute_floors():
    ref = _ref(rows=8, dtype=torch.float64)
    ref[3] = 0.0
    small = ref.clone()
    small[3] = 5e-7 * torch.sign(torch.randn(128, generator=torch.Generator().manual_seed(2)))
    assert all_passed(check_row_bound("attn_out", small, ref))
    large = ref.clone()
    large[3] = 3e-6
    v = _by_check(check_row_bound("attn_out", large, ref))
    assert not v["row_rms"].passed and v["row_rms"].row == 3 and v["row_rms"].bound == pytest.approx(1e-6)
    assert v["row_peak"].passed  # 3e-6 <= 1e-5 peak floor


def test_inactive_rows_are_excluded_and_labels_follow_leading_dims():
    ref = _ref(rows=12).reshape(3, 4, 128)  # [rank, token, D]
    actual = ref.clone()
    actual[2, 3] = 1e3  # garbage in an inactive row
    active = torch.ones(3, 4, dtype=torch.bool)
    active[2, 3] = False
    assert all_passed(check_row_bound("attn_out", actual, ref, rows=active))
    v = _by_check(check_row_bound("attn_out", actual, ref))["row_peak"]
    assert v.row == (2, 3) and v.failing_rows == ((2, 3),)
    assert all_passed(check_row_bound("attn_out", actual, ref, rows=slice(0, 11)))
    assert all_passed(check_row_bound("attn_out", actual, ref, rows=[0, 5, 10, -1]))


def test_tolerances_are_overridable_per_output():
    ref = _ref()
    actual = ref * 1.02
    assert not all_passed(check_row_bound("o", actual, ref))
    vs = check_row_bound("o", actual, ref, rms_rtol=0.03, peak_rtol=0.2)
    assert all_passed(vs) and _by_check(vs)["row_rms"].bound > 0.02 * _rms(ref[0]) * 0.5


def test_misuse_raises_value_error_naming_output_and_shapes():
    with pytest.raises(ValueError, match=r"attn_out.*\(4, 8\).*\(4, 9\)"):
        check_row_bound("attn_out", torch.zeros(4, 8), torch.zeros(4, 9))
    with pytest.raises(ValueError, match="attn_out: row mask has 3 entries"):
        check_row_bound("attn_out", torch.zeros(4, 8), torch.zeros(4, 8), rows=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="row 4 out of range"):
        check_zero_rows("pad", torch.zeros(4, 8), rows=[4])


@settings(max_examples=40, deadline=None)
@given(eps=st.floats(-0.009, 0.009), width=st.integers(1, 16), seed=st.integers(0, 1000))
def test_property_relative_error_under_one_percent_passes(eps, width, seed):
    ref = _ref(rows=4, width=width, seed=seed, dtype=torch.float64)
    assert all_passed(check_row_bound("o", ref * (1 + eps), ref))


@settings(max_examples=40, deadline=None)
@given(row=st.integers(0, 7), col=st.integers(0, 31), factor=st.floats(0.06, 100.0), seed=st.integers(0, 1000))
def test_property_any_single_peak_above_bound_fails_its_row(row, col, factor, seed):
    ref = _ref(rows=8, width=32, seed=seed, dtype=torch.float64)
    actual = ref.clone()
    actual[row, col] += factor * _rms(ref[row]) + 1e-5
    v = _by_check(check_row_bound("o", actual, ref))["row_peak"]
    assert not v.passed and v.failing_rows == (row,)


def test_zero_rows_pass_on_zero_and_negative_zero():
    t = torch.zeros(6, 16, dtype=torch.bfloat16)
    t[2] = -0.0
    [v] = check_zero_rows("attn_out", t, rows=[2, 3, 4, 5])
    assert v.passed and v.check == "zero_rows" and v.n_checked == 4


def test_a_non_zero_padding_row_fails_and_is_named():
    t = torch.zeros(8, 16)
    t[:3] = 1.0  # active rows are not checked
    t[6, 9] = 1e-30
    [v] = check_zero_rows("attn_out", t, rows=torch.arange(8) >= 3)
    assert not v.passed and v.row == 6 and v.measured == 1 and v.bound == 0 and v.failing_rows == (6,)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint8, torch.float32])
def test_nan_or_any_bit_pattern_in_padding_fails_for_every_dtype(dtype):
    t = torch.zeros(4, 8, dtype=dtype)
    if dtype.is_floating_point:
        t[1, 0] = math.nan
    else:
        t[1, 0] = 1
    [v] = check_zero_rows("cache", t, rows=[1, 2])
    assert not v.passed and v.failing_rows == (1,)


def test_sentinel_left_unwritten_is_caught():
    out = torch.randn(8, 16, dtype=torch.bfloat16)
    out[5] = 13.0  # the kernel never wrote row 5
    [v] = check_sentinel("attn_out", out, 13.0, rows=slice(0, 6))
    assert not v.passed and v.check == "sentinel" and v.row == 5 and v.measured == 16
    out[5] = 0.5
    out[7] = 13.0  # not required to be written
    assert check_sentinel("attn_out", out, 13.0, rows=slice(0, 6))[0].passed


def test_partial_write_and_nan_sentinel_are_caught():
    out = torch.randn(4, 32)
    out[2, 16:] = math.nan
    [v] = check_sentinel("attn_out", out, math.nan)
    assert not v.passed and v.row == 2 and v.measured == 16


def test_sentinel_value_also_in_the_reference_is_excused():
    ref = torch.randn(4, 8, dtype=torch.bfloat16)
    ref[1, 3] = 13.0
    out = ref.clone()
    assert check_sentinel("attn_out", out, 13.0, ref=ref)[0].passed
    assert not check_sentinel("attn_out", out, 13.0)[0].passed


def test_e8m0_scale_rows_must_hold_zero_bytes():
    t = torch.zeros(4, 4, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    assert check_zero_rows("scale", t)[0].passed
    t.view(torch.uint8)[2, 1] = 127  # scale 1.0 left in a padding row
    [v] = check_zero_rows("scale", t)
    assert not v.passed and v.row == 2
