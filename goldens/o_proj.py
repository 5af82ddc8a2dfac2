"""Grouped low-rank output projection golden and the TP partial reduction.

Rounding boundaries (brackets mark a BF16 cast):

* ``o = [inverse RoPE of each head's tail]`` BF16 ``[T, H, head_dim]`` (the rope slice is
  de-rotated with the conjugate at the token's own rows, undoing the query rotation)
* heads flatten to ``H * head_dim`` and split into ``o_groups`` groups of ``o_group_in``;
  ``latent_g = [o_g @ wo_a_g^T]`` with ``wo_a`` BF16 ``[o_groups, o_lora_rank,
  o_group_in]``, FP32 accumulation, ONE BF16 cast
* ``partial = MX(latent) @ wo_b^T`` kept in FP32 (``wo_b`` checkpoint FP8 ``[hidden,
  o_groups * o_lora_rank]``, group-32 partials, :func:`goldens.quant.mxfp8_linear`)
* ``out = [sum of the TP ranks' FP32 partials, in rank order]`` -- one BF16 cast after
  the sum (:func:`tp_reduce`).

Head TP: rank ``r`` owns output groups ``[r * G/tp, (r+1) * G/tp)``, which hold exactly
its heads ``[r * H/tp, ...)``; it needs the matching ``wo_a`` groups and the ``wo_b``
input columns ``[r * G/tp * o_lora_rank, +G/tp * o_lora_rank)``.  MXFP8 activation groups
of 32 never straddle a rank boundary, so the ranks' partials differ from the TP1 result
only by FP32 reassociation of the final sum.

Pure torch; imports nothing from ``v41`` or ``harness``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from goldens.config import MX_GROUP, V41Config, local_heads, local_o_groups
from goldens.quant import mxfp8_linear, quantize_fp8_weight
from goldens.rope import apply_rope_tail

__all__ = ["OWeights", "inverse_rope_heads", "grouped_output", "o_proj_partial", "tp_reduce",
           "o_proj", "local_wo_a", "local_wo_b", "random_o_weights"]


@dataclass(frozen=True)
class OWeights:
    """Output-projection weights: full tensors, or one rank's groups after :meth:`shard`."""

    wo_a: torch.Tensor  # BF16 [groups, o_lora_rank, o_group_in]
    wo_b: torch.Tensor  # E4M3 [hidden, groups * o_lora_rank]
    wo_b_scale: torch.Tensor  # uint8 E8M0 [hidden/32, groups * o_lora_rank / 32]

    def shard(self, config: V41Config, tp: int, tp_rank: int) -> "OWeights":
        wo_b, wo_b_scale = local_wo_b(self.wo_b, self.wo_b_scale, config, tp, tp_rank)
        return OWeights(local_wo_a(self.wo_a, config, tp, tp_rank), wo_b, wo_b_scale)


def _check_rank(tp: int, tp_rank: int) -> None:
    if not 0 <= tp_rank < tp:
        raise ValueError(f"tp_rank: {tp_rank} outside [0, {tp})")


def local_wo_a(wo_a: torch.Tensor, config: V41Config, tp: int, tp_rank: int) -> torch.Tensor:
    """``wo_a`` groups owned by ``tp_rank`` (from the full ``[o_groups, ...]`` tensor)."""
    want = (config.o_groups, config.o_lora_rank, config.o_group_in)
    if tuple(wo_a.shape) != want:
        raise ValueError(f"wo_a: shape {list(wo_a.shape)} must be the full {list(want)}")
    _check_rank(tp, tp_rank)
    lg = local_o_groups(config, tp)
    return wo_a[tp_rank * lg:(tp_rank + 1) * lg]


def local_wo_b(wo_b: torch.Tensor, wo_b_scale: torch.Tensor, config: V41Config, tp: int,
               tp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``wo_b`` input columns (and their 32x32 block scales) owned by ``tp_rank``."""
    full = config.o_groups * config.o_lora_rank
    if tuple(wo_b.shape) != (config.hidden_size, full):
        raise ValueError(f"wo_b: shape {list(wo_b.shape)} must be the full "
                         f"[{config.hidden_size}, {full}]")
    _check_rank(tp, tp_rank)
    width = local_o_groups(config, tp) * config.o_lora_rank
    c0 = tp_rank * width
    return (wo_b[:, c0:c0 + width],
            wo_b_scale[:, c0 // MX_GROUP:(c0 + width) // MX_GROUP])


def inverse_rope_heads(o: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """De-rotate the tail of every head of ``o`` BF16 ``[T, H, head_dim]`` -> BF16."""
    if o.dtype != torch.bfloat16 or o.dim() != 3:
        raise ValueError(f"o: must be bfloat16 [T, H, head_dim], got {o.dtype} {list(o.shape)}")
    return apply_rope_tail(o, cos, sin, inverse=True)


def grouped_output(o: torch.Tensor, wo_a: torch.Tensor, config: V41Config) -> torch.Tensor:
    """``latent = concat_g [o_g @ wo_a_g^T]`` -> BF16 ``[T, groups * o_lora_rank]``.

    ``o`` BF16 ``[T, heads, head_dim]`` (already de-rotated) covers exactly the ``groups``
    of ``wo_a`` (``heads * head_dim == groups * o_group_in``).  FP32 accumulation, one cast.
    """
    if wo_a.dtype != torch.bfloat16 or wo_a.dim() != 3 or \
            tuple(wo_a.shape[1:]) != (config.o_lora_rank, config.o_group_in):
        raise ValueError(f"wo_a: must be bfloat16 [groups, {config.o_lora_rank}, "
                         f"{config.o_group_in}], got {wo_a.dtype} {list(wo_a.shape)}")
    g = wo_a.shape[0]
    t = o.shape[0]
    if o.shape[1] * o.shape[2] != g * config.o_group_in:
        raise ValueError(f"o: {o.shape[1]} heads x {o.shape[2]} = {o.shape[1] * o.shape[2]} "
                         f"channels must equal {g} groups x {config.o_group_in}")
    grouped = o.reshape(t, g, config.o_group_in).float().transpose(0, 1)  # [g, T, in]
    latent = torch.bmm(grouped, wo_a.float().transpose(1, 2))  # [g, T, o_lora] FP32
    return latent.transpose(0, 1).reshape(t, g * config.o_lora_rank).to(torch.bfloat16)


def o_proj_partial(attn_out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   w_local: OWeights, config: V41Config) -> torch.Tensor:
    """One rank's FP32 ``[T, hidden]`` partial from its heads' attention output
    ``attn_out`` BF16 ``[T, H/tp, head_dim]`` and its sharded weights ``w_local``."""
    o = inverse_rope_heads(attn_out, cos, sin)
    latent = grouped_output(o, w_local.wo_a, config)
    return mxfp8_linear(latent, w_local.wo_b, w_local.wo_b_scale, out_dtype=torch.float32)


def tp_reduce(partials: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum FP32 partials in rank order (``((p0 + p1) + p2) + ...`` in FP32), then ONE cast
    to BF16 -- the all-reduce of the replicated wiring."""
    if not partials:
        raise ValueError("partials: need at least one rank's partial")
    shape = partials[0].shape
    acc = torch.zeros(shape, dtype=torch.float32)
    for r, p in enumerate(partials):
        if p.dtype != torch.float32 or p.shape != shape:
            raise ValueError(f"partials[{r}]: must be float32 {list(shape)}, got {p.dtype} "
                             f"{list(p.shape)}")
        acc += p
    return acc.to(torch.bfloat16)


def o_proj(attn_out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, w: OWeights,
           config: V41Config, tp: int = 1) -> torch.Tensor:
    """Full output projection BF16 ``[T, hidden]`` of all heads' ``attn_out`` BF16
    ``[T, H, head_dim]`` with full weights, as ``tp`` ranks compute and reduce it."""
    if attn_out.dim() != 3 or attn_out.shape[1] != config.num_heads:
        raise ValueError(f"attn_out: must be [T, {config.num_heads}, head_dim], got "
                         f"{list(attn_out.shape)}")
    lh = local_heads(config, tp)
    return tp_reduce([o_proj_partial(attn_out[:, r * lh:(r + 1) * lh], cos, sin,
                                     w.shard(config, tp, r), config) for r in range(tp)])


def random_o_weights(config: V41Config, generator: torch.Generator) -> OWeights:
    """Deterministic fixture weights: ``wo_a ~ N(0, 1/o_group_in)`` in BF16, ``wo_b ~
    N(0, 1/(groups * o_lora_rank))`` quantized to checkpoint FP8."""
    g, r, gi = config.o_groups, config.o_lora_rank, config.o_group_in
    wo_a = (torch.randn(g, r, gi, generator=generator) * gi ** -0.5).to(torch.bfloat16)
    wo_b = torch.randn(config.hidden_size, g * r, generator=generator) * (g * r) ** -0.5
    return OWeights(wo_a, *quantize_fp8_weight(wo_b))
