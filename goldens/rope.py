"""RoPE golden: profile tables, row materialization, adjacent-pair rotation.

V4.1 keeps FP32 half-width tables ``[capacity, rope_dim // 2]`` and rotates adjacent
pairs (x[2i], x[2i+1]) of the last ``rope_dim`` channels.  Ratio-0 layers use the base
profile (theta 10000, no YaRN); every rotation in a compressed layer uses the compressed
profile (theta 160000 with YaRN factor 16 over the original 65536 positions).
"""

from __future__ import annotations

import math

import torch

from goldens.config import V41Config


def rope_frequencies(config: V41Config, compressed: bool) -> torch.Tensor:
    """FP32 ``[rope_dim // 2]`` inverse frequencies of one profile.

    ``freq_i = base^(-2i/rope_dim)``; the compressed profile blends ``freq/factor`` and
    ``freq`` with the YaRN ramp between ``floor(corr(beta_fast))`` and
    ``ceil(corr(beta_slow))``, ``corr(r) = dim*ln(orig/(2*pi*r)) / (2*ln base)``.
    No attention-temperature (mscale) term exists in V4.1.
    """
    r = config.rope
    dim = r.rope_dim
    base = r.compress_theta if compressed else r.theta
    idx = torch.arange(0, dim, 2, dtype=torch.float32)
    freqs = 1.0 / (base ** (idx / dim))
    if not compressed:
        return freqs
    low, high = yarn_ramp_bounds(config)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
    return freqs / r.factor * ramp + freqs * (1 - ramp)


def yarn_ramp_bounds(config: V41Config) -> tuple[int, int]:
    """(low, high) frequency indices of the compressed profile's YaRN ramp."""
    r = config.rope
    dim, base = r.rope_dim, r.compress_theta

    def corr(rot: float) -> float:
        return dim * math.log(r.original_max_position / (rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr(r.beta_fast)), 0)
    high = min(math.ceil(corr(r.beta_slow)), dim - 1)
    return low, high


def precompute_rope_tables(config: V41Config, compressed: bool,
                           capacity: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 ``(cos, sin)`` tables ``[capacity, rope_dim // 2]`` for positions 0..capacity-1.

    Angles are ``outer(position, freq)`` in FP32, as the reference computes them.
    ``capacity`` defaults to ``config.rope.max_position``.
    """
    capacity = config.rope.max_position if capacity is None else capacity
    if not 1 <= capacity <= config.rope.max_position:
        raise ValueError(f"capacity: {capacity} outside [1, max_position={config.rope.max_position}]")
    freqs = rope_frequencies(config, compressed)
    angles = torch.outer(torch.arange(capacity, dtype=torch.float32), freqs)
    return torch.cos(angles), torch.sin(angles)


def materialize_rope_rows(freqs_cos: torch.Tensor, freqs_sin: torch.Tensor,
                          position_ids: torch.Tensor, num_tokens: int,
                          rope_cos: torch.Tensor, rope_sin: torch.Tensor) -> None:
    """Write table rows for the active tokens into caller-owned FP32 row buffers.

    Rows ``t < num_tokens`` receive ``freqs[position_ids[t]]``, or identity rotation
    (cos 1, sin 0) for a negative position.  Rows ``t >= num_tokens`` are left untouched,
    and ``num_tokens == 0`` touches nothing.  Every argument is validated before any
    write: a position at or past table capacity raises ``ValueError``.
    """
    if freqs_cos.dtype != torch.float32 or freqs_sin.dtype != torch.float32:
        raise ValueError(f"freqs_cos/freqs_sin: dtype must be float32, got "
                         f"{freqs_cos.dtype}/{freqs_sin.dtype}")
    if freqs_cos.dim() != 2 or freqs_cos.shape != freqs_sin.shape:
        raise ValueError(f"freqs_cos/freqs_sin: must share a 2-D shape [capacity, half], got "
                         f"{tuple(freqs_cos.shape)} and {tuple(freqs_sin.shape)}")
    if position_ids.dtype != torch.int32 or position_ids.dim() != 1:
        raise ValueError(f"position_ids: must be INT32 [T], got {position_ids.dtype} "
                         f"{tuple(position_ids.shape)}")
    t_cap = position_ids.shape[0]
    capacity, half = freqs_cos.shape
    for name, buf in (("rope_cos", rope_cos), ("rope_sin", rope_sin)):
        if buf.dtype != torch.float32 or tuple(buf.shape) != (t_cap, half):
            raise ValueError(f"{name}: must be float32 [{t_cap}, {half}], got {buf.dtype} "
                             f"{tuple(buf.shape)}")
    if not 0 <= num_tokens <= t_cap:
        raise ValueError(f"num_tokens: {num_tokens} outside [0, T={t_cap}]")
    if num_tokens == 0:
        return
    pos = position_ids[:num_tokens].long()
    too_far = (pos >= capacity).nonzero()
    if too_far.numel():
        t = int(too_far[0, 0])
        raise ValueError(f"position_ids[{t}]: {int(pos[t])} is at or past table capacity {capacity}")
    valid = pos >= 0
    safe = pos.clamp(min=0)
    rope_cos[:num_tokens] = torch.where(valid[:, None], freqs_cos[safe], 1.0)
    rope_sin[:num_tokens] = torch.where(valid[:, None], freqs_sin[safe], 0.0)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 inverse: bool = False) -> torch.Tensor:
    """Adjacent-pair rotation of the whole last dim of ``x`` (width ``2 * half``).

    ``(re, im) -> (re*c - im*s, im*c + re*s)``; ``inverse`` negates ``sin``.  ``cos`` and
    ``sin`` are ``[T, half]`` and broadcast over any dims between T and the last.
    Computed in FP32, then cast to ``x.dtype`` [the BF16 boundary for activations].
    """
    half = x.shape[-1] // 2
    if x.shape[-1] != 2 * half or cos.shape[-1] != half or cos.shape != sin.shape:
        raise ValueError(f"x: last dim {x.shape[-1]} must be 2 * cos width {cos.shape[-1]}")
    c = cos.float().reshape(cos.shape[0], *([1] * (x.dim() - 2)), half)
    s = sin.float().reshape(sin.shape[0], *([1] * (x.dim() - 2)), half)
    if inverse:
        s = -s
    pairs = x.float().unflatten(-1, (half, 2))
    re, im = pairs[..., 0], pairs[..., 1]
    out = torch.stack((re * c - im * s, im * c + re * s), dim=-1).flatten(-2)
    return out.to(x.dtype)


def apply_rope_tail(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    inverse: bool = False) -> torch.Tensor:
    """Rotate the last ``2 * cos.shape[-1]`` channels of ``x``; the NoPE head stays as is.

    Returns a new tensor in ``x.dtype`` [BF16 boundary on the rotated tail].
    """
    rd = 2 * cos.shape[-1]
    if x.shape[-1] < rd:
        raise ValueError(f"x: last dim {x.shape[-1]} is narrower than rope width {rd}")
    out = x.clone()
    out[..., -rd:] = rotate_pairs(x[..., -rd:], cos, sin, inverse)
    return out
