"""Row-level comparators: the contract's per-row bound, zero (padding) rows, sentinels.

The per-row bound is the contract's output check for attention rows (C1A and the other
row-bounded outputs): every row (one token on one rank) must satisfy

    RMS(actual - reference)      <= 1e-6 + 0.01 * RMS(reference)
    max |actual - reference|     <= 1e-5 + 0.05 * RMS(reference)

non-finite values fail and there is no outlier quota.  Inactive rows are left out of the
bound and checked with :func:`check_zero_rows`, so they cannot dilute the budget.
"""

from __future__ import annotations

import torch

from harness.compare._common import element_bytes, require_same_shape, selected_rows
from harness.verdict import Verdict, summarize

RMS_ATOL = 1e-6
RMS_RTOL = 0.01
PEAK_ATOL = 1e-5
PEAK_RTOL = 0.05


def check_row_bound(
    output: str,
    actual: torch.Tensor,
    ref: torch.Tensor,
    rows=None,
    *,
    rms_atol: float = RMS_ATOL,
    rms_rtol: float = RMS_RTOL,
    peak_atol: float = PEAK_ATOL,
    peak_rtol: float = PEAK_RTOL,
) -> list[Verdict]:
    """Contract per-row bound on the selected (active) rows, in float64 from the stored
    values.  Returns verdicts ``finite`` (non-finite count per row, bound 0),
    ``row_rms`` and ``row_peak``; each names the worst row and lists every failing row.
    The tolerances default to the contract numbers and may be overridden per output."""
    require_same_shape(output, actual, ref)
    a, labels = selected_rows(output, actual, rows)
    r, _ = selected_rows(output, ref, rows)
    rms, rms_bound, peak, peak_bound = _row_errors(a, r, rms_atol, rms_rtol, peak_atol, peak_rtol)
    return [
        summarize(output, "finite", (~torch.isfinite(a)).sum(dim=-1), 0.0, labels,
                  metric="non-finite values in actual row"),
        summarize(output, "row_rms", rms, rms_bound,
                  labels, metric=f"RMS(a-r) <= {rms_atol:g} + {rms_rtol:g}*RMS(r)"),
        summarize(output, "row_peak", peak, peak_bound,
                  labels, metric=f"max|a-r| <= {peak_atol:g} + {peak_rtol:g}*RMS(r)"),
    ]


def _row_errors(a: torch.Tensor, r: torch.Tensor, rms_atol: float, rms_rtol: float, peak_atol: float,
                peak_rtol: float):
    """Per row of ``[n, D]`` rows: ``(RMS(a-r), its bound, max|a-r|, its bound)``."""
    diff = a - r
    rms_ref = r.square().mean(dim=-1).sqrt()
    return (diff.square().mean(dim=-1).sqrt(), rms_atol + rms_rtol * rms_ref,
            diff.abs().amax(dim=-1), peak_atol + peak_rtol * rms_ref)


def row_bound_ratios(actual: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """FP64 per row of ``[n, D]`` rows: the larger of RMS(a-r) and max|a-r| over their
    contract bounds (what :func:`check_row_bound` decides; > 1 fails), inf for a row with
    a non-finite value.  For reports that track how close rows come to the bound."""
    a, r = actual.to(torch.float64), ref.to(torch.float64)
    rms, rms_bound, peak, peak_bound = _row_errors(a, r, RMS_ATOL, RMS_RTOL, PEAK_ATOL, PEAK_RTOL)
    out = torch.maximum(rms / rms_bound, peak / peak_bound)
    out[~torch.isfinite(a).all(dim=-1)] = float("inf")
    return out


def check_zero_rows(output: str, actual: torch.Tensor, rows=None) -> list[Verdict]:
    """Rows in ``rows`` (default: all) must be exactly zero: ``+0.0`` and ``-0.0`` count
    as zero, NaN never does.  Verdict ``zero_rows`` measures non-zero elements per row
    (bound 0); works for every dtype, including FP8 and integer storage (E8M0 scales,
    which cannot encode zero, must hold zero bytes)."""
    if actual.dtype == torch.float8_e8m0fnu:  # E8M0 has no zero: a zero row is zero bytes
        actual = actual.view(torch.uint8)
    dtype = torch.float64 if actual.is_floating_point() else torch.int64
    a, labels = selected_rows(output, actual, rows, dtype)
    return [summarize(output, "zero_rows", (a != 0).sum(dim=-1), 0.0, labels,
                      metric="non-zero elements in a row that must be zero")]


def check_sentinel(
    output: str,
    actual: torch.Tensor,
    sentinel: float | int,
    rows=None,
    *,
    ref: torch.Tensor | None = None,
) -> list[Verdict]:
    """Rows in ``rows`` (default: all) must have been written: no element may still hold
    the sentinel's bytes (``sentinel`` cast to ``actual.dtype``, so a NaN sentinel works).
    A partially written row fails too.  With ``ref``, elements whose reference value also
    has the sentinel's bytes are excused.  Verdict ``sentinel`` counts per row."""
    fill = torch.full((1,), sentinel, dtype=actual.dtype)
    stuck = (element_bytes(actual) == element_bytes(fill)).all(dim=1)
    if ref is not None:
        require_same_shape(output, actual, ref)
        stuck &= ~(element_bytes(ref.to(actual.dtype)) == element_bytes(fill)).all(dim=1)
    stuck = stuck.reshape(actual.shape) if actual.dim() else stuck
    s, labels = selected_rows(output, stuck, rows, torch.int64)
    return [summarize(output, "sentinel", s.sum(dim=-1), 0.0, labels,
                      metric=f"elements still holding sentinel {sentinel!r} (missing write)")]
