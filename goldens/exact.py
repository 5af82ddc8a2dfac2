"""Batch-invariant FP32 products: FP64 accumulation of FP32 operands, one rounding to FP32.

A plain FP32 ``a @ b`` on the CPU is not a function of one row: the BLAS picks its kernel,
blocking and summation order from the whole call (M = 1 and M = 36 take different paths), so
a row's last bit depends on how many other rows share the call.  A golden must give a row the
same value whatever batch it is in, so every FP32 projection of the goldens goes through
:func:`matmul_fp32` instead:

* the operands (FP32, BF16 or FP16 values) are upcast to FP64 -- exactly;
* every product of two such values is exact in FP64 (at most 24 + 24 significant bits);
* the K-term sum is accumulated in FP64, whose rounding error (``<= K * 2^-53`` relative to
  ``sum |a_k b_k|``) is ~29 bits below the FP32 ulp, so the summation order the BLAS picks
  cannot reach the result for practical purposes;
* the FP64 sum is rounded ONCE to FP32 (round to nearest even).

The result is the correctly rounded FP32 value of the exact dot except in the (practically
never met) case where the exact dot lies within the FP64 accumulation error of an FP32
rounding midpoint.  It is the FP32-accumulation reference with the summation-order
dependence removed: chunked, unchunked and one-row calls agree bit for bit.

Memory: the FP64 copies are streamed.  The output dimension is walked in column chunks and,
when the FP64 copy of ``a`` would be large, the rows too, so no FP64 operand chunk or output
tile exceeds ``chunk_bytes`` (default 64 MiB): an LM head ``[R, 5120] x [129280, 5120]^T``
never holds more than a few chunks (~200 MB) beyond its FP32 inputs and output.

Elementwise functions have the same problem in another guise: torch's CPU kernels evaluate
``sigmoid``/``silu`` with a vectorized body and a scalar tail whose FP32 results differ in the
last bit, and which elements fall in the tail depends on the tensor's size (a decode row of
4 mHC pre-mix logits is all tail, the same row inside a prefill is not).  :func:`sigmoid_fp32`
and :func:`silu_fp32` evaluate in FP64 and round once to FP32 (the same argument: the two FP64
code paths differ far below the FP32 ulp).  ``exp``, ``log1p``, ``sqrt``, ``rsqrt`` and the
row softmax agree between the two paths and are used as they are.

Pure torch: imports nothing from ``v41`` or ``harness``.
"""

from __future__ import annotations

import torch

__all__ = ["matmul_fp32", "project_fp32", "sigmoid_fp32", "silu_fp32", "CHUNK_BYTES"]

CHUNK_BYTES = 64 * 2**20  # bound on each FP64 operand chunk and output tile
_OPERAND_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_F64 = 8  # bytes per FP64 element


def _require_operand(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _OPERAND_DTYPES:
        raise ValueError(f"{name}: dtype {t.dtype} is not one of {_OPERAND_DTYPES}")
    if t.dim() != 2:
        raise ValueError(f"{name}: must be 2-D, got shape {tuple(t.shape)}")


def matmul_fp32(a: torch.Tensor, b_t: torch.Tensor, *,
                chunk_bytes: int = CHUNK_BYTES) -> torch.Tensor:
    """FP32 ``[M, N] = a [M, K] @ b_t [N, K]^T``: FP64 accumulation, one rounding to FP32.

    ``a`` and ``b_t`` hold FP32 (or BF16/FP16) values; an FP64 operand is accepted and used
    as is (it must hold FP32-representable values for the exactness argument of the module
    docstring -- e.g. dequantized weights built directly in FP64).  ``b_t`` is output-major
    (the ``nn.Linear`` / checkpoint layout); pass ``w.T`` for an input-major ``w [K, N]``.

    Element ``[m, n]`` depends only on row ``a[m]`` and row ``b_t[n]``: the result of a row
    is the same whether it is computed alone, with other rows, or in any chunking.  Streams
    over column chunks of ``b_t`` (and row chunks of ``a`` when needed) so every FP64 chunk
    and FP64 output tile stays within ``chunk_bytes``.
    """
    _require_operand(a, "a")
    _require_operand(b_t, "b_t")
    if a.shape[1] != b_t.shape[1]:
        raise ValueError(f"a/b_t: shapes {tuple(a.shape)} and {tuple(b_t.shape)} do not "
                         f"contract (K = {a.shape[1]} vs {b_t.shape[1]})")
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes: must be a positive int, got {chunk_bytes!r}")
    m, k = a.shape
    n = b_t.shape[0]
    out = torch.zeros(m, n, dtype=torch.float32)
    if m == 0 or n == 0 or k == 0:
        return out
    per_row = _F64 * k
    cols = max(1, min(n, chunk_bytes // per_row))
    rows = max(1, min(m, chunk_bytes // per_row, chunk_bytes // (_F64 * cols)))
    a64_whole = a.to(torch.float64) if rows == m else None
    for c0 in range(0, n, cols):
        c1 = min(n, c0 + cols)
        b64 = b_t[c0:c1].to(torch.float64)  # a view when b_t is already FP64
        for r0 in range(0, m, rows):
            r1 = min(m, r0 + rows)
            a64 = a64_whole if a64_whole is not None else a[r0:r1].to(torch.float64)
            out[r0:r1, c0:c1] = torch.mm(a64, b64.T)  # the one FP64 -> FP32 rounding
        del b64
    return out


def project_fp32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [M, K] @ w [K, N]`` for an INPUT-major weight (the compressor layout):
    :func:`matmul_fp32` of ``x`` and ``w^T`` (FP64 accumulation, one rounding to FP32); row
    results do not depend on the other rows."""
    _require_operand(w, "w")
    return matmul_fp32(x, w.T)


def sigmoid_fp32(x: torch.Tensor) -> torch.Tensor:
    """FP32 ``sigmoid(x)`` evaluated in FP64 and rounded once to FP32 (batch-invariant: the
    value of an element does not depend on the tensor's size or its position in it)."""
    return torch.sigmoid(x.to(torch.float64)).to(torch.float32)


def silu_fp32(x: torch.Tensor) -> torch.Tensor:
    """FP32 ``silu(x) = x * sigmoid(x)`` evaluated in FP64 and rounded once to FP32
    (batch-invariant, see :func:`sigmoid_fp32`)."""
    return torch.nn.functional.silu(x.to(torch.float64)).to(torch.float32)
