"""Paged sliding-window KV cache golden: MXFP8 publication and dequantized gather.

ABI (``goldens.quant.cache_abi``): payload ``[blocks, block_size, 1, head_dim]`` E4M3 and
scales ``[blocks, block_size, 1, head_dim / 32]`` uint8 E8M0.  A physical row id is
``block * block_size + offset`` (what ``ForwardMetadata.window_slots`` /
``window_indices`` hold).

* :func:`publish_window_kv` quantizes each token's rotated BF16 ``kv`` row (all
  ``head_dim`` channels, RoPE tail included, one E8M0 per 32) and writes it at its
  ``window_slots`` entry; a negative slot (padding, inactive token) writes nothing, and
  every other cache byte is left untouched.
* :func:`gather_window_kv` reads the rows named by ``window_indices`` and dequantizes them
  to FP32 (exact); ``-1`` entries give zero rows and ``valid = False``.

A layer publishes before it attends: a token's window includes its own row.
Pure torch; imports nothing from ``v41`` or ``harness``.
"""

from __future__ import annotations

import torch

from goldens.config import V41Config
from goldens.quant import cache_abi, dequantize_window_kv, quantize_window_kv

__all__ = ["empty_window_cache", "publish_window_kv", "gather_window_kv"]


def empty_window_cache(config: V41Config, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-filled ``(payload E4M3, scales uint8)`` window cache of ``num_blocks`` blocks."""
    abi = cache_abi(config, num_blocks)
    (ps, pd), (ss, sd) = abi["window_kv"], abi["window_kv_scale"]
    return torch.zeros(ps, dtype=pd), torch.zeros(ss, dtype=sd)


def _check_cache(payload: torch.Tensor, scales: torch.Tensor) -> tuple[int, int]:
    if payload.dtype != torch.float8_e4m3fn or payload.dim() != 4 or payload.shape[2] != 1:
        raise ValueError(f"payload: must be float8_e4m3fn [blocks, block_size, 1, head_dim], "
                         f"got {payload.dtype} {list(payload.shape)}")
    d = payload.shape[-1]
    if d % 32:
        raise ValueError(f"payload: head_dim {d} is not a multiple of the window group 32")
    want = (*payload.shape[:3], d // 32)
    if scales.dtype != torch.uint8 or tuple(scales.shape) != want:
        raise ValueError(f"scales: must be uint8 {list(want)}, got {scales.dtype} "
                         f"{list(scales.shape)}")
    return payload.shape[0] * payload.shape[1], d


def publish_window_kv(payload: torch.Tensor, scales: torch.Tensor, kv: torch.Tensor,
                      window_slots: torch.Tensor) -> None:
    """Quantize ``kv`` (BF16 ``[T, head_dim]``) and write row ``t`` at ``window_slots[t]``
    (INT64 ``[T]``) in place; negative slots are skipped.  Two valid tokens naming the same
    slot, or a slot past the cache, raise ``ValueError`` before anything is written."""
    rows, d = _check_cache(payload, scales)
    if kv.dtype != torch.bfloat16 or kv.dim() != 2 or kv.shape[1] != d:
        raise ValueError(f"kv: must be bfloat16 [T, {d}], got {kv.dtype} {list(kv.shape)}")
    if window_slots.dtype not in (torch.int64, torch.int32) or window_slots.shape != (kv.shape[0],):
        raise ValueError(f"window_slots: must be INT64 [{kv.shape[0]}], got "
                         f"{window_slots.dtype} {list(window_slots.shape)}")
    slots = window_slots.long()
    live = (slots >= 0).nonzero().flatten()
    if live.numel() == 0:
        return
    target = slots[live]
    if int(target.max()) >= rows:
        raise ValueError(f"window_slots: slot {int(target.max())} is past the cache "
                         f"({rows} rows)")
    if torch.unique(target).numel() != target.numel():
        raise ValueError("window_slots: two valid tokens publish to the same slot")
    q, s = quantize_window_kv(kv[live])
    payload.view(rows, d)[target] = q
    scales.view(rows, d // 32)[target] = s


def gather_window_kv(payload: torch.Tensor, scales: torch.Tensor,
                     window_indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows FP32 [T, W, head_dim], valid bool [T, W])`` for INT32 ``window_indices``
    ``[T, W]``; ``-1`` gives a zero row and ``valid = False``; other negatives or ids past
    the cache raise ``ValueError``."""
    rows, d = _check_cache(payload, scales)
    if window_indices.dtype not in (torch.int32, torch.int64) or window_indices.dim() != 2:
        raise ValueError(f"window_indices: must be INT32 [T, W], got {window_indices.dtype} "
                         f"{list(window_indices.shape)}")
    idx = window_indices.long()
    if idx.numel() and (int(idx.min()) < -1 or int(idx.max()) >= rows):
        raise ValueError(f"window_indices: values must be -1 or in [0, {rows}), got "
                         f"[{int(idx.min())}, {int(idx.max())}]")
    valid = idx >= 0
    safe = idx.clamp(min=0).flatten()
    vals = dequantize_window_kv(payload.view(rows, d)[safe], scales.view(rows, d // 32)[safe])
    vals = vals.view(*idx.shape, d)
    return vals.masked_fill(~valid[..., None], 0.0), valid
