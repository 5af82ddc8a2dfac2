"""Shared plumbing for comparators: rows, row selections, labels, byte views.

A *row* is one slice along the last dim: a tensor of shape ``[*lead, D]`` has
``prod(lead)`` rows, numbered in row-major order (for a paged cache
``[blocks, 128, 1, W]`` the row number is the physical slot ``block*128 + pos``).
A row selection is ``None`` (all rows), a ``slice`` of row numbers, a bool mask with
one entry per row (any shape, e.g. ``lead``), or integer row numbers; negative numbers
are skipped like ``-1`` slots.  Labels are ints, or tuples over ``lead`` when it has
more than one dim.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from harness.verdict import RowLabel


def require_same_shape(output: str, actual: torch.Tensor, ref: torch.Tensor, what: str = "reference") -> None:
    if tuple(actual.shape) != tuple(ref.shape):
        raise ValueError(
            f"{output}: actual shape {tuple(actual.shape)} != {what} shape {tuple(ref.shape)}"
        )


def lead_shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape[:-1]) if t.dim() > 0 else ()


def as_rows(t: torch.Tensor, dtype: torch.dtype | None = torch.float64) -> torch.Tensor:
    """``t`` as ``[rows, D]`` (cast to ``dtype`` unless None)."""
    t = t.detach().cpu()
    if dtype is not None:
        t = t.to(dtype)
    d = t.shape[-1] if t.dim() > 0 else 1
    return t.reshape(-1, d)


def row_mask(output: str, rows, n_rows: int) -> np.ndarray:
    """Bool mask over the ``n_rows`` rows for a selection (see module doc)."""
    if rows is None:
        return np.ones(n_rows, dtype=bool)
    if isinstance(rows, slice):
        mask = np.zeros(n_rows, dtype=bool)
        mask[rows] = True
        return mask
    arr = rows.detach().cpu().numpy() if isinstance(rows, torch.Tensor) else np.asarray(rows)
    if arr.dtype == bool:
        if arr.size != n_rows:
            raise ValueError(f"{output}: row mask has {arr.size} entries but the tensor has {n_rows} rows")
        return arr.reshape(-1).copy()
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{output}: row selection must be bool or integer, got {arr.dtype}")
    idx = arr.reshape(-1).astype(np.int64)
    idx = idx[idx >= 0]
    if idx.size and idx.max() >= n_rows:
        raise ValueError(f"{output}: row {int(idx.max())} out of range for {n_rows} rows")
    mask = np.zeros(n_rows, dtype=bool)
    mask[idx] = True
    return mask


def row_labels(flat: np.ndarray, lead: tuple[int, ...]) -> list[RowLabel]:
    flat = np.asarray(flat, dtype=np.int64).reshape(-1)
    if len(lead) <= 1:
        return [int(i) for i in flat]
    coords = np.unravel_index(flat, lead)
    return [tuple(int(c[k]) for c in coords) for k in range(flat.size)]


def row_label(flat: int, lead: tuple[int, ...]) -> RowLabel:
    return row_labels(np.array([flat]), lead)[0]


def element_bytes(t: torch.Tensor) -> torch.Tensor:
    """The stored bytes of ``t`` as ``[numel, itemsize]`` uint8 (any dtype, incl. FP8)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).reshape(flat.numel(), t.element_size())


def changed_elements(output: str, actual: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Bool ``[numel]``: elements whose stored bytes differ.  Shape and dtype must match."""
    require_same_shape(output, actual, ref)
    if actual.dtype != ref.dtype:
        raise ValueError(f"{output}: actual dtype {actual.dtype} != reference dtype {ref.dtype}")
    return (element_bytes(actual) != element_bytes(ref)).any(dim=1)


def rel_l2(diff: torch.Tensor, ref: torch.Tensor) -> float:
    """``||diff|| / ||ref||`` in float64; 0 when both are zero, inf when only ref is."""
    num = float(torch.linalg.vector_norm(diff.to(torch.float64)))
    den = float(torch.linalg.vector_norm(ref.to(torch.float64)))
    if den == 0.0:
        return 0.0 if num == 0.0 else (math.nan if math.isnan(num) else math.inf)
    return num / den


def row_rel_l2(diff: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-row ``||diff_i|| / ||ref_i||`` with the same zero conventions as :func:`rel_l2`."""
    num = torch.linalg.vector_norm(diff, dim=-1)
    den = torch.linalg.vector_norm(ref, dim=-1)
    out = num / den
    zero_ref = den == 0
    out[zero_ref & (num == 0)] = 0.0
    out[zero_ref & (num > 0)] = math.inf
    return out


def selected_rows(output: str, t: torch.Tensor, rows, dtype: torch.dtype | None = torch.float64,
                  flat_labels: bool = False):
    """``(rows of t chosen by the selection as [n, D], their labels)``; ``flat_labels``
    labels rows by row number (cache slots) instead of leading-dim tuples."""
    flat = as_rows(t, dtype)
    idx = row_mask(output, rows, flat.shape[0]).nonzero()[0]
    return flat[torch.from_numpy(idx)], row_labels(idx, () if flat_labels else lead_shape(t))
