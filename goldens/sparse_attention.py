"""Sparse attention golden with the per-head attention sink.

For token ``t`` and head ``h`` over the token's selected latent rows ``k_j`` (window rows
and Top-K compressed rows; invalid rows excluded, i.e. logit ``-inf``)::

    l_j  = (q_th . k_j) * head_dim^-0.5                    (FP32)
    m    = max(max_j l_j, sink_h)
    den  = exp(sink_h - m) + sum_j exp(l_j - m)            (sink: denominator only)
    o_th = sum_j exp(l_j - m) * k_j / den                  (V = the same latent rows)

cast once to BF16.  One softmax over all parts: splitting the keys into window and
compressed parts and merging their (max, sum) statistics is the same value up to FP32
reassociation.  A token with no valid key gives exactly 0 (the sink alone makes
``den = 1`` and the numerator is empty); a ``+inf`` sink also gives 0 and a ``-inf`` sink
is no sink.

Decision: probabilities stay FP32 for P.V.  The device/official kernels cast each 64-key
(C1A prefill: 32-key) tile's probabilities to BF16 before P.V with a running max; that
tiling-dependent rounding is a kernel property the validation tolerance absorbs, not part
of this golden's math.

Heads and query tokens are processed in chunks (``query_chunk``, ``head_chunk``) so the
FP32 logits stay small at FLASH shapes; the caller's gathered ``[T, K, head_dim]`` rows
dominate memory.  Pure torch; imports nothing from ``v41`` or ``harness``.
"""

from __future__ import annotations

import torch

from goldens.quant import dequantize_compressed_kv

__all__ = ["sparse_attention", "gather_compressed_kv", "concat_kv_parts"]


def sparse_attention(q: torch.Tensor, kv: torch.Tensor, valid: torch.Tensor,
                     attn_sink: torch.Tensor, *, softmax_scale: float | None = None,
                     query_chunk: int = 64, head_chunk: int = 16) -> torch.Tensor:
    """Attention output BF16 ``[T, H, D]``.

    ``q`` BF16/FP32 ``[T, H, D]`` (rotated queries of the heads to compute); ``kv`` FP32
    (or BF16) ``[T, K, D]`` the token's gathered latent rows; ``valid`` bool ``[T, K]``;
    ``attn_sink`` FP32 ``[H]`` (the same heads as ``q``); ``softmax_scale`` defaults to
    ``D^-0.5``.  Invalid rows never contribute, whatever their contents.
    """
    if q.dim() != 3 or kv.dim() != 3:
        raise ValueError(f"q, kv: must be 3-D [T, H, D] and [T, K, D], got {list(q.shape)} "
                         f"and {list(kv.shape)}")
    t, h, d = q.shape
    if kv.shape[0] != t or kv.shape[2] != d:
        raise ValueError(f"kv: shape {list(kv.shape)} must be [{t}, K, {d}]")
    if valid.dtype != torch.bool or tuple(valid.shape) != tuple(kv.shape[:2]):
        raise ValueError(f"valid: must be bool {list(kv.shape[:2])}, got {valid.dtype} "
                         f"{list(valid.shape)}")
    if attn_sink.shape != (h,):
        raise ValueError(f"attn_sink: shape {list(attn_sink.shape)} must be [{h}]")
    sink = attn_sink.float()
    if bool(torch.isnan(sink).any()):
        raise ValueError("attn_sink: contains NaN")
    if query_chunk < 1 or head_chunk < 1:
        raise ValueError(f"query_chunk, head_chunk: must be >= 1, got {query_chunk}, {head_chunk}")
    scale = d ** -0.5 if softmax_scale is None else float(softmax_scale)
    out = torch.empty(t, h, d, dtype=torch.bfloat16)
    for t0 in range(0, t, query_chunk):
        ts = slice(t0, min(t, t0 + query_chunk))
        # invalid rows are zeroed so a NaN/Inf in an unused cache row cannot leak via 0*x
        v = kv[ts].float().masked_fill(~valid[ts, :, None], 0.0)  # [tc, K, D]
        mask = valid[ts][:, None, :]  # [tc, 1, K]
        for h0 in range(0, h, head_chunk):
            hs = slice(h0, min(h, h0 + head_chunk))
            logits = torch.bmm(q[ts, hs].float(), v.transpose(1, 2)) * scale  # [tc, hc, K]
            logits = logits.masked_fill(~mask, float("-inf"))
            s = sink[hs][None, :]  # [1, hc]
            m = torch.maximum(logits.amax(dim=-1) if logits.shape[-1] else
                              torch.full(logits.shape[:2], float("-inf")), s)
            m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            p = torch.exp(logits - m_safe[..., None])  # masked -> 0
            den = p.sum(dim=-1) + torch.exp(s - m_safe)
            o = torch.bmm(p, v) / den[..., None]
            # no valid key and no finite sink (den == 0), or a +inf sink: output is zero
            dead = (den == 0) | torch.isposinf(s).expand_as(den)
            out[ts, hs] = o.masked_fill(dead[..., None], 0.0).to(torch.bfloat16)
    return out


def concat_kv_parts(*parts: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate ``(rows [T, K_i, D], valid [T, K_i])`` parts (window, compressed) along
    the key dim, the order of the key set the golden attends to."""
    if not parts:
        raise ValueError("parts: need at least one (rows, valid) part")
    return (torch.cat([p[0].float() for p in parts], dim=1),
            torch.cat([p[1] for p in parts], dim=1))


def gather_compressed_kv(packed: torch.Tensor, scales: torch.Tensor,
                         indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantized compressed-cache rows for physical flattened row ids ``indices`` INT32
    ``[T, K]`` (-1 padded, e.g. the indexer's Top-K output): ``(rows FP32 [T, K, head_dim],
    valid bool [T, K])``.  Cache ABI: packed E2M1 uint8 ``[blocks, bs, 1, head_dim/2]`` and
    E4M3 ``[blocks, bs, 1, head_dim/16]`` scales (see ``goldens.quant``)."""
    if packed.dtype != torch.uint8 or packed.dim() != 4:
        raise ValueError(f"packed: must be uint8 [blocks, bs, 1, head_dim/2], got "
                         f"{packed.dtype} {list(packed.shape)}")
    rows = packed.shape[0] * packed.shape[1]
    half, gs = packed.shape[-1], scales.shape[-1]
    idx = indices.long()
    if idx.dim() != 2:
        raise ValueError(f"indices: must be [T, K], got {list(indices.shape)}")
    if idx.numel() and (int(idx.min()) < -1 or int(idx.max()) >= rows):
        raise ValueError(f"indices: values must be -1 or in [0, {rows}), got "
                         f"[{int(idx.min())}, {int(idx.max())}]")
    valid = idx >= 0
    safe = idx.clamp(min=0).flatten()
    vals = dequantize_compressed_kv(packed.reshape(rows, half)[safe], scales.reshape(rows, gs)[safe])
    vals = vals.view(*idx.shape, 2 * half)
    return vals.masked_fill(~valid[..., None], 0.0), valid
