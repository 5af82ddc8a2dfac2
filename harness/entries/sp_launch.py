"""What each TP rank of a prefill sequence-parallel group is handed, and the host's checks
of it before any launch (the contract's SP refusals).

Per DP group ``g`` the inputs of a ``prefill_<mode>`` case carry, beside the batch tables:

* ``g{g}.meta.sp_tokens`` INT32 ``[tp]``: the group-global valid count each rank received
  (TP peers must agree: on the count, and so on whether the group is idle);
* ``g{g}.meta.sp_capacity`` INT32 ``[tp]``: each rank's physical residual slab rows (equal
  for every rank: ``T_local = ceil(T / tp)``, empty ranks included);
* ``g{g}.meta.position_ids`` INT32 ``[T]``: the serving layer's positions; inside every
  request chunk they continue the request's cached prefix one by one
  (``kv_seq_lens[r] + i``), padding rows are ``-1``.

:func:`check_group` raises ValueError naming the field, the index and the bound; the SUT
runs it for every group before its first launch, so a refused case changes no byte.
"""

from __future__ import annotations

import torch

from goldens.config import slab_width

_I32 = torch.int32


def group_meta(case, g: int, position_ids: torch.Tensor) -> dict:
    """The three per-group tensors of a well-formed case (see the module doc)."""
    tp, n = case.tp, case.group_active(g)
    return {f"g{g}.meta.sp_tokens": torch.full((tp,), n, dtype=_I32),
            f"g{g}.meta.sp_capacity": torch.full((tp,), slab_width(case.tokens, tp), dtype=_I32),
            f"g{g}.meta.position_ids": position_ids.to(_I32).clone()}


def _vector(inputs: dict, key: str, length: int) -> list[int]:
    t = inputs.get(key)
    if not isinstance(t, torch.Tensor) or t.dtype != _I32 or tuple(t.shape) != (length,):
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else repr(t)
        raise ValueError(f"{key}: must be INT32 [{length}], got {got}")
    return t.tolist()


def check_group(inputs: dict, g: int, tp: int, tokens: int, query_start_loc: torch.Tensor,
                kv_seq_lens: torch.Tensor) -> int:
    """Group ``g``'s valid count after every check of the module doc; raises ValueError
    naming the field and the bound."""
    p = f"g{g}.meta."
    width = slab_width(tokens, tp)
    for r, cap in enumerate(_vector(inputs, p + "sp_capacity", tp)):
        if cap != width:
            raise ValueError(f"{p}sp_capacity[{r}]: {cap} rows; every TP rank's slab must hold "
                             f"T_local = ceil(T/tp) = ceil({tokens}/{tp}) = {width} rows "
                             f"(equal physical shard capacity inside a TP group)")
    counts = _vector(inputs, p + "sp_tokens", tp)
    for r, n in enumerate(counts):
        if (n == 0) != (counts[0] == 0):
            raise ValueError(f"{p}sp_tokens[{r}]: {n} while {p}sp_tokens[0] is {counts[0]}: TP "
                             f"peers of DP group {g} disagree on whether the group is idle")
        if n != counts[0]:
            raise ValueError(f"{p}sp_tokens[{r}]: {n} != {p}sp_tokens[0] = {counts[0]}; TP "
                             f"peers must agree on one group-global valid count")
    n = counts[0]
    qsl = query_start_loc.tolist()
    if not 0 <= n <= tokens:
        raise ValueError(f"{p}sp_tokens: {n} outside [0, T={tokens}]")
    if n != qsl[-1]:
        raise ValueError(f"{p}sp_tokens: {n} must equal the group's packed rows "
                         f"query_start_loc[-1] = {qsl[-1]}")
    pos = _vector(inputs, p + "position_ids", tokens)
    kv = kv_seq_lens.tolist()
    for r in range(len(qsl) - 1):
        for t in range(qsl[r], qsl[r + 1]):
            want = kv[r] + t - qsl[r]
            if pos[t] != want:
                raise ValueError(f"{p}position_ids[{t}]: {pos[t]}, expected {want} (positions "
                                 f"inside request {r}'s chunk continue its prefix "
                                 f"kv_seq_lens[{r}] = {kv[r]} one by one)")
    for t in range(n, tokens):
        if pos[t] != -1:
            raise ValueError(f"{p}position_ids[{t}]: {pos[t]} on a padding row (>= {n}); "
                             f"expected -1")
    return n
