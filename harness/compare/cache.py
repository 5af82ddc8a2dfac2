"""Cache comparators: ownership (exact bytes), published quantized rows, the state ring.

Contract: a kernel may write only the rows/slots it owns; every other byte of every
cache tensor (payload and scales, any dtype including FP8/E8M0/packed FP4 in uint8)
must be unchanged.  Published rows are compared dequantized, relative L2 <= 1 % for
MXFP8 and <= 4 % for MXFP4 (FP4 codes may move by one step).  The compressor state ring
(FP32) must match the reference at written slots and be byte-identical elsewhere.
"""

from __future__ import annotations

import numpy as np
import torch

from harness.compare._common import (
    as_rows,
    changed_elements,
    rel_l2,
    require_same_shape,
    row_labels,
    row_mask,
    row_rel_l2,
    selected_rows,
)
from harness.verdict import Verdict, single, summarize

MXFP8_CACHE_MAX_REL_L2 = 0.01
MXFP4_CACHE_MAX_REL_L2 = 0.04
STATE_MAX_REL_L2 = 0.005  # the reference's compare_state: updated state relative L2 <= 0.5 %


def check_non_owned_bytes(output: str, actual: torch.Tensor, ref: torch.Tensor, owned=None) -> list[Verdict]:
    """Every element outside the ``owned`` rows (slots over the leading dims, see
    ``harness.compare._common``) must have the same stored bytes in ``actual`` and
    ``ref`` (the reference cache after the call, or the cache before it).  Verdict
    ``exact_bytes``: measured = changed elements, bound 0, row = slot of the first change;
    the detail gives the first changed flat element index and the count."""
    changed = changed_elements(output, actual, ref)
    per_row = as_rows(changed.reshape(actual.shape) if actual.dim() else changed, torch.int64)
    skip = row_mask(output, owned, per_row.shape[0]) if owned is not None else np.zeros(per_row.shape[0], bool)
    per_row[torch.from_numpy(skip)] = 0
    bad_rows = per_row.sum(dim=-1).nonzero().flatten().numpy()
    labels = row_labels(bad_rows, ())  # slot numbers
    flat = per_row.reshape(-1).nonzero().flatten()
    first = int(flat[0]) if flat.numel() else None
    row = labels[0] if labels else None
    note = (f"first changed flat index {first} (row {row}, {actual.dtype}); "
            f"{flat.numel()} changed elements in {len(labels)} non-owned rows") if first is not None else \
        f"all {int((~torch.from_numpy(skip)).sum())} non-owned rows byte-identical"
    return [single(output, "exact_bytes", float(flat.numel()), 0.0, row=row, failing_rows=labels,
                   n_checked=int((~skip).sum()), metric="changed elements outside owned rows", note=note)]


def check_dequantized_rows(
    output: str,
    actual_rows: torch.Tensor,
    ref_rows: torch.Tensor,
    *,
    max_rel_l2: float,
    max_row_rel_l2: float | None = None,
    rows=None,
) -> list[Verdict]:
    """Published cache rows compared after dequantization: verdicts ``finite`` and
    ``cache_rel_l2`` (over all selected rows, ``<= max_rel_l2``; pass
    ``MXFP8_CACHE_MAX_REL_L2`` or ``MXFP4_CACHE_MAX_REL_L2``).  The global verdict names
    the row with the largest relative error; ``max_row_rel_l2`` adds ``cache_row_rel_l2``."""
    require_same_shape(output, actual_rows, ref_rows)
    a, labels = selected_rows(output, actual_rows, rows)
    r, _ = selected_rows(output, ref_rows, rows)
    per_row = row_rel_l2(a - r, r)
    worst = labels[int(torch.nan_to_num(per_row, nan=torch.inf).argmax())] if labels else None
    over = [labels[i] for i in (~(per_row <= max_rel_l2)).nonzero().flatten().tolist()]
    verdicts = [
        summarize(output, "finite", (~torch.isfinite(a)).sum(dim=-1), 0.0, labels,
                  metric="non-finite dequantized values"),
        single(output, "cache_rel_l2", rel_l2(a - r, r), max_rel_l2, row=worst, failing_rows=over,
               n_checked=len(labels), metric="||a-r||/||r|| over published rows (dequantized)"),
    ]
    if max_row_rel_l2 is not None:
        verdicts.append(summarize(output, "cache_row_rel_l2", per_row, max_row_rel_l2, labels,
                                  metric="||a_i-r_i||/||r_i|| per published row (dequantized)"))
    return verdicts


def check_state_ring(
    output: str,
    actual: torch.Tensor,
    ref: torch.Tensor,
    slots,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
) -> list[Verdict]:
    """Compressor state ring ``[blocks, capacity, 2*head_dim]`` FP32.  Written ``slots``
    (ring rows ``block*capacity + p % capacity``, mask or indices) must satisfy
    ``|a - r| <= atol + rtol*|r|`` elementwise (exact by default; NaN fails): verdict
    ``state_rows`` with measured ``max(|a-r| - rtol*|r|)`` per slot and bound ``atol``.
    Every other slot must be byte-identical (``exact_bytes``)."""
    require_same_shape(output, actual, ref)
    a, labels = selected_rows(output, actual, slots, flat_labels=True)
    r, _ = selected_rows(output, ref, slots)
    excess = ((a - r).abs() - rtol * r.abs()).amax(dim=-1) if a.shape[-1] else torch.zeros(a.shape[0])
    return [
        summarize(output, "state_rows", excess, atol, labels,
                  metric=f"max(|a-r| - {rtol:g}*|r|) at written ring slots"),
        *check_non_owned_bytes(output, actual, ref, owned=slots),
    ]


def check_state_rel_l2(
    output: str,
    actual: torch.Tensor,
    ref: torch.Tensor,
    slots,
    *,
    max_rel_l2: float = STATE_MAX_REL_L2,
) -> list[Verdict]:
    """Compressor state ring ``[blocks, capacity, 2*head_dim]`` FP32 under the reference's
    state budget (``compare_state``: updated state relative L2 <= 0.5 %), applied to EACH
    written slot on its own: verdicts ``finite`` and ``state_row_rel_l2``
    (``||a_s - r_s|| / ||r_s||`` per slot ``s``).  Every other slot byte-identical
    (``exact_bytes``).  For a ring whose writer saw a different input than the golden
    (an upstream rounding); a ring written from the golden's own input is held to
    :func:`check_state_ring`'s elementwise bound instead."""
    require_same_shape(output, actual, ref)
    a, labels = selected_rows(output, actual, slots, flat_labels=True)
    r, _ = selected_rows(output, ref, slots)
    return [
        summarize(output, "finite", (~torch.isfinite(a)).sum(dim=-1), 0.0, labels,
                  metric="non-finite values at written ring slots"),
        summarize(output, "state_row_rel_l2", row_rel_l2(a - r, r), max_rel_l2, labels,
                  metric="||a_s-r_s||/||r_s|| per written ring slot"),
        *check_non_owned_bytes(output, actual, ref, owned=slots),
    ]
