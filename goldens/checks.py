"""Input checks shared by the goldens: every failure is a ValueError naming the field,
the offending value and the bound, raised before any work or write."""

from __future__ import annotations

import torch


def fail(msg: str):
    raise ValueError(msg)


def check_tensor(name: str, t, dtypes, shape) -> None:
    """``t`` is a tensor of one of ``dtypes`` whose shape matches ``shape`` (None = any)."""
    if not isinstance(t, torch.Tensor):
        fail(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    dtypes = dtypes if isinstance(dtypes, tuple) else (dtypes,)
    if t.dtype not in dtypes:
        fail(f"{name}: dtype {t.dtype}, expected {' or '.join(str(d) for d in dtypes)}")
    if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        fail(f"{name}: shape {list(t.shape)}, expected {want}")


def check_query_starts(qsl: list[int]) -> None:
    """Packed query starts begin at 0 and never decrease (equal neighbours: empty request)."""
    if qsl[0] != 0:
        fail(f"query_start_loc: query_start_loc[0] = {qsl[0]}, expected 0")
    for r in range(len(qsl) - 1):
        if qsl[r + 1] < qsl[r]:
            fail(f"query_start_loc: decreases at request {r}: query_start_loc[{r + 1}] = "
                 f"{qsl[r + 1]} < query_start_loc[{r}] = {qsl[r]} (must be nondecreasing)")
