"""MoE experts golden: routed MXFP4 experts one at a time, MXFP8 shared expert, EP partials.

Input ``x`` is the FFN site's BF16 RMSNorm output ``[T, D]``; ``indices INT32 [T, k]`` and
``weights FP32 [T, k]`` come from :func:`goldens.router.route`.

Expert math (SwiGLU with clamps, ``limit = cfg.moe.swiglu_limit``), rounding boundaries in
brackets::

    a   = MX(x)                                  MXFP8 activation, upward E8M0 scale, group 32
    g   = [BF16](a @ W1^T)    u = [BF16](a @ W3^T)        FP64 accumulation, one rounding
                                                          to FP32, one BF16 cast
    g   = clamp(g, max=limit) u = clamp(u, -limit, limit) FP32
    h   = [BF16](silu(g) * u * route_weight)              FP32 (silu: FP64, one rounding);
                                                          weight applied BEFORE W2
    y   = [BF16](MX(h) @ W2^T)                            re-quantized MXFP8, FP64
                                                          accumulation, one rounding to FP32
    out = [BF16](shared_y + routed_sum)                   routed_sum FP32, see below

The shared expert is the same SwiGLU without a route weight, with checkpoint MXFP8 weights
(``[N, K]`` E4M3, one E8M0 per 32x32 block) through :func:`goldens.quant.mxfp8_linear`
(per-K-group FP32 partials).  Routed experts carry packed MXFP4 weights (``[N, K/2]`` uint8,
element 2i in the low nibble, one E8M0 per 32 input columns ``[N, K/32]``); their operands are
dequantized exactly (FP4 * 2^e and E4M3 * 2^e are exact in FP32; the weights are built
directly in FP64, which holds the same values) and contracted with FP64 accumulation and ONE
rounding to FP32 (:func:`goldens.exact.matmul_fp32`), then the [BF16] cast above.  A routed
product of a token therefore does not depend on which other tokens chose the same expert
(batch-invariant), and the FP32 value is the FP32-accumulation reference with the
summation order removed.

Memory: routed experts are dequantized ONE AT A TIME.  The loop visits experts in ascending
index, skips experts without tokens (their weights are never even fetched), gathers the
expert's tokens, and adds each BF16 expert output into the FP32 ``routed_sum`` row of its
token.  ``routed_sum`` therefore accumulates, per token, in ascending expert index order.
An EP rank's partial is the same loop restricted to its contiguous local experts
``[rank*L, (rank+1)*L)``; partials combined in rank order reproduce the whole sum.

``experts`` arguments are anything indexable by expert id returning :class:`ExpertWeights`
(a list, a dict, or a lazy object that builds or loads one expert on demand).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, Sequence

import torch

from goldens.config import MX_GROUP, V41Config, local_experts
from goldens.exact import matmul_fp32, silu_fp32
from goldens.quant import (FP4_E2M1_VALUES, E8M0_NAN, dequantize_fp4_expert_weight,
                           dequantize_mxfp8, e8m0_decode, mxfp8_linear, quantize_fp4_expert_weight,
                           quantize_fp8_weight, quantize_mxfp8_activation)


class ExpertWeights(NamedTuple):
    """One expert's checkpoint tensors, output-major: W1/W3 ``[I, D]``, W2 ``[D, I]``.

    Routed: payloads packed uint8 ``[N, K/2]``, scales uint8 E8M0 ``[N, K/32]``.
    Shared: payloads float8_e4m3fn ``[N, K]``, scales uint8 E8M0 ``[N/32, K/32]``.
    """

    w1: torch.Tensor
    w1_scale: torch.Tensor
    w3: torch.Tensor
    w3_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor


class ExpertLookup(Protocol):
    def __getitem__(self, expert: int) -> ExpertWeights: ...


# ---- weight helpers ------------------------------------------------------------------------

def quantize_routed_expert(w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> ExpertWeights:
    """Packed MXFP4 checkpoint tensors of one routed expert from float weights."""
    return ExpertWeights(*quantize_fp4_expert_weight(w1), *quantize_fp4_expert_weight(w3),
                         *quantize_fp4_expert_weight(w2))


def quantize_shared_expert(w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> ExpertWeights:
    """MXFP8 (32x32-block E8M0) checkpoint tensors of the shared expert from float weights."""
    return ExpertWeights(*quantize_fp8_weight(w1), *quantize_fp8_weight(w3),
                         *quantize_fp8_weight(w2))


_FP4_SCALED_LUTS: dict[torch.dtype, torch.Tensor] = {}
_DEQUANT_DTYPES = (torch.float32, torch.float64)


def _fp4_scaled_lut(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[255*256, 2]`` of ``dtype`` (FP32 or FP64): row ``code*256 + byte`` = the two E2M1
    values of ``byte`` (low nibble first) times ``2^(code-127)``; every entry is exact in FP32
    (the FP64 table holds the same values)."""
    lut = _FP4_SCALED_LUTS.get(dtype)
    if lut is None:
        vals = torch.tensor(FP4_E2M1_VALUES, dtype=torch.float32)
        b = torch.arange(256)
        pair = torch.stack((vals[b & 15], vals[b >> 4]), dim=-1)
        scales = e8m0_decode(torch.arange(E8M0_NAN, dtype=torch.uint8))
        lut = (scales[:, None, None] * pair[None]).reshape(-1, 2).to(dtype)
        _FP4_SCALED_LUTS[dtype] = lut
    return lut


def _check_fp4(packed: torch.Tensor, scales: torch.Tensor) -> tuple[int, int, int]:
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"packed: must be 2-D uint8 [N, K/2], got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    n, half = packed.shape
    if (2 * half) % MX_GROUP:
        raise ValueError(f"packed: K = {2 * half} is not a multiple of {MX_GROUP}")
    groups = 2 * half // MX_GROUP
    if scales.dtype != torch.uint8 or tuple(scales.shape) != (n, groups):
        raise ValueError(f"scales: must be uint8 {(n, groups)}, got {scales.dtype} "
                         f"{tuple(scales.shape)}")
    if scales.numel() and int(scales.max()) == E8M0_NAN:
        raise ValueError("scales: contains E8M0 code 255 (NaN)")
    return n, half, groups


class Fp4Workspace:
    """Reusable buffers for :func:`dequantize_fp4_fast`: dequantizing expert after expert
    into the same memory avoids re-faulting ~50 MB pages per matrix (the result of a call is
    overwritten by the next call with the same ``slot``)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}

    def get(self, key: tuple, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        key = (*key, shape, dtype)
        buf = self._buffers.get(key)
        if buf is None:
            buf = torch.empty(shape, dtype=dtype)
            self._buffers[key] = buf
        return buf


def dequantize_fp4_fast(packed: torch.Tensor, scales: torch.Tensor,
                        workspace: Fp4Workspace | None = None, slot: str = "w",
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[N, K]`` of a packed MXFP4 expert weight, bit-identical (as values) to
    :func:`goldens.quant.dequantize_fp4_expert_weight` (one table lookup per packed byte,
    scale folded into the table).  ``dtype`` FP32 (default) or FP64 (the same exact values,
    ready for FP64 accumulation without a conversion pass).  With a ``workspace`` the result
    lives in its ``slot`` buffer."""
    if dtype not in _DEQUANT_DTYPES:
        raise ValueError(f"dtype: {dtype} is not one of {_DEQUANT_DTYPES}")
    n, half, groups = _check_fp4(packed, scales)
    per = MX_GROUP // 2
    ws = workspace if workspace is not None else Fp4Workspace()
    idx = ws.get(("idx",), (n, groups, per), torch.int32)
    torch.add(packed.view(n, groups, per), (scales.to(torch.int32) << 8)[..., None], out=idx)
    out = ws.get((slot,), (n * half, 2), dtype)
    torch.index_select(_fp4_scaled_lut(dtype), 0, idx.view(-1), out=out)
    return out.view(n, 2 * half)


def dequantize_routed_expert(ew: ExpertWeights, workspace: Fp4Workspace | None = None,
                             dtype: torch.dtype = torch.float32
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(W1, W3, W2)`` of a routed expert (exact), FP32 or FP64 ``dtype``."""
    return (dequantize_fp4_fast(ew.w1, ew.w1_scale, workspace, "w1", dtype),
            dequantize_fp4_fast(ew.w3, ew.w3_scale, workspace, "w3", dtype),
            dequantize_fp4_fast(ew.w2, ew.w2_scale, workspace, "w2", dtype))


# ---- pieces --------------------------------------------------------------------------------

def mx_activation(x: torch.Tensor) -> torch.Tensor:
    """FP32 dequantized MXFP8 activation ``MX(x)`` (per row, group 32, upward E8M0 scale)."""
    payload, scales = quantize_mxfp8_activation(x, MX_GROUP)
    return dequantize_mxfp8(payload, scales, MX_GROUP)


def swiglu(g: torch.Tensor, u: torch.Tensor, limit: float,
           route_weight: torch.Tensor | None = None) -> torch.Tensor:
    """FP32 ``silu(clamp(g, max=limit)) * clamp(u, -limit, limit) [* route_weight]``.

    ``silu`` is :func:`goldens.exact.silu_fp32` (FP64 evaluation, one rounding to FP32: the
    FP32 torch kernel's vector body and scalar tail differ in the last bit, which would make
    a row depend on the number of rows in the call); the products are FP32.  ``route_weight`` is ``[t]`` (one per row) or None (shared expert).  The caller applies
    the [BF16] cast.
    """
    g = torch.clamp(g.to(torch.float32), max=limit)
    u = torch.clamp(u.to(torch.float32), -limit, limit)
    h = silu_fp32(g) * u
    if route_weight is not None:
        h = h * route_weight.to(torch.float32)[:, None]
    return h


def routed_expert(x: torch.Tensor, route_weight: torch.Tensor, ew: ExpertWeights,
                  cfg: V41Config, x_mx: torch.Tensor | None = None,
                  workspace: Fp4Workspace | None = None) -> torch.Tensor:
    """One routed expert on its gathered tokens ``x [t, D]`` -> BF16 ``[t, D]``.

    Boundaries: MX(x); [BF16](MX(x) @ W1^T), [BF16](MX(x) @ W3^T), each product FP64
    accumulation, one rounding to FP32 (:func:`goldens.exact.matmul_fp32`), then the BF16
    cast; clamps; [BF16](silu(g)*u*route_weight) (weight BEFORE W2); MX(h); [BF16](MX(h) @
    W2^T) (FP64 accumulation, one rounding to FP32, then BF16).  A row's output does not
    depend on the other rows of the call.  The weights are dequantized straight to FP64
    (exact).  ``x_mx`` may pass a precomputed ``mx_activation(x)`` (MXFP8 is per row, so gathering rows
    of a whole-batch quantization is identical); ``workspace`` reuses dequantization buffers.
    """
    w1, w3, w2 = dequantize_routed_expert(ew, workspace, torch.float64)
    _check_expert_shapes(w1, w3, w2, cfg, "routed expert")
    a = mx_activation(x) if x_mx is None else x_mx
    g = matmul_fp32(a, w1).to(torch.bfloat16)
    u = matmul_fp32(a, w3).to(torch.bfloat16)
    h = swiglu(g, u, cfg.moe.swiglu_limit, route_weight).to(torch.bfloat16)
    return matmul_fp32(mx_activation(h), w2).to(torch.bfloat16)


def shared_expert(x: torch.Tensor, ew: ExpertWeights, cfg: V41Config) -> torch.Tensor:
    """The shared expert on all tokens ``x [T, D]`` -> BF16 ``[T, D]``.

    Boundaries: [BF16] mxfp8_linear(x, W1) and (x, W3) (MX(x), per-K-group FP32 partials);
    clamps; [BF16](silu(g)*u) (no route weight); W2 through mxfp8_linear to FP32, then a
    separate [BF16] cast.
    """
    _require_x(x, cfg)
    i, d = cfg.moe.intermediate_size, cfg.hidden_size
    for name, t, shape in (("shared.w1", ew.w1, (i, d)), ("shared.w3", ew.w3, (i, d)),
                           ("shared.w2", ew.w2, (d, i))):
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: shape {tuple(t.shape)} must be {shape}")
    g = mxfp8_linear(x, ew.w1, ew.w1_scale, out_dtype=torch.bfloat16)
    u = mxfp8_linear(x, ew.w3, ew.w3_scale, out_dtype=torch.bfloat16)
    h = swiglu(g, u, cfg.moe.swiglu_limit).to(torch.bfloat16)
    return mxfp8_linear(h, ew.w2, ew.w2_scale, out_dtype=torch.float32).to(torch.bfloat16)


def _check_expert_shapes(w1, w3, w2, cfg: V41Config, what: str) -> None:
    i, d = cfg.moe.intermediate_size, cfg.hidden_size
    for name, t, shape in (("w1", w1, (i, d)), ("w3", w3, (i, d)), ("w2", w2, (d, i))):
        if tuple(t.shape) != shape:
            raise ValueError(f"{what} {name}: shape {tuple(t.shape)} must be {shape}")


def _require_x(x, cfg: V41Config) -> int:
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError("x: must be a BF16 (or FP32) torch.Tensor")
    if x.dim() != 2 or x.shape[1] != cfg.hidden_size:
        raise ValueError(f"x: shape {tuple(x.shape)} must be [T, {cfg.hidden_size}]")
    return x.shape[0]


def _require_routing(indices, weights, t: int, cfg: V41Config) -> None:
    k, e = cfg.moe.num_experts_per_tok, cfg.moe.n_routed_experts
    if not isinstance(indices, torch.Tensor) or indices.dtype not in (torch.int32, torch.int64):
        raise ValueError("indices: must be an INT32/INT64 torch.Tensor")
    if tuple(indices.shape) != (t, k):
        raise ValueError(f"indices: shape {tuple(indices.shape)} must be [{t}, {k}]")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= e):
        raise ValueError(f"indices: values must lie in [0, {e})")
    if not isinstance(weights, torch.Tensor) or tuple(weights.shape) != (t, k):
        raise ValueError(f"weights: must be a tensor of shape [{t}, {k}]")


# ---- routed sums, EP partials, the block ---------------------------------------------------

def routed_partial(x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor,
                   experts: ExpertLookup, cfg: V41Config, first: int = 0,
                   count: int | None = None) -> torch.Tensor:
    """FP32 ``[T, D]`` sum of the routed outputs of experts ``first .. first+count-1``.

    ``experts[e - first]`` is expert ``e``'s :class:`ExpertWeights` (so an EP rank passes its
    local list).  Experts are visited in ascending index, one at a time: those with no token
    are skipped without touching ``experts``; an expert's tokens are gathered, run through
    :func:`routed_expert` (BF16 output) and added into their FP32 rows.  A token selecting
    the same expert twice is not possible (top-k indices are distinct).
    """
    t = _require_x(x, cfg)
    _require_routing(indices, weights, t, cfg)
    n = cfg.moe.n_routed_experts
    count = n - first if count is None else count
    if not (0 <= first and 0 <= count and first + count <= n):
        raise ValueError(f"first/count: [{first}, {first + count}) outside [0, {n})")
    acc = torch.zeros(t, cfg.hidden_size, dtype=torch.float32)
    if t == 0 or count == 0:
        return acc
    idx = indices.to(torch.int64)
    in_range = (idx >= first) & (idx < first + count)
    if not bool(in_range.any()):
        return acc
    x_mx = mx_activation(x)
    workspace = Fp4Workspace()
    present = torch.unique(idx[in_range]).tolist()  # sorted ascending
    for e in present:
        rows, slots = torch.nonzero(idx == e, as_tuple=True)
        y = routed_expert(x[rows], weights[rows, slots], experts[e - first], cfg,
                          x_mx=x_mx[rows], workspace=workspace)
        acc[rows] = acc[rows] + y.to(torch.float32)  # rows are distinct
    return acc


def ep_partial(x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor,
               local: ExpertLookup, cfg: V41Config, ep: int, rank: int) -> torch.Tensor:
    """FP32 routed partial of EP rank ``rank``: its ``L = n_routed/ep`` contiguous experts
    ``[rank*L, (rank+1)*L)``; ``local[j]`` holds global expert ``rank*L + j``."""
    n_local = local_experts(cfg, ep)
    if not 0 <= rank < ep:
        raise ValueError(f"rank: {rank} outside [0, {ep})")
    return routed_partial(x, indices, weights, local, cfg, first=rank * n_local, count=n_local)


def combine(shared_y: torch.Tensor, partials: Sequence[torch.Tensor]) -> torch.Tensor:
    """Block output ``[BF16](shared_y + routed_sum)`` with ``routed_sum = 0 + p_0 + p_1 + ...``
    summed in FP32 in the given (rank) order."""
    if not partials:
        raise ValueError("partials: need at least one routed partial")
    routed = torch.zeros_like(partials[0], dtype=torch.float32)
    for p in partials:
        if p.shape != routed.shape:
            raise ValueError(f"partials: shape {tuple(p.shape)} != {tuple(routed.shape)}")
        routed = routed + p.to(torch.float32)
    if tuple(shared_y.shape) != tuple(routed.shape):
        raise ValueError(f"shared_y: shape {tuple(shared_y.shape)} != {tuple(routed.shape)}")
    return (shared_y.to(torch.float32) + routed).to(torch.bfloat16)


def moe_block(x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor,
              experts: ExpertLookup, shared: ExpertWeights, cfg: V41Config) -> torch.Tensor:
    """The whole MoE sub-layer output BF16 ``[T, D]``: shared expert plus every routed
    expert (one at a time), FP32 sum, one [BF16] cast (:func:`combine` with one partial)."""
    return combine(shared_expert(x, shared, cfg),
                   [routed_partial(x, indices, weights, experts, cfg)])


def moe_block_ep(x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor,
                 experts: ExpertLookup, shared: ExpertWeights, cfg: V41Config,
                 ep: int) -> torch.Tensor:
    """:func:`moe_block` computed as ``ep`` rank partials combined in rank order; ``experts``
    is indexed globally and sliced per rank."""
    n_local = local_experts(cfg, ep)

    class _Slice:
        def __init__(self, base: int):
            self.base = base

        def __getitem__(self, j: int) -> ExpertWeights:
            return experts[self.base + j]

    parts = [ep_partial(x, indices, weights, _Slice(r * n_local), cfg, ep, r) for r in range(ep)]
    return combine(shared_expert(x, shared, cfg), parts)


__all__ = ["ExpertWeights", "quantize_routed_expert", "quantize_shared_expert",
           "Fp4Workspace", "dequantize_fp4_fast", "dequantize_routed_expert", "dequantize_fp4_expert_weight",
           "mx_activation", "swiglu", "routed_expert", "shared_expert", "routed_partial",
           "ep_partial", "combine", "moe_block", "moe_block_ep"]
