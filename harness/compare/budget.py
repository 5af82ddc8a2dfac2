"""The C2A attention budget (decode and prefill C2A/SWA outputs).

Contract: over the active rows, relative L2 <= 1 %, every row's relative L2 <= 2 %,
cosine similarity >= 0.9999, all values finite.  A row whose reference is all zero
must be exactly zero (its relative L2 is 0 when it is, inf otherwise).  Inactive rows
are left out and checked with ``check_zero_rows``.
"""

from __future__ import annotations

import math

import torch

from harness.compare._common import rel_l2, require_same_shape, row_rel_l2, selected_rows
from harness.verdict import Verdict, single, summarize

C2A_MAX_REL_L2 = 0.01
C2A_MAX_ROW_REL_L2 = 0.02
C2A_MIN_COSINE = 0.9999


def cosine(a: torch.Tensor, r: torch.Tensor) -> float:
    """Cosine similarity in float64; 1 when both are zero, 0 when exactly one is."""
    a, r = a.to(torch.float64).reshape(-1), r.to(torch.float64).reshape(-1)
    na, nr = float(a.norm()), float(r.norm())
    if na == 0.0 or nr == 0.0:
        return 1.0 if na == nr else 0.0
    return float(a @ r) / (na * nr)


def check_c2a_budget(
    output: str,
    actual: torch.Tensor,
    ref: torch.Tensor,
    rows=None,
    *,
    max_rel_l2: float = C2A_MAX_REL_L2,
    max_row_rel_l2: float = C2A_MAX_ROW_REL_L2,
    min_cosine: float = C2A_MIN_COSINE,
) -> list[Verdict]:
    """C2A budget on the selected rows: verdicts ``finite``, ``rel_l2`` (global),
    ``row_rel_l2`` (every row) and ``cosine`` (global, ``>=``).  The global verdicts
    name the row with the largest relative error and list the rows above ``max_rel_l2``."""
    require_same_shape(output, actual, ref)
    a, labels = selected_rows(output, actual, rows)
    r, _ = selected_rows(output, ref, rows)
    diff = a - r
    per_row = row_rel_l2(diff, r)
    worst = labels[int(torch.nan_to_num(per_row, nan=math.inf).argmax())] if labels else None
    # rows above the global budget: the ones behind a global failure
    over = [labels[i] for i in (~(per_row <= max_rel_l2)).nonzero().flatten().tolist()]
    n = len(labels)
    return [
        summarize(output, "finite", (~torch.isfinite(a)).sum(dim=-1), 0.0, labels,
                  metric="non-finite values in actual row"),
        single(output, "rel_l2", rel_l2(diff, r), max_rel_l2, row=worst, failing_rows=over,
               n_checked=n, metric="||a-r||/||r|| over active rows"),
        summarize(output, "row_rel_l2", per_row, max_row_rel_l2, labels,
                  metric="||a_i-r_i||/||r_i|| per row"),
        single(output, "cosine", cosine(a, r), min_cosine, row=worst, relation=">=",
               failing_rows=over, n_checked=n, metric="cosine(a, r) over active rows"),
    ]
