"""goldens.sparse_attention and goldens.window_cache.

Sparse attention is checked against a slow per-head, per-token FP64 loop that shares no
helper with the module (sink in the denominator only, -1 keys ignored, a token with no
valid key gives 0).  The window cache is checked for the MXFP8 round-trip budget, that
publication touches only the named slots (every other byte identical), and for -1 gathers.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goldens.config import FLASH, TINY
from goldens.quant import quantize_compressed_kv
from goldens.sparse_attention import concat_kv_parts, gather_compressed_kv, sparse_attention
from goldens.window_cache import empty_window_cache, gather_window_kv, publish_window_kv




SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


# ---- slow FP64 reference -------------------------------------------------------------------

def slow_attention(q, kv, valid, sink, scale):
    """Per token, per head, per key Python loop in FP64."""
    T, H, D = q.shape
    out = torch.zeros(T, H, D, dtype=torch.float64)
    for t in range(T):
        keys = [j for j in range(kv.shape[1]) if bool(valid[t, j])]
        for h in range(H):
            qv = q[t, h].double()
            logits = [float(qv @ kv[t, j].double()) * scale for j in keys]
            s = float(sink[h])
            m = max(logits + [s])
            den = math.exp(s - m) + sum(math.exp(lg - m) for lg in logits)
            acc = torch.zeros(D, dtype=torch.float64)
            for lg, j in zip(logits, keys):
                acc += math.exp(lg - m) * kv[t, j].double()
            out[t, h] = acc / den
    return out


def assert_bf16_close(actual, ref, kv, valid):
    """BF16 rounding of an FP32 computation: |a - r| <= 2^-8 |r| + 1e-5 * max|v_valid|."""
    masked = kv.double().abs() * valid[..., None]
    vmax = masked.flatten(1).amax(dim=1) if masked[0].numel() else torch.zeros(kv.shape[0])
    vmax = vmax[:, None, None]
    err = (actual.double() - ref).abs()
    bound = 2.0 ** -8 * ref.abs() + 1e-5 * vmax + 1e-30
    worst = (err / bound).max()
    assert bool((err <= bound).all()), f"worst error / bound = {float(worst):.3f}"


@st.composite
def attention_case(draw):
    T = draw(st.integers(1, 5))
    H = draw(st.integers(1, 4))
    K = draw(st.integers(0, 10))
    D = draw(st.sampled_from([32, 64]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(T, H, D, generator=g) * draw(st.sampled_from([0.5, 1.0, 3.0]))).to(torch.bfloat16)
    kv = torch.randn(T, K, D, generator=g) * draw(st.sampled_from([0.5, 1.0, 4.0]))
    valid = torch.rand(T, K, generator=g) < draw(st.sampled_from([0.0, 0.3, 0.8, 1.0]))
    sink = torch.randn(H, generator=g) * draw(st.sampled_from([0.1, 2.0, 20.0]))
    return q, kv, valid, sink, draw(st.integers(1, 4)), draw(st.integers(1, 4))


@SETTINGS
@given(attention_case())
def test_matches_slow_fp64_loop(case):
    q, kv, valid, sink, qc, hc = case
    D = q.shape[-1]
    out = sparse_attention(q, kv, valid, sink, query_chunk=qc, head_chunk=hc)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    ref = slow_attention(q, kv, valid, sink, D ** -0.5)
    assert_bf16_close(out, ref, kv, valid)
    dead = ~valid.any(dim=1)
    assert bool((out[dead] == 0).all())  # no valid key -> exactly zero


def test_sink_is_in_the_denominator_only():
    # one valid key with logit l: out = v * e^l / (e^l + e^sink)
    D = 64
    q = torch.zeros(1, 2, D, dtype=torch.bfloat16)
    q[0, :, 0] = 8.0  # logit = 8 * v0 / 8 = v0
    v = torch.zeros(1, 3, D)
    v[0, 0, 0], v[0, 0, 1] = 1.5, 0.25
    v[0, 1] = 1e30  # an invalid row never contributes, whatever it holds
    v[0, 2] = float("nan")
    valid = torch.tensor([[True, False, False]])
    sink = torch.tensor([0.5, -3.0])
    out = sparse_attention(q, v, valid, sink).double()
    for h in range(2):
        p = math.exp(1.5) / (math.exp(1.5) + math.exp(float(sink[h])))
        assert math.isclose(float(out[0, h, 0]), 1.5 * p, rel_tol=2 ** -8)
        assert math.isclose(float(out[0, h, 1]), 0.25 * p, rel_tol=2 ** -8)
        assert bool((out[0, h, 2:] == 0).all())


def test_no_valid_key_or_infinite_sink_gives_zero():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(3, 2, 32, generator=g).to(torch.bfloat16)
    kv = torch.randn(3, 4, 32, generator=g)
    valid = torch.tensor([[False] * 4, [True, False, True, False], [False] * 4])
    for sink in (torch.tensor([0.0, 5.0]), torch.tensor([-math.inf, -math.inf])):
        out = sparse_attention(q, kv, valid, sink)
        assert torch.equal(out[0], torch.zeros(2, 32, dtype=torch.bfloat16))
        assert torch.equal(out[2], torch.zeros(2, 32, dtype=torch.bfloat16))
        assert bool(out[1].abs().sum() > 0)
    out = sparse_attention(q, kv, valid, torch.tensor([math.inf, 0.0]))
    assert bool((out[:, 0] == 0).all()) and bool(out[1, 1].abs().sum() > 0)
    # -inf sink is no sink: a single valid key gets probability exactly 1
    one = torch.tensor([[True, False, False, False]] * 3)
    out = sparse_attention(q, kv, one, torch.tensor([-math.inf, -math.inf]))
    assert torch.equal(out, kv[:, :1].expand(3, 2, 32).to(torch.bfloat16))


def test_bad_arguments_raise():
    q = torch.zeros(2, 2, 32, dtype=torch.bfloat16)
    kv = torch.zeros(2, 3, 32)
    with pytest.raises(ValueError, match="valid"):
        sparse_attention(q, kv, torch.ones(2, 3, dtype=torch.int32), torch.zeros(2))
    with pytest.raises(ValueError, match="attn_sink"):
        sparse_attention(q, kv, torch.ones(2, 3, dtype=torch.bool), torch.zeros(3))
    with pytest.raises(ValueError, match="kv"):
        sparse_attention(q, torch.zeros(2, 3, 16), torch.ones(2, 3, dtype=torch.bool), torch.zeros(2))


# ---- window cache --------------------------------------------------------------------------

def _random_cache(cfg, blocks, g):
    p, s = empty_window_cache(cfg, blocks)
    p.view(torch.uint8).copy_(torch.randint(0, 256, p.shape, generator=g, dtype=torch.uint8)
                              & 0x7E)  # finite E4M3 bytes (no NaN encodings)
    s.copy_(torch.randint(100, 140, s.shape, generator=g, dtype=torch.uint8))
    return p, s


def assert_mxfp8_budget(got, kv, scale_codes):
    """E4M3 has 3 mantissa bits: each element is within 2^-4 of its value in the normal
    range and within half the subnormal spacing (2^-10 * scale) below it, so the relative
    L2 error is ~2.5 % (< 1 % is not reachable for an E4M3 round trip)."""
    a, r = got.double(), kv.double()
    scale = torch.pow(2.0, scale_codes.double() - 127).repeat_interleave(32, dim=-1)
    assert bool(((a - r).abs() <= 2.0 ** -4 * r.abs() + 2.0 ** -10 * scale).all())
    assert float((a - r).norm() / r.norm()) < 0.0625


@SETTINGS
@given(blocks=st.integers(1, 4), T=st.integers(0, 20), seed=st.integers(0, 2**31 - 1),
       pad=st.floats(0.0, 0.5), mag=st.sampled_from([1e-3, 1.0, 300.0]))
def test_publish_gather_round_trip(blocks, T, seed, pad, mag):
    cfg = TINY
    g = torch.Generator().manual_seed(seed)
    rows = blocks * cfg.cache.block_size
    T = min(T, rows)
    p, s = _random_cache(cfg, blocks, g)
    p0, s0 = p.view(torch.uint8).clone(), s.clone()
    slots = torch.randperm(rows, generator=g)[:T]
    slots[torch.rand(T, generator=g) < pad] = -1
    kv = (torch.randn(T, cfg.head_dim, generator=g) * mag).to(torch.bfloat16)
    publish_window_kv(p, s, kv, slots)

    live = slots >= 0
    touched = torch.zeros(rows, dtype=torch.bool)
    touched[slots[live]] = True
    # untouched rows: every payload and scale byte identical
    assert torch.equal(p.view(torch.uint8).view(rows, -1)[~touched], p0.view(rows, -1)[~touched])
    assert torch.equal(s.view(rows, -1)[~touched], s0.view(rows, -1)[~touched])

    idx = torch.where(live, slots, -1).to(torch.int32)[None, :]
    got, valid = gather_window_kv(p, s, idx)
    assert torch.equal(valid[0], live)
    assert bool((got[0][~live] == 0).all())
    if live.any():
        assert_mxfp8_budget(got[0][live], kv[live], s.view(rows, -1)[slots[live]])


def test_window_gather_shape_at_flash_abi():
    p, s = empty_window_cache(FLASH, 2)
    assert p.shape == (2, 128, 1, 512) and s.shape == (2, 128, 1, 16)
    kv = torch.randn(3, 512).to(torch.bfloat16)
    publish_window_kv(p, s, kv, torch.tensor([0, 129, 255]))
    got, valid = gather_window_kv(p, s, torch.tensor([[255, -1, 0, 129]], dtype=torch.int32))
    assert got.shape == (1, 4, 512) and got.dtype == torch.float32
    assert valid.tolist() == [[True, False, True, True]]
    assert_mxfp8_budget(got[0, :1], kv[2:3], s.view(256, 16)[255:256])


def test_window_publish_rejects_bad_slots_before_writing():
    p, s = empty_window_cache(TINY, 1)
    kv = torch.ones(2, TINY.head_dim, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="same slot"):
        publish_window_kv(p, s, kv, torch.tensor([3, 3]))
    with pytest.raises(ValueError, match="past the cache"):
        publish_window_kv(p, s, kv, torch.tensor([0, 16]))
    assert bool((p.view(torch.uint8) == 0).all()) and bool((s == 0).all())
    with pytest.raises(ValueError, match="window_indices"):
        gather_window_kv(p, s, torch.tensor([[-2]], dtype=torch.int32))


def test_compressed_gather_and_concat():
    g = torch.Generator().manual_seed(5)
    bs = TINY.cache.block_size
    rows = torch.randn(2 * bs, TINY.head_dim, generator=g)
    packed, scales = quantize_compressed_kv(rows)
    packed, scales = packed.view(2, bs, 1, -1), scales.view(2, bs, 1, -1)
    idx = torch.tensor([[5, -1, 31]], dtype=torch.int32)
    got, valid = gather_compressed_kv(packed, scales, idx)
    assert valid.tolist() == [[True, False, True]] and bool((got[0, 1] == 0).all())
    assert float((got[0, 2] - rows[31]).norm() / rows[31].norm()) < 0.15  # FP4 budget
    win = (torch.ones(1, 2, TINY.head_dim), torch.tensor([[True, False]]))
    kv, v = concat_kv_parts(win, (got, valid))
    assert kv.shape == (1, 5, TINY.head_dim) and v.tolist() == [[True, False, True, False, True]]
