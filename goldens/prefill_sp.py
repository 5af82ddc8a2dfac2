"""Prefill sequence-parallel (SP) Attention site: the mHC residual boundary kept token-sharded.

One DP group of ``tp`` ranks runs one Attention site of ``layer`` with its residual lanes
split into contiguous token shards (the contract's "prefill_swa.py keeps mHC residuals
token-sharded across TP ranks" paragraphs):

* every rank holds a physical slab of ``T_local = ceil(T / tp)`` rows (equal on every rank,
  empty ranks included), ``T = metadata.num_padded_tokens``; the group-global valid count
  ``num_tokens`` gives rank ``r`` ``max(0, min(T_local, num_tokens - r * T_local))`` active
  rows (:func:`goldens.config.rank_slab`), the rest of its slab is inactive;
* per rank, on its active rows only: :func:`goldens.mhc.hc_mixes` of the local lanes, the
  collapse :func:`goldens.mhc.hc_pre` with the rank's slab of the INCOMING pre-mix, the
  input RMSNorm (``attn_norm``);
* all-gather of the BF16 normalized slabs to the ``[T, D]`` attention input in token order
  (:func:`goldens.tp.all_gather_slabs`; rows at or past ``num_tokens`` are zero, so padding
  never becomes a valid token);
* the mode's half-layer on the gathered input (:func:`goldens.modes.attention_half_layer`,
  sharded wiring: per-rank FP32 output-projection partials, reduce-scatter = rank-ordered
  FP32 sum and ONE BF16 cast, back to the local slabs); metadata, RoPE rows, slots, Top-K
  rows and caches stay in the full gathered token order;
* per rank, local :func:`goldens.mhc.hc_post` with the rank's own mixes.

Outputs per rank: ``x_hc_out`` FP32 ``[T_local, hc, D]`` (BF16 values), ``attn_output`` BF16
``[T_local, D]`` and ``next_pre_mix`` FP32 ``[T_local, hc]`` (this site's ``pre``, the next
site's incoming pre-mix); every inactive row of all three is exactly zero.  There is no
residual all-gather and no extra TP sum at the exit: the local slabs feed the next SP site
directly.  The arithmetic of every active row is the replicated composition's (the mHC
goldens are batch-invariant, the two wirings of the half-layer agree exactly).

A DP group whose ``num_tokens`` is 0 is idle: it skips the whole sublayer (no mixes, no
attention, no cache byte or scratch entry touched) and returns all-zero slabs.
:func:`prefill_sp_dp` runs several DP groups (``--dp-tokens`` style counts, one per group),
each with its own metadata and caches.

Validation names the field and the bound and runs for every group before any work, so a
refused call changes no cache byte.  Pure torch: imports nothing from ``v41`` or ``harness``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from goldens.checks import check_tensor, fail
from goldens.config import SUPPORTED_TP_SIZES, V41Config, rank_slab, slab_width
from goldens.forward import AttentionSiteWeights
from goldens.mhc import hc_mixes, hc_post, hc_pre
from goldens.modes import (ForwardBatch, ModeAux, ModelCaches, RopeTables, _validate,
                           attention_half_layer)
from goldens.norm import rms_norm
from goldens.tp import all_gather_slabs

__all__ = ["SpGroupInputs", "SpGroupResult", "local_active_rows", "prefill_sp_site",
           "prefill_sp_dp"]


@dataclass
class SpGroupInputs:
    """One DP group's inputs: per-rank residual slabs ``x_hc[r]`` FP32 ``[T_local, hc, D]``
    and incoming pre-mix slabs ``incoming_pre[r]`` FP32 ``[T_local, hc]`` (``len == tp``),
    the group's full-token-order ``batch`` and its ``caches`` (updated in place)."""

    x_hc: Sequence[torch.Tensor]
    incoming_pre: Sequence[torch.Tensor]
    batch: ForwardBatch
    caches: ModelCaches


@dataclass(frozen=True)
class SpGroupResult:
    """One DP group's outputs, lists indexed by TP rank (inactive rows exactly zero).

    ``attn_input``: the gathered BF16 ``[T, D]`` attention input (rows at or past
    ``num_tokens`` zero); ``aux``: the half-layer's :class:`goldens.modes.ModeAux`, None for
    an idle group; ``num_tokens``: the group-global valid count."""

    x_hc_out: list[torch.Tensor]
    attn_output: list[torch.Tensor]
    next_pre_mix: list[torch.Tensor]
    attn_input: torch.Tensor
    aux: ModeAux | None
    num_tokens: int


def local_active_rows(num_tokens: int, tokens: int, tp: int, tp_rank: int) -> int:
    """Active rows of rank ``tp_rank``: ``max(0, min(T_local, num_tokens - tp_rank *
    T_local))`` with ``T_local = ceil(tokens / tp)``."""
    return rank_slab(num_tokens, tp, tp_rank, tokens)[1]


# ---- validation ------------------------------------------------------------------------------

def _group_count(num_tokens, tp: int, name: str) -> int:
    """The group-global count: an int, or one entry per TP rank that must all agree."""
    if isinstance(num_tokens, (list, tuple)):
        if len(num_tokens) != tp:
            fail(f"{name}: {len(num_tokens)} per-rank counts, expected one per TP rank ({tp})")
        for r, n in enumerate(num_tokens):
            if n != num_tokens[0]:
                fail(f"{name}[{r}]: {n!r} != {name}[0] = {num_tokens[0]!r}; TP peers of a DP "
                     f"group must agree on one group-global count (and on whether it is idle)")
        num_tokens = num_tokens[0] if num_tokens else None
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int):
        fail(f"{name}: expected an int group-global valid count, got {num_tokens!r}")
    return num_tokens


def _check_positions(md, n: int, name: str) -> None:
    """Positions are consecutive inside every request chunk of the valid prefix."""
    qsl = md.query_start_loc.tolist()
    pos = md.position_ids.tolist()
    for r in range(len(qsl) - 1):
        for t in range(max(qsl[r], 0) + 1, min(qsl[r + 1], n)):
            if pos[t] != pos[t - 1] + 1:
                fail(f"{name}.position_ids[{t}]: {pos[t]}, expected {pos[t - 1] + 1} "
                     f"(positions must be consecutive inside request {r}'s chunk)")


def _validate_group(config: V41Config, layer: int, g: SpGroupInputs, num_tokens,
                    weights: AttentionSiteWeights, rope: RopeTables, tp: int,
                    name: str, count_name: str) -> int:
    """Every check before any work; returns the group-global count."""
    if not isinstance(g, SpGroupInputs):
        fail(f"{name}: expected SpGroupInputs, got {type(g).__name__}")
    if not isinstance(g.batch, ForwardBatch):
        fail(f"{name}.batch: expected a ForwardBatch, got {type(g.batch).__name__}")
    if not isinstance(g.caches, ModelCaches):
        fail(f"{name}.caches: expected ModelCaches, got {type(g.caches).__name__}")
    md = g.batch.metadata
    T = md.num_padded_tokens
    n = _group_count(num_tokens, tp, count_name)
    if not 0 <= n <= T:
        fail(f"{count_name}: {n} outside [0, T={T}] (T = {name}.batch.metadata"
             f".num_padded_tokens)")
    if n != md.num_tokens:
        fail(f"{count_name}: {n} must equal {name}.batch.metadata.num_tokens "
             f"(= query_start_loc[-1]) = {md.num_tokens}")
    width = slab_width(T, tp)
    hc, d = config.hc.hc_mult, config.hidden_size
    for field, slabs, shape in (("x_hc", g.x_hc, (hc, d)), ("incoming_pre", g.incoming_pre, (hc,))):
        if not isinstance(slabs, (list, tuple)) or len(slabs) != tp:
            fail(f"{name}.{field}: expected a list of one slab per TP rank ({tp}), got "
                 f"{len(slabs) if isinstance(slabs, (list, tuple)) else type(slabs).__name__}")
        for r, s in enumerate(slabs):
            check_tensor(f"{name}.{field}[{r}]", s, torch.float32, (None, *shape))
            if s.shape[0] != width:
                fail(f"{name}.{field}[{r}]: {s.shape[0]} rows, every rank's slab must hold "
                     f"T_local = ceil(T/tp) = ceil({T}/{tp}) = {width} rows (equal physical "
                     f"shard capacity, empty ranks included)")
    _check_positions(md, n, f"{name}.batch.metadata")
    if n:  # an idle group runs nothing, so nothing of the half-layer is checked
        x_probe = torch.zeros(T, d, dtype=torch.bfloat16)
        _validate(config, config.layer_config(layer), x_probe, weights.attention, g.caches,
                  g.batch, rope, tp, "sharded", n)
    return n


def _validate_common(config: V41Config, layer: int, weights, tp: int) -> None:
    if isinstance(tp, bool) or tp not in SUPPORTED_TP_SIZES:
        fail(f"tp: {tp!r} is not one of {SUPPORTED_TP_SIZES}")
    if not isinstance(layer, int) or not 0 <= layer < config.num_layers:
        fail(f"layer: {layer!r} outside [0, {config.num_layers})")
    if not isinstance(weights, AttentionSiteWeights):
        fail(f"weights: expected AttentionSiteWeights, got {type(weights).__name__}")
    check_tensor("weights.norm", weights.norm, (torch.float32, torch.bfloat16),
                 (config.hidden_size,))
    floats = (torch.float32, torch.bfloat16)
    for field, shape in (("fn", (config.mix_hc, config.hc_dim)), ("scale", (3,)),
                         ("base", (config.mix_hc,))):
        check_tensor(f"weights.hc.{field}", getattr(weights.hc, field, None), floats, shape)


# ---- the site --------------------------------------------------------------------------------

def _run_group(config: V41Config, layer: int, g: SpGroupInputs, n: int,
               weights: AttentionSiteWeights, rope: RopeTables, tp: int) -> SpGroupResult:
    T = g.batch.tokens
    width = slab_width(T, tp)
    hc, d = config.hc.hc_mult, config.hidden_size
    x_out = [torch.zeros(width, hc, d) for _ in range(tp)]
    att = [torch.zeros(width, d, dtype=torch.bfloat16) for _ in range(tp)]
    pre_out = [torch.zeros(width, hc) for _ in range(tp)]
    if n == 0:  # idle group: the whole sublayer is skipped
        return SpGroupResult(x_out, att, pre_out, torch.zeros(T, d, dtype=torch.bfloat16),
                             None, 0)
    counts = [local_active_rows(n, T, tp, r) for r in range(tp)]
    norm_slabs, mixes = [], []
    for r in range(tp):  # local mHC pre + attn_norm on the active rows
        slab = torch.zeros(width, d, dtype=torch.bfloat16)
        m = None
        if counts[r]:
            x = g.x_hc[r][:counts[r]]
            m = hc_mixes(x, weights.hc, config)
            collapsed = hc_pre(x, g.incoming_pre[r][:counts[r]], config)
            slab[:counts[r]] = rms_norm(collapsed, weights.norm, config.rms_norm_eps)
        norm_slabs.append(slab)
        mixes.append(m)
    attn_input = all_gather_slabs(norm_slabs, T, n)
    slabs, _, aux = attention_half_layer(config, layer, attn_input, weights.attention, g.caches,
                                         g.batch, rope, tp=tp, wiring="sharded", active=n)
    for r in range(tp):  # local mHC post
        c = counts[r]
        if not c:
            continue
        m = mixes[r]
        att[r][:c] = slabs[r][:c]
        x_out[r][:c] = hc_post(att[r][:c], g.x_hc[r][:c], m.post, m.comb, config)
        pre_out[r][:c] = m.pre
    return SpGroupResult(x_out, att, pre_out, attn_input, aux, n)


def prefill_sp_site(config: V41Config, layer: int, inputs: SpGroupInputs, num_tokens,
                    weights: AttentionSiteWeights, rope: RopeTables, *,
                    tp: int) -> SpGroupResult:
    """One DP group's SP Attention site of ``layer`` (see the module docstring).

    ``num_tokens``: the group-global valid count (an int, or one entry per TP rank, which
    must agree); it must equal ``inputs.batch.metadata.num_tokens``.  ``inputs.caches`` is
    updated in place (only what the layer's mode owns; nothing when the group is idle).
    Raises :class:`ValueError` naming the field and bound before any work."""
    _validate_common(config, layer, weights, tp)
    n = _validate_group(config, layer, inputs, num_tokens, weights, rope, tp, "inputs",
                        "num_tokens")
    return _run_group(config, layer, inputs, n, weights, rope, tp)


def prefill_sp_dp(config: V41Config, layer: int, groups: Sequence[SpGroupInputs],
                  dp_tokens: Sequence, weights: AttentionSiteWeights, rope: RopeTables, *,
                  tp: int) -> list[SpGroupResult]:
    """Every DP group's SP site: ``dp_tokens[g]`` is group ``g``'s group-global count (the
    ``--dp-tokens`` list); groups are independent (own metadata, own caches).  All groups
    are validated before any group runs; idle groups (count 0) touch nothing."""
    _validate_common(config, layer, weights, tp)
    if not isinstance(groups, (list, tuple)) or not groups:
        fail("groups: expected a non-empty list of SpGroupInputs, one per DP group")
    if not isinstance(dp_tokens, (list, tuple)) or len(dp_tokens) != len(groups):
        fail(f"dp_tokens: {len(dp_tokens) if isinstance(dp_tokens, (list, tuple)) else dp_tokens!r}"
             f" counts for {len(groups)} DP groups; give one count per DP group")
    seen: dict[int, int] = {}
    for i, g in enumerate(groups):
        if isinstance(g, SpGroupInputs):
            if id(g.caches) in seen:
                fail(f"groups[{i}].caches: the same ModelCaches object as groups"
                     f"[{seen[id(g.caches)]}]; every DP group owns its caches")
            seen[id(g.caches)] = i
    counts = [_validate_group(config, layer, g, dp_tokens[i], weights, rope, tp, f"groups[{i}]",
                              f"dp_tokens[{i}]") for i, g in enumerate(groups)]
    return [_run_group(config, layer, g, n, weights, rope, tp) for g, n in zip(groups, counts)]
