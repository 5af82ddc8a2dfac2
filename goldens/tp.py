"""Decode Attention TP semantics: head parallelism and the two output wirings.

Head TP (first implementation): every rank sees the same ``T`` token rows.  ``wq_a``,
``wkv``, the norms and the single-head window / compressed caches are replicated; ``wq_b``
rows, query heads, ``attn_sink`` entries, ``wo_a`` groups and ``wo_b`` input columns are
sharded (:meth:`AttentionWeights.shard`).  Each rank produces an FP32 ``[T, hidden]``
partial of its heads (:func:`attention_rank_partial`).  The replicated parts (KV
projection, window publication, gather) are computed once here and shared by the ranks:
every rank would compute identical bytes.

Two wirings of that partial:

* **replicated** (:func:`replicated_wiring`) -- every rank holds the full normalized input
  ``[T, hidden]``; the partials are all-reduced: summed in rank order in FP32, ONE BF16 cast
  (:func:`goldens.o_proj.tp_reduce`).  Every rank ends with the same ``[T, hidden]``.
* **sharded** (:func:`sharded_wiring`) -- sequence parallel.  Rank ``r`` owns the fixed
  physical slab of rows ``[r * width, (r+1) * width)`` with ``width = ceil(capacity / TP)``
  (``goldens.config.slab_width``; never ``ceil(active / TP)``).  Each rank contributes its
  slab of the normalized input (rows at or past ``active`` are zero), an all-gather builds
  the ``[capacity, hidden]`` attention input (rows ``>= active`` zero), every rank runs the
  leaf on all rows, and a reduce-scatter sums the owned rows' FP32 partials in rank order,
  casts once to BF16 and zeroes the slab rows at or past ``active`` (including physical rows
  past ``capacity`` when ``TP * width > capacity``).

Reserved-capacity batches (``active < capacity``): padding rows carry ``window_slots = -1``
and all ``-1`` window indices in the metadata, so they publish nothing and attend to
nothing; both wirings return zero for them here, and the active rows of the two wirings
agree exactly (same per-row arithmetic, same rank-order sum).

Pure torch; imports nothing from ``v41`` or ``harness``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from goldens.config import V41Config, local_heads, rank_slab, slab_width
from goldens.o_proj import OWeights, o_proj_partial, random_o_weights, tp_reduce
from goldens.qkv import QKVWeights, kv_proj_rope, q_lora, q_proj_rope, random_qkv_weights
from goldens.sparse_attention import concat_kv_parts, sparse_attention
from goldens.window_cache import gather_window_kv, publish_window_kv

__all__ = ["AttentionWeights", "AttentionBatch", "random_attention_weights", "attention_keys",
           "attention_rank_partial", "replicated_wiring", "shard_rows", "all_gather_slabs",
           "reduce_scatter", "sharded_wiring", "unshard_rows", "decode_attention"]

PartialFn = Callable[[torch.Tensor, int], torch.Tensor]


# ---- weights and batch ---------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionWeights:
    """One layer's Attention weights (full, or one rank's shard)."""

    qkv: QKVWeights
    o: OWeights
    attn_sink: torch.Tensor  # FP32 [heads]

    def shard(self, config: V41Config, tp: int, tp_rank: int) -> "AttentionWeights":
        if self.attn_sink.shape != (config.num_heads,):
            raise ValueError(f"attn_sink: shape {list(self.attn_sink.shape)} must be the full "
                             f"[{config.num_heads}] before sharding")
        lh = local_heads(config, tp)
        return AttentionWeights(self.qkv.shard(config, tp, tp_rank),
                                self.o.shard(config, tp, tp_rank),
                                self.attn_sink[tp_rank * lh:(tp_rank + 1) * lh])


def random_attention_weights(config: V41Config, seed: int = 0) -> AttentionWeights:
    """Deterministic full fixture weights (``attn_sink ~ N(0, 1)``)."""
    g = torch.Generator().manual_seed(seed)
    qkv = random_qkv_weights(config, g)
    o = random_o_weights(config, g)
    return AttentionWeights(qkv, o, torch.randn(config.num_heads, generator=g))


@dataclass
class AttentionBatch:
    """Per-forward inputs of one Attention layer; ``window_payload``/``window_scales`` are
    the layer's window cache (updated in place by publication)."""

    rope_cos: torch.Tensor  # FP32 [T, rope_dim/2], the layer's profile at position_ids
    rope_sin: torch.Tensor
    window_slots: torch.Tensor  # INT64 [T], -1 on padding
    window_indices: torch.Tensor  # INT32 [T, sliding_window], -1 padded
    window_payload: torch.Tensor  # E4M3 [blocks, block_size, 1, head_dim]
    window_scales: torch.Tensor  # uint8 [blocks, block_size, 1, head_dim/32]
    # gathered compressed rows (FP32 [T, K, head_dim], bool [T, K]) or None for SWA
    compressed: tuple[torch.Tensor, torch.Tensor] | None = field(default=None)


# ---- the leaf ------------------------------------------------------------------------------

def attention_keys(x: torch.Tensor, w: AttentionWeights, batch: AttentionBatch,
                   config: V41Config) -> tuple[torch.Tensor, torch.Tensor]:
    """Replicated part: ``kv`` of every row, published at ``window_slots`` (in place), then
    the window rows (and the supplied compressed rows) each token attends to."""
    kv = kv_proj_rope(x, w.qkv, batch.rope_cos, batch.rope_sin, config)
    publish_window_kv(batch.window_payload, batch.window_scales, kv, batch.window_slots)
    parts = [gather_window_kv(batch.window_payload, batch.window_scales, batch.window_indices)]
    if batch.compressed is not None:
        parts.append(batch.compressed)
    return concat_kv_parts(*parts)


def attention_rank_partial(x: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor,
                           w_local: AttentionWeights, batch: AttentionBatch,
                           config: V41Config, qr: torch.Tensor | None = None) -> torch.Tensor:
    """One rank's FP32 ``[T, hidden]`` partial: its heads' queries, sparse attention with
    their sinks, inverse RoPE, its output groups.  ``w_local`` is a shard; ``qr`` (the
    replicated ``q_lora`` output, identical on every rank) is computed when not given."""
    if qr is None:
        qr = q_lora(x, w_local.qkv, config)
    q = q_proj_rope(qr, w_local.qkv.wq_b, w_local.qkv.wq_b_scale, batch.rope_cos,
                    batch.rope_sin, config)
    o = sparse_attention(q, keys, valid, w_local.attn_sink)
    return o_proj_partial(o, batch.rope_cos, batch.rope_sin, w_local.o, config)


# ---- collectives ---------------------------------------------------------------------------

def _check_active(active: int | None, capacity: int) -> int:
    active = capacity if active is None else active
    if not 0 <= active <= capacity:
        raise ValueError(f"active: {active} outside [0, capacity={capacity}]")
    return active


def replicated_wiring(x: torch.Tensor, partial_fn: PartialFn, tp: int,
                      active: int | None = None) -> torch.Tensor:
    """All-reduce wiring: ``tp_reduce([partial_fn(x, r) for r in ranks])`` BF16
    ``[T, hidden]``; rows at or past ``active`` are zero."""
    active = _check_active(active, x.shape[0])
    out = tp_reduce([partial_fn(x, r) for r in range(tp)])
    out[active:] = 0
    return out


def shard_rows(x: torch.Tensor, tp: int, active: int | None = None) -> list[torch.Tensor]:
    """Rank slabs ``[width, ...]`` of ``x`` (``width = ceil(len(x) / tp)``): rank ``r`` gets
    rows ``[r * width, +width)``; rows at or past ``active`` (or past ``len(x)``) are zero."""
    capacity = x.shape[0]
    active = _check_active(active, capacity)
    width = slab_width(capacity, tp)
    slabs = []
    for r in range(tp):
        first, count = rank_slab(active, tp, r, capacity)
        slab = torch.zeros(width, *x.shape[1:], dtype=x.dtype)
        slab[:count] = x[first:first + count]
        slabs.append(slab)
    return slabs


def all_gather_slabs(slabs: Sequence[torch.Tensor], capacity: int,
                     active: int | None = None) -> torch.Tensor:
    """``[capacity, ...]`` from the ranks' slabs in rank order; rows ``>= active`` zero."""
    active = _check_active(active, capacity)
    tp = len(slabs)
    width = slab_width(capacity, tp)
    for r, s in enumerate(slabs):
        if s.shape[0] != width:
            raise ValueError(f"slabs[{r}]: {s.shape[0]} rows, every slab must be ceil("
                             f"{capacity}/{tp}) = {width}")
    out = torch.cat(list(slabs), dim=0)[:capacity].clone()
    out[active:] = 0
    return out


def reduce_scatter(partials: Sequence[torch.Tensor], active: int | None = None) -> list[torch.Tensor]:
    """Each rank's BF16 slab ``[width, hidden]``: its owned rows of the rank-order FP32 sum of
    ``partials`` (FP32 ``[capacity, hidden]`` each), one BF16 cast; inactive rows zero."""
    if not partials:
        raise ValueError("partials: need at least one rank's partial")
    tp = len(partials)
    capacity = partials[0].shape[0]
    active = _check_active(active, capacity)
    width = slab_width(capacity, tp)
    out = []
    for r in range(tp):
        first, count = rank_slab(active, tp, r, capacity)
        slab = torch.zeros(width, *partials[0].shape[1:], dtype=torch.bfloat16)
        if count:
            slab[:count] = tp_reduce([p[first:first + count] for p in partials])
        out.append(slab)
    return out


def sharded_wiring(slabs: Sequence[torch.Tensor], partial_fn: PartialFn, capacity: int,
                   active: int | None = None) -> list[torch.Tensor]:
    """Sequence-parallel wiring: all-gather the normalized-input slabs, ``partial_fn`` on all
    ``capacity`` rows per rank, reduce-scatter.  Returns each rank's BF16 output slab."""
    x = all_gather_slabs(slabs, capacity, active)
    return reduce_scatter([partial_fn(x, r) for r in range(len(slabs))], active)


def unshard_rows(slabs: Sequence[torch.Tensor], capacity: int) -> torch.Tensor:
    """Concatenate rank slabs and drop physical rows past ``capacity`` (for comparisons)."""
    return torch.cat(list(slabs), dim=0)[:capacity]


# ---- composition ---------------------------------------------------------------------------

def decode_attention(x: torch.Tensor, w: AttentionWeights, batch: AttentionBatch,
                     config: V41Config, tp: int, wiring: str, active: int | None = None,
                     ranks: Sequence[int] | None = None):
    """One decode Attention half-layer (after the input RMSNorm) under ``wiring``.

    ``x`` BF16 ``[capacity, hidden]`` normalized input; ``w`` full weights; ``batch`` is
    updated in place (window publication).  ``"replicated"`` returns BF16 ``[capacity,
    hidden]``; ``"sharded"`` returns the ranks' BF16 ``[width, hidden]`` slabs.  ``ranks``
    restricts the computed ranks (the others contribute zero partials) -- only for memory
    experiments at FLASH shapes; the result is then a partial sum.
    """
    capacity = x.shape[0]
    active = _check_active(active, capacity)
    compute = set(range(tp) if ranks is None else ranks)
    shards = {r: w.shard(config, tp, r) for r in compute}
    cache: dict = {}

    def partial_fn(xg: torch.Tensor, r: int) -> torch.Tensor:
        if r not in compute:
            return torch.zeros(capacity, config.hidden_size)
        if "keys" not in cache:  # replicated part: computed once, identical on every rank
            cache["keys"] = attention_keys(xg, w, batch, config)
            cache["qr"] = q_lora(xg, w.qkv, config)
        keys, valid = cache["keys"]
        return attention_rank_partial(xg, keys, valid, shards[r], batch, config, cache["qr"])

    if wiring == "replicated":
        return replicated_wiring(x, partial_fn, tp, active)
    if wiring == "sharded":
        return sharded_wiring(shard_rows(x, tp, active), partial_fn, capacity, active)
    raise ValueError(f"wiring: {wiring!r} is not 'replicated' or 'sharded'")
