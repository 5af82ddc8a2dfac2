"""harness.verdict: margins, worst-row selection, failing-row lists, the fixed format."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.verdict import (
    Verdict,
    all_passed,
    assert_all_passed,
    failures,
    format_failures,
    single,
    summarize,
    worst,
)


def test_summarize_names_worst_row_and_keeps_every_failing_row():
    v = summarize("out", "row_rms", [0.1, 3.0, 0.2, 2.0], 1.0, [0, 1, 2, 3], metric="RMS")
    assert not v.passed
    assert (v.row, v.measured, v.bound, v.margin) == (1, 3.0, 1.0, -2.0)
    assert v.failing_rows == (1, 3) and v.n_failing == 2 and v.n_checked == 4
    assert "row 1" in v.detail and "3" in v.detail and "RMS" in v.detail


def test_summarize_passes_with_positive_margin_and_per_row_bounds():
    v = summarize("out", "row_peak", [1.0, 1.0], [2.0, 1.5], [(0, 3), (1, 4)])
    assert v.passed and v.failing_rows == () and v.row == (1, 4) and v.margin == 0.5


def test_nan_measurement_always_fails_and_is_worst():
    v = summarize("out", "row_rms", [5.0, math.nan], 1.0, [0, 1])
    assert not v.passed and v.row == 1 and v.margin == -math.inf and v.failing_rows == (0, 1)


def test_at_least_relation_and_strict_relation():
    assert not single("out", "cosine", 0.99, 0.9999, relation=">=").passed
    assert single("out", "cosine", 1.0, 0.9999, relation=">=").margin == pytest.approx(1e-4)
    assert not single("out", "peak", 2.0, 2.0, relation="<").passed
    with pytest.raises(ValueError, match="relation"):
        single("out", "x", 1.0, 1.0, relation="==")


def test_empty_selection_passes_but_is_not_applicable():
    v = summarize("out", "row_rms", [], 1.0, [])
    assert v.passed and v.row is None and v.n_checked == 0
    assert not v.applicable and math.isnan(v.measured) and math.isnan(v.margin)


def test_single_reports_failing_rows_given_or_its_own_row():
    v = single("out", "rel_l2", 0.5, 0.01, row=7, failing_rows=[7, 9])
    assert v.failing_rows == (7, 9) and v.row == 7
    assert single("out", "rel_l2", 0.5, 0.01, row=3).failing_rows == (3,)
    assert single("out", "rel_l2", 0.0, 0.01, row=3, failing_rows=[3]).failing_rows == ()


def test_report_helpers_and_fixed_failure_format():
    good = single("a", "cosine", 1.0, 0.9999, relation=">=")
    bad1 = summarize("b", "row_rms", [0.0, 4.0], 1.0, [0, 1], metric="RMS(a-r)")
    bad2 = single("c", "exact_bytes", 3.0, 0.0, row=(2, 5), note="first changed flat index 17")
    vs = [good, bad1, bad2]
    assert not all_passed(vs) and all_passed([good])
    assert failures(vs) == [bad1, bad2]
    assert worst(vs) is bad1 and worst([]) is None
    lines = format_failures(vs).splitlines()
    assert lines == [
        "FAIL b row_rms row=1 measured=4 bound=<=1 failing_rows=1/2 [RMS(a-r)]",
        "FAIL c exact_bytes row=(2, 5) measured=3 bound=<=0 failing_rows=1/1 [; first changed flat index 17]",
    ]
    assert format_failures([good]) == ""
    with pytest.raises(AssertionError, match="2 check\\(s\\) failed"):
        assert_all_passed(vs)
    assert_all_passed([good])


def test_verdict_is_frozen():
    v = single("a", "x", 0.0, 1.0)
    with pytest.raises(Exception):
        v.passed = False  # type: ignore[misc]
    assert isinstance(v, Verdict)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=20), st.floats(-1e3, 1e3))
def test_property_margin_sign_matches_pass_and_worst_is_minimum(values, bound):
    v = summarize("o", "m", values, bound, list(range(len(values))))
    assert v.passed == all(x <= bound for x in values)
    assert v.margin == min(bound - x for x in values) == bound - v.measured
    assert set(v.failing_rows) == {i for i, x in enumerate(values) if x > bound}
    assert np.isfinite(v.margin)


def test_no_rows_with_a_per_row_tensor_bound_is_a_pass():
    import torch

    from harness.compare import check_row_bound
    a = torch.zeros(4, 8)
    vs = check_row_bound("y", a, a, rows=torch.zeros(4, dtype=torch.bool))
    assert all(v.passed and v.n_checked == 0 for v in vs)
