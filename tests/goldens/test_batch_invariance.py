"""Batch invariance of the goldens' FP32 products (goldens.exact.matmul_fp32).

A golden must give a row the same bytes whatever batch it is in.  For each golden whose FP32
product used to go through a plain torch matmul -- ``goldens.mhc.hc_mixes``,
``goldens.router.gate_scores`` (and ``route``), the routed experts of ``goldens.moe`` and the
LM head of ``goldens.boundary`` -- 37 rows computed in ONE call equal, byte for byte, the
same rows computed one at a time and in uneven chunks, at TINY and, for the router gate,
hc_mixes, one routed expert and an LM-head TP shard, at FLASH widths with a few rows.

The elementwise helpers (``sigmoid_fp32``, ``silu_fp32``: torch's FP32 kernels differ between
their vector body and scalar tail) give an element the same bytes at any tensor size.

The matmul helper itself: any chunking (``chunk_bytes``) gives the same bytes, the result is the
FP32 rounding of the exact dot (checked against ``math.fsum``), operands are validated, and
memory stays bounded for a FLASH LM head shard.
"""

from __future__ import annotations

import math

import pytest
import torch

from goldens.boundary import lm_head, lm_head_shard
from goldens.compressor import project_fp32 as compressor_project_fp32
from goldens.config import FLASH, TINY
from goldens.exact import matmul_fp32, project_fp32, sigmoid_fp32, silu_fp32
from goldens.mhc import HcSiteWeights, hc_mixes
from goldens.moe import (ExpertWeights, dequantize_fp4_fast, mx_activation, moe_block,
                         quantize_routed_expert, quantize_shared_expert, routed_expert, swiglu)
from goldens.router import gate_scores, route

ROWS = 37
CHUNKS = (5, 1, 13, 2, 16)  # uneven, sums to 37
assert sum(CHUNKS) == ROWS


def _bytes_equal(a, b) -> bool:
    """Byte-for-byte equality (also distinguishes -0.0 / +0.0 and NaN payloads)."""
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_bytes_equal(x, y) for x, y in zip(a, b))
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def _cat(outs):
    if isinstance(outs[0], tuple):
        return tuple(torch.cat(f, 0) for f in zip(*outs))
    return torch.cat(outs, 0)


def _one_at_a_time(fn, x):
    return _cat([fn(x[t:t + 1].clone()) for t in range(x.shape[0])])


def _in_chunks(fn, x, chunks):
    outs, r = [], 0
    for c in chunks:
        outs.append(fn(x[r:r + c].clone()))
        r += c
    assert r == x.shape[0]
    return _cat(outs)


def _assert_batch_invariant(fn, x, chunks=CHUNKS):
    whole = fn(x)
    assert _bytes_equal(whole, _one_at_a_time(fn, x)), "one call != one row at a time"
    assert _bytes_equal(whole, _in_chunks(fn, x, chunks)), "one call != uneven chunks"
    return whole


def _plain_fp32_differs(a, b_t) -> int:
    """How many elements of the plain FP32 ``a @ b_t.T`` differ between one call and one row
    at a time on this machine (informational: the failure mode the helper removes)."""
    whole = a.float() @ b_t.float().T
    rows = torch.cat([a[t:t + 1].float() @ b_t.float().T for t in range(a.shape[0])])
    return int((whole != rows).sum())


# ---- the helper ------------------------------------------------------------------------------

def test_matmul_fp32_is_the_fp32_rounding_of_the_exact_dot():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(7, 300, generator=gen)
    b = torch.randn(11, 300, generator=gen)
    got = matmul_fp32(a, b)
    assert got.dtype == torch.float32 and got.shape == (7, 11)
    for i in range(7):
        for j in range(11):
            exact = math.fsum(x * y for x, y in zip(a[i].tolist(), b[j].tolist()))
            assert float(got[i, j]) == float(torch.tensor(exact, dtype=torch.float64).float())


@pytest.mark.parametrize("chunk_bytes", [1, 8 * 64, 8 * 64 * 5 + 3, 8 * 64 * 40, 1 << 30])
def test_matmul_fp32_chunking_never_changes_a_byte(chunk_bytes):
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(ROWS, 64, generator=gen).to(torch.bfloat16)
    b = torch.randn(97, 64, generator=gen)
    ref = matmul_fp32(a, b)
    assert _bytes_equal(matmul_fp32(a, b, chunk_bytes=chunk_bytes), ref)
    assert _bytes_equal(matmul_fp32(a, b.double(), chunk_bytes=chunk_bytes), ref)


def test_matmul_fp32_edge_shapes_and_validation():
    assert matmul_fp32(torch.zeros(0, 4), torch.ones(3, 4)).shape == (0, 3)
    assert matmul_fp32(torch.ones(2, 4), torch.ones(0, 4)).shape == (2, 0)
    assert torch.equal(matmul_fp32(torch.ones(2, 0), torch.ones(3, 0)), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="do not contract"):
        matmul_fp32(torch.ones(2, 4), torch.ones(3, 5))
    with pytest.raises(ValueError, match="a: must be 2-D"):
        matmul_fp32(torch.ones(4), torch.ones(3, 4))
    with pytest.raises(ValueError, match="b_t: dtype"):
        matmul_fp32(torch.ones(2, 4), torch.ones(3, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="chunk_bytes"):
        matmul_fp32(torch.ones(2, 4), torch.ones(3, 4), chunk_bytes=0)


def test_project_fp32_is_shared_with_the_compressor():
    assert compressor_project_fp32 is project_fp32
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(ROWS, 48, generator=gen).to(torch.bfloat16)
    w = torch.randn(48, 20, generator=gen)  # input-major [K, N]
    whole = _assert_batch_invariant(lambda r: project_fp32(r, w), x)
    assert _bytes_equal(whole, matmul_fp32(x, w.T.contiguous()))


@pytest.mark.parametrize("fn,plain", [(sigmoid_fp32, torch.sigmoid),
                                      (silu_fp32, torch.nn.functional.silu)])
def test_elementwise_helpers_do_not_depend_on_tensor_size(fn, plain):
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(ROWS, 4, generator=gen) * 4  # rows of 4, like the mHC pre/post logits
    whole = _assert_batch_invariant(fn, x)
    assert whole.dtype == torch.float32
    ref = plain(x.double()).float()  # the FP32 rounding of the FP64 value
    assert _bytes_equal(whole, ref)
    rows = torch.cat([plain(x[t:t + 1]) for t in range(ROWS)])
    print(f"\nplain FP32 {plain.__name__}, {ROWS}x4 in one call vs one row at a time: "
          f"{int((plain(x) != rows).sum())} elements differ")


def test_swiglu_batch_invariant():
    gen = torch.Generator().manual_seed(13)
    g = torch.randn(ROWS, 24, generator=gen) * 6
    u = torch.randn(ROWS, 24, generator=gen) * 6
    rw = torch.rand(ROWS, generator=gen)
    _assert_batch_invariant(lambda r: swiglu(g[r.view(-1)], u[r.view(-1)], 10.0,
                                             rw[r.view(-1)]), torch.arange(ROWS))


# ---- hc_mixes ---------------------------------------------------------------------------------

def _hc_case(cfg, t, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, cfg.hc.hc_mult, cfg.hidden_size, generator=gen)
    x = x.to(torch.bfloat16).to(torch.float32)
    w = HcSiteWeights(fn=torch.randn(cfg.mix_hc, cfg.hc_dim, generator=gen) * 0.05,
                      scale=torch.rand(3, generator=gen) + 0.5,
                      base=torch.randn(cfg.mix_hc, generator=gen) * 0.5)
    return x, w


def test_hc_mixes_batch_invariant_tiny():
    x, w = _hc_case(TINY, ROWS, 3)
    _assert_batch_invariant(lambda r: hc_mixes(r, w, TINY), x)


def test_hc_mixes_batch_invariant_flash_width():
    x, w = _hc_case(FLASH, 6, 4)
    _assert_batch_invariant(lambda r: hc_mixes(r, w, FLASH), x, chunks=(1, 3, 2))
    print(f"\nplain FP32 hc_mixes product, 6 rows vs one at a time: "
          f"{_plain_fp32_differs(x.reshape(6, -1), w.fn)} elements differ")


# ---- router -----------------------------------------------------------------------------------

def _router_case(cfg, t, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, cfg.hidden_size, generator=gen).to(torch.bfloat16)
    gate = torch.randn(cfg.moe.n_routed_experts, cfg.hidden_size, generator=gen) * 0.05
    bias = torch.randn(cfg.moe.n_routed_experts, generator=gen) * 0.1
    return x, gate, bias


def test_router_batch_invariant_tiny():
    x, gate, bias = _router_case(TINY, ROWS, 5)
    _assert_batch_invariant(lambda r: gate_scores(r, gate, TINY), x)
    _assert_batch_invariant(lambda r: route(r, gate, bias, TINY), x)


def test_router_batch_invariant_flash_width():
    x, gate, bias = _router_case(FLASH, 6, 6)
    _assert_batch_invariant(lambda r: gate_scores(r, gate, FLASH), x, chunks=(2, 1, 3))
    _assert_batch_invariant(lambda r: route(r, gate, bias, FLASH), x, chunks=(2, 1, 3))
    print(f"\nplain FP32 gate product, 6 rows vs one at a time: "
          f"{_plain_fp32_differs(x, gate)} elements differ")


# ---- routed experts ---------------------------------------------------------------------------

def _tiny_expert(gen, cfg=TINY):
    i, d = cfg.moe.intermediate_size, cfg.hidden_size
    return quantize_routed_expert(torch.randn(i, d, generator=gen) * 0.08,
                                  torch.randn(i, d, generator=gen) * 0.08,
                                  torch.randn(d, i, generator=gen) * 0.1)


def test_fp64_dequantization_holds_the_fp32_values():
    gen = torch.Generator().manual_seed(14)
    ew = _tiny_expert(gen)
    w32 = dequantize_fp4_fast(ew.w1, ew.w1_scale)
    w64 = dequantize_fp4_fast(ew.w1, ew.w1_scale, dtype=torch.float64)
    assert w64.dtype == torch.float64 and torch.equal(w64.float().double(), w64)
    assert torch.equal(w64.float(), w32)
    with pytest.raises(ValueError, match="dtype"):
        dequantize_fp4_fast(ew.w1, ew.w1_scale, dtype=torch.bfloat16)


def test_routed_expert_batch_invariant_tiny():
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(ROWS, TINY.hidden_size, generator=gen) * 1.5).to(torch.bfloat16)
    rw = torch.rand(ROWS, generator=gen) + 0.1
    ew = _tiny_expert(gen)
    rows = torch.arange(ROWS)

    def fn(r_idx):  # rows selected by index so the route weight follows its row
        r_idx = r_idx.view(-1)
        return routed_expert(x[r_idx], rw[r_idx], ew, TINY)

    _assert_batch_invariant(fn, rows)
    # the precomputed whole-batch MX activation gives the same bytes (MXFP8 is per row)
    x_mx = mx_activation(x)
    assert _bytes_equal(routed_expert(x, rw, ew, TINY, x_mx=x_mx), fn(rows))


def test_moe_block_batch_invariant_tiny():
    """Whole MoE sub-layer: a token's output does not depend on which other tokens are in the
    call (routed products per row, ascending-expert FP32 sum, batch-invariant shared expert)."""
    gen = torch.Generator().manual_seed(8)
    e, i, d = TINY.moe.n_routed_experts, TINY.moe.intermediate_size, TINY.hidden_size
    x = (torch.randn(ROWS, d, generator=gen) * 1.5).to(torch.bfloat16)
    experts = [_tiny_expert(gen) for _ in range(e)]
    shared = quantize_shared_expert(torch.randn(i, d, generator=gen) * 0.08,
                                    torch.randn(i, d, generator=gen) * 0.08,
                                    torch.randn(d, i, generator=gen) * 0.1)
    gate = torch.randn(e, d, generator=gen) * 0.05
    bias = torch.randn(e, generator=gen) * 0.1

    def fn(r):
        idx, wt = route(r, gate, bias, TINY)
        return moe_block(r, idx, wt, experts, shared, TINY)

    _assert_batch_invariant(fn, x)


def test_routed_expert_batch_invariant_flash_width():
    cfg = FLASH
    gen = torch.Generator().manual_seed(9)
    i, d = cfg.moe.intermediate_size, cfg.hidden_size
    mats = []
    for n, k in ((i, d), (i, d), (d, i)):
        mats.append(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen))
        mats.append(torch.randint(119, 122, (n, k // 32), dtype=torch.uint8, generator=gen))
    ew = ExpertWeights(*mats)
    x = torch.randn(5, d, generator=gen).to(torch.bfloat16)
    rw = torch.rand(5, generator=gen) + 0.1

    def fn(r_idx):
        r_idx = r_idx.view(-1)
        return routed_expert(x[r_idx], rw[r_idx], ew, cfg)

    out = _assert_batch_invariant(fn, torch.arange(5), chunks=(2, 3))
    assert bool(torch.isfinite(out.float()).all()) and float(out.float().abs().max()) > 0


# ---- LM head ----------------------------------------------------------------------------------

def test_lm_head_batch_invariant_tiny():
    gen = torch.Generator().manual_seed(10)
    hidden = torch.randn(ROWS, TINY.hidden_size, generator=gen).to(torch.bfloat16)
    head = torch.randn(TINY.vocab_size, TINY.hidden_size, generator=gen) * 0.05
    for tp in (1, 4):
        _assert_batch_invariant(lambda r: lm_head(r, head, TINY, tp), hidden)


def test_lm_head_batch_invariant_flash_width_tp8_shard():
    """One TP8 vocab shard of the FLASH head (16160 x 5120, FP32 330 MB): larger than one
    FP64 chunk, so the vocab is streamed; a few rows agree with one row at a time."""
    gen = torch.Generator().manual_seed(11)
    n = FLASH.vocab_size // 8
    shard = torch.randn(n, FLASH.hidden_size, generator=gen) * 0.02
    hidden = torch.randn(5, FLASH.hidden_size, generator=gen).to(torch.bfloat16)
    out = _assert_batch_invariant(lambda r: lm_head_shard(r, shard), hidden, chunks=(3, 2))
    assert out.shape == (5, n) and out.dtype == torch.float32
    # spot check the rounding of a few columns against a one-column FP64 dot
    cols = torch.tensor([0, 1, 4095, 4096, n - 1])
    ref = (hidden.double() @ shard[cols].double().T).float()
    assert _bytes_equal(out[:, cols].contiguous(), ref)
