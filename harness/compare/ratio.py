"""Bounded-outlier elementwise comparators (reference-facts section 6.2).

``ratio_allclose``: an element is bad when ``|a - e| > atol + rtol*|e|`` or ``a`` is
not finite; the output passes when the bad fraction is ``<= max_error_ratio``.

``ratio_reldiff``: with ``d = |a - e|`` and ``b = max(|a|, |e|, 2^-14/diff_thd) + 1e-9``,
``rdiff = d if d < diff_thd else d / b``; an element is bad when ``rdiff > diff_thd``;
passes when the bad fraction is ``<= pct_thd`` and the largest bad ``rdiff`` is
``< max_diff_hd``.  NaN/Inf in either tensor fail.

Both are meant for mHC/MoE side outputs; attention rows use the per-row bound.
"""

from __future__ import annotations

import math

import torch

from harness.compare._common import require_same_shape, selected_rows
from harness.verdict import Verdict, single, summarize


def _bad_rows(labels, bad: torch.Tensor) -> list:
    return [labels[i] for i in bad.any(dim=-1).nonzero().flatten().tolist()]


def _worst(score: torch.Tensor) -> tuple[int, int] | None:
    """(row position, column) of the largest ``score`` (NaN counts as largest)."""
    if score.numel() == 0:
        return None
    flat = int(torch.nan_to_num(score, nan=math.inf).reshape(-1).argmax())
    return flat // score.shape[-1], flat % score.shape[-1]


def ratio_allclose(
    output: str,
    actual: torch.Tensor,
    ref: torch.Tensor,
    *,
    atol: float,
    rtol: float,
    max_error_ratio: float = 0.005,
    rows=None,
) -> list[Verdict]:
    """Verdicts ``finite`` (per row) and ``ratio_allclose``: measured = fraction of bad
    elements, bound = ``max_error_ratio``; the detail gives the fraction within
    tolerance and the worst element (row, column, diff, tolerance)."""
    require_same_shape(output, actual, ref)
    a, labels = selected_rows(output, actual, rows)
    e, _ = selected_rows(output, ref, rows)
    diff, tol = (a - e).abs(), atol + rtol * e.abs()
    bad = ~(diff <= tol) | ~torch.isfinite(a)
    n = bad.numel()
    frac = float(bad.sum()) / n if n else 0.0
    at = _worst(diff - tol)
    row = labels[at[0]] if at else None
    note = f"{int(bad.sum())}/{n} elements outside |a-e| <= {atol:g} + {rtol:g}*|e| (within {1 - frac:.4%})"
    if at:
        note += f"; worst at row {row} col {at[1]}: diff {float(diff[at]):.4g} tol {float(tol[at]):.4g}"
    return [
        summarize(output, "finite", (~torch.isfinite(a)).sum(dim=-1), 0.0, labels,
                  metric="non-finite values in actual row"),
        single(output, "ratio_allclose", frac, max_error_ratio, row=row, failing_rows=_bad_rows(labels, bad),
               n_checked=len(labels), metric="fraction of elements outside atol + rtol*|e|", note=note),
    ]


def ratio_reldiff(
    output: str,
    actual: torch.Tensor,
    ref: torch.Tensor,
    *,
    diff_thd: float = 0.01,
    pct_thd: float = 0.05,
    max_diff_hd: float = math.inf,
    rows=None,
) -> list[Verdict]:
    """Verdicts ``finite`` (actual and reference, per row), ``reldiff_ratio`` (bad
    fraction ``<= pct_thd``) and ``reldiff_peak`` (worst bad rdiff ``< max_diff_hd``)."""
    require_same_shape(output, actual, ref)
    a, labels = selected_rows(output, actual, rows)
    e, _ = selected_rows(output, ref, rows)
    d = (a - e).abs()
    b = torch.maximum(torch.maximum(a.abs(), e.abs()), torch.tensor(2.0**-14 / diff_thd, dtype=a.dtype)) + 1e-9
    rdiff = torch.where(d < diff_thd, d, d / b)
    nonfinite = ~torch.isfinite(a) | ~torch.isfinite(e)
    bad = ~(rdiff <= diff_thd) | nonfinite
    n = bad.numel()
    frac = float(bad.sum()) / n if n else 0.0
    at = _worst(torch.where(bad, rdiff, torch.zeros_like(rdiff)))
    row = labels[at[0]] if at else None
    peak = float(rdiff[at]) if (at and frac) else 0.0
    bad_rows = _bad_rows(labels, bad)
    return [
        summarize(output, "finite", nonfinite.sum(dim=-1), 0.0, labels,
                  metric="non-finite values in actual or reference row"),
        single(output, "reldiff_ratio", frac, pct_thd, row=row, failing_rows=bad_rows, n_checked=len(labels),
               metric=f"fraction of elements with rdiff > {diff_thd:g}",
               note=f"{int(bad.sum())}/{n} bad elements; worst rdiff at row {row} col {at[1] if at else None}"),
        single(output, "reldiff_peak", peak, max_diff_hd, row=row, relation="<", failing_rows=bad_rows,
               n_checked=len(labels), metric="largest rdiff over bad elements"),
    ]
