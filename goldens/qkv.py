"""Q / KV projection golden: MQA-shaped MLA with one shared latent KV (K = V).

Rounding boundaries (brackets mark a BF16 cast):

* ``qr = RMSNorm([MX(x) @ wq_a^T], q_norm)`` -> [BF16] ``[T, q_lora_rank]``
* ``q  = [MX(qr) @ wq_b^T]`` viewed ``[T, heads, head_dim]``, RoPE on the tail
  ``rope_dim`` of every head -> [BF16]
* ``kv = RMSNorm([MX(x) @ wkv^T], kv_norm)`` -> [BF16] ``[T, head_dim]``, RoPE on its tail
  -> [BF16]

``MX(.) @ W^T`` is :func:`goldens.quant.mxfp8_linear`: group-32 MXFP8 activations against
the checkpoint FP8 weight (output-major ``[N, K]`` E4M3, one E8M0 per 32x32 block),
group partials accumulated in FP32, ONE BF16 cast.  RMSNorm runs in FP32 and casts once.
V4.1 has no per-head query RMS rescale (the V4 ``q *= rsqrt(mean(q^2))`` step is absent).

Head tensor parallelism: ``wq_a``, ``wkv`` and both norms are replicated; a TP rank owns
the contiguous head range ``[rank * H/tp, (rank+1) * H/tp)``, i.e. the ``wq_b`` output rows
``[rank * H/tp * head_dim, +H/tp * head_dim)`` (and the matching block-scale rows).

Pure torch; imports nothing from ``v41`` or ``harness``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from goldens.config import MX_GROUP, V41Config, local_heads
from goldens.quant import mxfp8_linear, quantize_fp8_weight
from goldens.rope import apply_rope_tail

__all__ = ["QKVWeights", "rms_norm_bf16", "q_lora", "q_proj_rope", "kv_proj_rope",
           "qkv_proj_rope", "local_wq_b", "random_qkv_weights"]

try:  # the shared norm golden, when present, is the single source of RMSNorm
    from goldens.norm import rms_norm as _shared_rms_norm  # type: ignore
except ImportError:  # pragma: no cover - depends on a sibling module landing
    _shared_rms_norm = None


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``(x * rsqrt(mean(x^2) + eps) * w)`` in FP32, cast once to ``x.dtype``."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def rms_norm_bf16(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the attention goldens (FP32 math, one cast to ``x.dtype``)."""
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight: shape {tuple(weight.shape)} must be ({x.shape[-1]},)")
    if _shared_rms_norm is not None:
        return _shared_rms_norm(x, weight, eps)
    return _rms_norm(x, weight, eps)


@dataclass(frozen=True)
class QKVWeights:
    """Checkpoint-layout Q/KV weights.  ``wq_b`` may be the full tensor or a rank's rows
    (``heads`` says how many heads it carries)."""

    wq_a: torch.Tensor  # E4M3 [q_lora_rank, hidden]
    wq_a_scale: torch.Tensor  # uint8 E8M0 [q_lora_rank/32, hidden/32]
    q_norm: torch.Tensor  # FP32 [q_lora_rank]
    wq_b: torch.Tensor  # E4M3 [heads * head_dim, q_lora_rank]
    wq_b_scale: torch.Tensor  # uint8 E8M0 [heads * head_dim / 32, q_lora_rank / 32]
    wkv: torch.Tensor  # E4M3 [head_dim, hidden]
    wkv_scale: torch.Tensor  # uint8 E8M0 [head_dim/32, hidden/32]
    kv_norm: torch.Tensor  # FP32 [head_dim]

    def heads(self, config: V41Config) -> int:
        return self.wq_b.shape[0] // config.head_dim

    def shard(self, config: V41Config, tp: int, tp_rank: int) -> "QKVWeights":
        """This rank's weights: ``wq_b`` rows of its heads, everything else replicated."""
        wq_b, wq_b_scale = local_wq_b(self.wq_b, self.wq_b_scale, config, tp, tp_rank)
        return QKVWeights(self.wq_a, self.wq_a_scale, self.q_norm, wq_b, wq_b_scale,
                          self.wkv, self.wkv_scale, self.kv_norm)


def local_wq_b(wq_b: torch.Tensor, wq_b_scale: torch.Tensor, config: V41Config, tp: int,
               tp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the full ``wq_b`` (and its 32x32 block scales) owned by ``tp_rank``."""
    full = config.num_heads * config.head_dim
    if wq_b.shape[0] != full:
        raise ValueError(f"wq_b: {wq_b.shape[0]} rows, expected the full {full} "
                         f"(num_heads * head_dim) before sharding")
    if not 0 <= tp_rank < tp:
        raise ValueError(f"tp_rank: {tp_rank} outside [0, {tp})")
    rows = local_heads(config, tp) * config.head_dim
    if rows % MX_GROUP:
        raise ValueError(f"local wq_b rows {rows} are not a multiple of the 32-row scale block")
    r0 = tp_rank * rows
    return wq_b[r0:r0 + rows], wq_b_scale[r0 // MX_GROUP:(r0 + rows) // MX_GROUP]


def _check_rope_rows(cos: torch.Tensor, sin: torch.Tensor, t: int, config: V41Config) -> None:
    want = (t, config.rope_dim // 2)
    for name, v in (("cos", cos), ("sin", sin)):
        if v.dtype != torch.float32 or tuple(v.shape) != want:
            raise ValueError(f"{name}: must be float32 {list(want)} rope rows, got {v.dtype} "
                             f"{list(v.shape)}")


def _check_x(x: torch.Tensor, width: int, name: str = "x") -> None:
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != width:
        raise ValueError(f"{name}: must be bfloat16 [T, {width}], got {x.dtype} "
                         f"{list(x.shape)}")


def q_lora(x: torch.Tensor, w: QKVWeights, config: V41Config) -> torch.Tensor:
    """``qr = RMSNorm([MX(x) @ wq_a^T], q_norm)`` -> BF16 ``[T, q_lora_rank]``."""
    _check_x(x, config.hidden_size)
    return rms_norm_bf16(mxfp8_linear(x, w.wq_a, w.wq_a_scale), w.q_norm, config.rms_norm_eps)


def q_proj_rope(qr: torch.Tensor, wq_b: torch.Tensor, wq_b_scale: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor, config: V41Config) -> torch.Tensor:
    """``q = [MX(qr) @ wq_b^T]`` -> BF16 ``[T, heads, head_dim]`` with the tail of every
    head rotated at the token rows ``cos/sin`` (FP32 ``[T, rope_dim/2]``).  ``wq_b`` carries
    the heads to compute (all, or one rank's rows from :func:`local_wq_b`)."""
    _check_x(qr, config.q_lora_rank, "qr")
    _check_rope_rows(cos, sin, qr.shape[0], config)
    if wq_b.shape[0] % config.head_dim:
        raise ValueError(f"wq_b: {wq_b.shape[0]} rows is not a multiple of head_dim "
                         f"{config.head_dim}")
    q = mxfp8_linear(qr, wq_b, wq_b_scale).view(qr.shape[0], -1, config.head_dim)
    return apply_rope_tail(q, cos, sin)


def kv_proj_rope(x: torch.Tensor, w: QKVWeights, cos: torch.Tensor, sin: torch.Tensor,
                 config: V41Config) -> torch.Tensor:
    """``kv = RoPE(RMSNorm([MX(x) @ wkv^T], kv_norm))`` -> BF16 ``[T, head_dim]``."""
    _check_x(x, config.hidden_size)
    _check_rope_rows(cos, sin, x.shape[0], config)
    kv = rms_norm_bf16(mxfp8_linear(x, w.wkv, w.wkv_scale), w.kv_norm, config.rms_norm_eps)
    return apply_rope_tail(kv, cos, sin)


def qkv_proj_rope(x: torch.Tensor, w: QKVWeights, cos: torch.Tensor, sin: torch.Tensor,
                  config: V41Config, tp: int = 1,
                  tp_rank: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q [T, H/tp, head_dim], kv [T, head_dim], qr [T, q_lora_rank])``, all BF16.

    ``w`` holds the full ``wq_b``; the rank's heads are sliced here.  ``qr`` is returned
    because the lightning indexer's query projection consumes it."""
    qr = q_lora(x, w, config)
    wq_b, wq_b_scale = local_wq_b(w.wq_b, w.wq_b_scale, config, tp, tp_rank)
    q = q_proj_rope(qr, wq_b, wq_b_scale, cos, sin, config)
    return q, kv_proj_rope(x, w, cos, sin, config), qr


def random_qkv_weights(config: V41Config, generator: torch.Generator) -> QKVWeights:
    """Deterministic fixture weights with unit-RMS outputs (``N(0, 1/K)`` before FP8)."""

    def fp8(n: int, k: int):
        w = torch.randn(n, k, generator=generator) * k ** -0.5
        return quantize_fp8_weight(w)

    def norm(n: int):
        return 1.0 + 0.1 * torch.randn(n, generator=generator)

    d, ql, hd = config.hidden_size, config.q_lora_rank, config.head_dim
    wq_a, wq_a_s = fp8(ql, d)
    wq_b, wq_b_s = fp8(config.num_heads * hd, ql)
    wkv, wkv_s = fp8(hd, d)
    return QKVWeights(wq_a, wq_a_s, norm(ql), wq_b, wq_b_s, wkv, wkv_s, norm(hd))
