"""goldens.qkv: projection boundaries, head TP slicing, RoPE placement and the inverse
consistency with goldens.o_proj (the output's inverse RoPE undoes the query/KV rotation).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from goldens.config import TINY, V41Config, with_overrides
from goldens.o_proj import inverse_rope_heads
from goldens.quant import dequantize_fp8_weight, dequantize_mxfp8, quantize_mxfp8_activation
from goldens.qkv import (kv_proj_rope, local_wq_b, q_lora, q_proj_rope, qkv_proj_rope,
                         random_qkv_weights)
from goldens.rope import precompute_rope_tables
from goldens.sparse_attention import sparse_attention
from goldens.window_cache import empty_window_cache, gather_window_kv, publish_window_kv




CFG = TINY
HALF = CFG.rope_dim // 2


def _weights(seed=0, cfg: V41Config = CFG):
    return random_qkv_weights(cfg, torch.Generator().manual_seed(seed))


def _rows(positions, compressed=True, cfg=CFG):
    cos, sin = precompute_rope_tables(cfg, compressed, capacity=4096)
    pos = torch.as_tensor(positions)
    return cos[pos], sin[pos]


def _identity(t):
    return torch.ones(t, HALF), torch.zeros(t, HALF)


def _x(t, seed=1, cfg=CFG):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, cfg.hidden_size, generator=g).to(torch.bfloat16)


def _mx_reference(x, payload, scales):
    """Independent MX linear: dequantize both operands, FP64 matmul, one BF16 cast."""
    xa, sa = quantize_mxfp8_activation(x)
    return (dequantize_mxfp8(xa, sa).double() @ dequantize_fp8_weight(payload, scales).double().T)


def _rms(y, w):
    y = y.double()
    return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + CFG.rms_norm_eps) * w.double()


def _close_bf16(a, r, rel=2 ** -6):
    err = (a.double() - r).abs().max()
    assert float(err) <= rel * float(r.abs().max()), f"max err {float(err)}"


def test_shapes_dtypes_and_boundaries():
    w, x = _weights(), _x(5)
    cos, sin = _identity(5)
    q, kv, qr = qkv_proj_rope(x, w, cos, sin, CFG)
    assert q.shape == (5, CFG.num_heads, CFG.head_dim) and q.dtype == torch.bfloat16
    assert kv.shape == (5, CFG.head_dim) and kv.dtype == torch.bfloat16
    assert qr.shape == (5, CFG.q_lora_rank) and qr.dtype == torch.bfloat16
    # qr = RMSNorm(bf16(MX(x) @ wq_a^T)); kv likewise with kv_norm (identity rotation here)
    qr_ref = _rms(_mx_reference(x, w.wq_a, w.wq_a_scale).to(torch.bfloat16), w.q_norm)
    _close_bf16(qr, qr_ref)
    kv_ref = _rms(_mx_reference(x, w.wkv, w.wkv_scale).to(torch.bfloat16), w.kv_norm)
    _close_bf16(kv, kv_ref)
    q_ref = _mx_reference(qr, w.wq_b, w.wq_b_scale).view(5, CFG.num_heads, CFG.head_dim)
    _close_bf16(q, q_ref)
    # no per-head query RMS rescale in V4.1: q rows are not unit-RMS per head
    per_head = q.float().pow(2).mean(-1).sqrt()
    assert float((per_head - 1).abs().max()) > 0.05


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tp_heads_are_wq_b_row_slices(tp):
    w, x = _weights(), _x(3)
    cos, sin = _rows([0, 7, 300])
    full, kv_full, qr_full = qkv_proj_rope(x, w, cos, sin, CFG)
    lh = CFG.num_heads // tp
    for r in range(tp):
        q, kv, qr = qkv_proj_rope(x, w, cos, sin, CFG, tp=tp, tp_rank=r)
        assert torch.equal(q, full[:, r * lh:(r + 1) * lh])  # per output column, exact
        assert torch.equal(kv, kv_full) and torch.equal(qr, qr_full)  # replicated
        shard = w.shard(CFG, tp, r)
        assert torch.equal(shard.wq_b.view(torch.uint8),
                           w.wq_b[r * lh * CFG.head_dim:(r + 1) * lh * CFG.head_dim].view(torch.uint8))


def test_rope_touches_only_the_tail_of_each_head():
    w, x = _weights(), _x(4)
    qr = q_lora(x, w, CFG)
    cos, sin = _rows([1, 5, 64, 1000])
    rot = q_proj_rope(qr, w.wq_b, w.wq_b_scale, cos, sin, CFG)
    plain = q_proj_rope(qr, w.wq_b, w.wq_b_scale, *_identity(4), CFG)
    nope = CFG.nope_dim
    assert torch.equal(rot[..., :nope], plain[..., :nope])
    assert not torch.equal(rot[..., nope:], plain[..., nope:])
    # adjacent pairs: the rotation preserves each pair's norm
    pr = rot[..., nope:].float().unflatten(-1, (HALF, 2)).norm(dim=-1)
    pp = plain[..., nope:].float().unflatten(-1, (HALF, 2)).norm(dim=-1)
    assert float((pr - pp).abs().max()) <= 2 ** -6 * float(pp.max())
    kv_rot = kv_proj_rope(x, w, cos, sin, CFG)
    kv_plain = kv_proj_rope(x, w, *_identity(4), CFG)
    assert torch.equal(kv_rot[:, :nope], kv_plain[:, :nope])
    assert not torch.equal(kv_rot[:, nope:], kv_plain[:, nope:])


def _assert_derotated(back, plain):
    nope = CFG.nope_dim
    assert torch.equal(back[..., :nope], plain[..., :nope])
    pair = plain[..., nope:].float().unflatten(-1, (HALF, 2)).norm(dim=-1, keepdim=True)
    err = (back[..., nope:].float() - plain[..., nope:].float()).unflatten(-1, (HALF, 2))
    # two BF16 roundings (rotate, de-rotate) of an orthogonal map: <= 2^-7 of the pair norm
    assert bool((err.abs() <= 2 ** -7 * pair + 1e-30).all())


@settings(max_examples=15, deadline=None)
@given(positions=st.lists(st.integers(0, 4095), min_size=1, max_size=6),
       compressed=st.booleans(), seed=st.integers(0, 1000))
def test_o_proj_inverse_rope_undoes_q_rope(positions, compressed, seed):
    # identity attention: the head output is the query itself
    w, x = _weights(seed), _x(len(positions), seed + 1)
    qr = q_lora(x, w, CFG)
    cos, sin = _rows(positions, compressed)
    rot = q_proj_rope(qr, w.wq_b, w.wq_b_scale, cos, sin, CFG)
    plain = q_proj_rope(qr, w.wq_b, w.wq_b_scale, *_identity(len(positions)), CFG)
    _assert_derotated(inverse_rope_heads(rot, cos, sin), plain)


def test_self_attention_output_derotates_to_unrotated_kv():
    # Each token attends only to its own published row (-inf sink): softmax weight exactly 1,
    # so every head's output is the dequantized rotated kv, and o_proj's inverse RoPE at the
    # token's rows must give back the unrotated kv within the MXFP8 cache budget.
    t = 6
    w, x = _weights(2), _x(t, 9)
    cos, sin = _rows([3, 17, 18, 200, 511, 4000])
    q, kv, _ = qkv_proj_rope(x, w, cos, sin, CFG, tp=2, tp_rank=1)
    payload, scales = empty_window_cache(CFG, 1)
    slots = torch.tensor([9, 2, 0, 15, 4, 7])
    publish_window_kv(payload, scales, kv, slots)
    rows, valid = gather_window_kv(payload, scales, slots.to(torch.int32)[:, None])
    out = sparse_attention(q, rows, valid, torch.full((q.shape[1],), float("-inf")))
    assert torch.equal(out, rows.expand(t, q.shape[1], CFG.head_dim).to(torch.bfloat16))
    back = inverse_rope_heads(out, cos, sin).float()
    kv_plain = kv_proj_rope(x, w, *_identity(t), CFG).float()
    for h in range(q.shape[1]):
        rel = (back[:, h] - kv_plain).norm(dim=-1) / kv_plain.norm(dim=-1)
        assert float(rel.max()) < 0.0625  # E4M3 cache: <= 2^-4 per element


def test_bad_arguments_raise():
    w = _weights()
    with pytest.raises(ValueError, match="x"):
        q_lora(_x(2).float(), w, CFG)
    with pytest.raises(ValueError, match="cos"):
        kv_proj_rope(_x(2), w, *_identity(3), CFG)
    with pytest.raises(ValueError, match="tp_rank"):
        local_wq_b(w.wq_b, w.wq_b_scale, CFG, 4, 4)
    with pytest.raises(ValueError, match="num_heads % tp"):
        local_wq_b(w.wq_b, w.wq_b_scale, with_overrides(CFG, num_heads=8), 16, 0)
