"""goldens.o_proj: grouped low-rank output, TP partials and the rank-order reduction.

The TP check sums the ranks' FP32 partials at TP 1/2/4/8 (TINY) and compares with the
TP1 result: equal to FP32 reassociation, then within the per-row contract bound after
the BF16 cast (and identical in almost every element).
"""

from __future__ import annotations

import pytest
import torch

from goldens.config import TINY, with_overrides
from goldens.o_proj import (grouped_output, inverse_rope_heads, local_wo_a, local_wo_b, o_proj,
                            o_proj_partial, random_o_weights, tp_reduce)
from goldens.quant import dequantize_fp8_weight, dequantize_mxfp8, quantize_mxfp8_activation
from goldens.rope import precompute_rope_tables
from harness.compare import check_row_bound
from harness.verdict import all_passed




CFG = TINY


def row_bound_ok(actual, ref):
    """The contract's per-row bound (harness comparator), non-finite failing."""
    return all_passed(check_row_bound("out", actual, ref))


def _inputs(t=9, seed=0, cfg=CFG):
    g = torch.Generator().manual_seed(seed)
    attn = torch.randn(t, cfg.num_heads, cfg.head_dim, generator=g).to(torch.bfloat16)
    cos, sin = precompute_rope_tables(cfg, True, capacity=4096)
    pos = torch.randint(0, 4096, (t,), generator=g)
    return attn, cos[pos], sin[pos], random_o_weights(cfg, g)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_sum_of_rank_partials_equals_tp1(tp):
    attn, cos, sin, w = _inputs()
    ref32 = o_proj_partial(attn, cos, sin, w, CFG)  # TP1: one partial
    lh = CFG.num_heads // tp
    parts = [o_proj_partial(attn[:, r * lh:(r + 1) * lh], cos, sin, w.shard(CFG, tp, r), CFG)
             for r in range(tp)]
    assert all(p.dtype == torch.float32 and p.shape == ref32.shape for p in parts)
    summed = sum(parts[1:], parts[0].clone())
    # FP32 reassociation only: a few FP32 ulps of the row scale
    scale = ref32.abs().amax(-1, keepdim=True)
    assert float(((summed - ref32).abs() / scale).max()) < 1e-5
    out = tp_reduce(parts)
    ref = ref32.to(torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert row_bound_ok(out, ref)
    assert float((out == ref).float().mean()) > 0.98
    assert torch.equal(out, o_proj(attn, cos, sin, w, CFG, tp=tp))
    if tp == 1:
        assert torch.equal(out, ref)


def test_partial_matches_independent_fp64_chain():
    attn, cos, sin, w = _inputs(t=5, seed=3)
    o = inverse_rope_heads(attn, cos, sin)
    grouped = o.double().reshape(5, CFG.o_groups, CFG.o_group_in)
    latent = torch.einsum("tgi,gri->tgr", grouped, w.wo_a.double()).reshape(5, -1)
    latent = latent.to(torch.bfloat16)
    xa, sa = quantize_mxfp8_activation(latent)
    ref = dequantize_mxfp8(xa, sa).double() @ dequantize_fp8_weight(w.wo_b, w.wo_b_scale).double().T
    got = o_proj_partial(attn, cos, sin, w, CFG).double()
    assert float((got - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


def test_groups_are_contiguous_head_blocks():
    cfg = with_overrides(CFG, o_groups=4)  # two heads per group, o_group_in = 128
    g = torch.Generator().manual_seed(1)
    wo_a = torch.randn(4, cfg.o_lora_rank, cfg.o_group_in, generator=g).to(torch.bfloat16)
    for head in range(cfg.num_heads):
        o = torch.zeros(2, cfg.num_heads, cfg.head_dim, dtype=torch.bfloat16)
        o[:, head] = 1.0
        lat = grouped_output(o, wo_a, cfg).view(2, 4, cfg.o_lora_rank)
        live = (lat != 0).any(dim=(0, 2)).nonzero().flatten().tolist()
        assert live == [head // 2]
        # one BF16 cast of an FP32 sum
        inner = head % 2 * cfg.head_dim
        want = wo_a[head // 2, :, inner:inner + cfg.head_dim].float().sum(-1).to(torch.bfloat16)
        assert torch.equal(lat[0, head // 2], want)


def test_local_weight_slices():
    _, _, _, w = _inputs()
    for tp in (2, 4, 8):
        lg = CFG.o_groups // tp
        width = lg * CFG.o_lora_rank
        for r in range(tp):
            a = local_wo_a(w.wo_a, CFG, tp, r)
            assert torch.equal(a, w.wo_a[r * lg:(r + 1) * lg])
            b, s = local_wo_b(w.wo_b, w.wo_b_scale, CFG, tp, r)
            assert torch.equal(b.view(torch.uint8), w.wo_b[:, r * width:(r + 1) * width].view(torch.uint8))
            assert s.shape == (CFG.hidden_size // 32, width // 32)
    with pytest.raises(ValueError, match="tp_rank"):
        local_wo_a(w.wo_a, CFG, 2, 2)
    with pytest.raises(ValueError, match="o_groups % tp"):
        cfg4 = with_overrides(CFG, o_groups=4)
        local_wo_b(w.wo_b[:, :4 * CFG.o_lora_rank], w.wo_b_scale[:, :8], cfg4, 8, 0)


def test_tp_reduce_is_rank_order_fp32_with_one_cast():
    big = torch.tensor([[1e8]]), torch.tensor([[1.0]]), torch.tensor([[-1e8]])
    assert float(tp_reduce(list(big))) == 0.0  # ((1e8 + 1) - 1e8) in FP32
    assert float(tp_reduce([big[0], big[2], big[1]])) == 1.0
    # one BF16 cast after the sum, not a BF16 sum of BF16 partials
    a, b = torch.tensor([[1.0 + 3 * 2 ** -10]]), torch.tensor([[3 * 2 ** -10]])
    assert float(tp_reduce([a, b])) == 1.0 + 2 ** -7
    assert float(a.to(torch.bfloat16) + b.to(torch.bfloat16)) != float(tp_reduce([a, b]))
    with pytest.raises(ValueError, match="partials"):
        tp_reduce([a, a.to(torch.bfloat16)])
