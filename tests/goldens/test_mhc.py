"""mHC golden: mixes formula, Sinkhorn pass count, collapse/expand against per-element loops,
delayed pre-mix staggering."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from goldens.config import FLASH, TINY
from goldens.mhc import (HcSiteWeights, hc_block, hc_head, hc_mixes, hc_post, hc_pre, hc_site,
                         initial_pre_mix, sinkhorn)

HC = TINY.hc.hc_mult
D = TINY.hidden_size


def _bf16_lanes(t, gen):
    """Residual lanes hold BF16 values stored FP32."""
    return torch.randn(t, HC, D, generator=gen).to(torch.bfloat16).to(torch.float32)


def _site_weights(gen, fn_scale=0.05):
    return HcSiteWeights(fn=torch.randn(TINY.mix_hc, TINY.hc_dim, generator=gen) * fn_scale,
                         scale=torch.rand(3, generator=gen) + 0.5,
                         base=torch.randn(TINY.mix_hc, generator=gen) * 0.5)


def _loop_sinkhorn(logits, passes, eps):
    """Independent scalar loop: softmax rows, column pass, then (row, column) pairs."""
    n = logits.shape[0]
    m = [[0.0] * n for _ in range(n)]
    for i in range(n):
        mx = max(float(v) for v in logits[i])
        e = [math.exp(float(v) - mx) for v in logits[i]]
        s = sum(e)
        for j in range(n):
            m[i][j] = e[j] / s + eps

    def cols():
        for j in range(n):
            c = sum(m[i][j] for i in range(n)) + eps
            for i in range(n):
                m[i][j] /= c

    def rows():
        for i in range(n):
            r = sum(m[i]) + eps
            for j in range(n):
                m[i][j] /= r

    cols()
    for _ in range(passes - 1):
        rows()
        cols()
    return torch.tensor(m, dtype=torch.float64)


def test_sinkhorn_pass_count_is_exactly_twenty():
    assert TINY.hc.sinkhorn_iters == FLASH.hc.sinkhorn_iters == 20
    # a near-triangular matrix has (almost) no doubly-stochastic support and converges
    # sublinearly, so neighbouring pass counts stay far apart
    a = 8.0
    logits = torch.tensor([[a, a, a, a], [-a, a, a, a], [-a, -a, a, a], [-a, -a, -a, a]])
    got = sinkhorn(logits, TINY).double()
    ref20 = _loop_sinkhorn(logits, 20, TINY.hc.eps)
    torch.testing.assert_close(got, ref20, rtol=0, atol=1e-5)
    for other in (19, 21):
        diff = (got - _loop_sinkhorn(logits, other, TINY.hc.eps)).abs().max()
        assert diff > 1e-3, f"{other} passes are indistinguishable from 20 (diff {diff})"


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_sinkhorn_doubly_stochastic(seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(8, HC, HC, generator=gen)
    m = sinkhorn(logits, TINY)
    assert m.dtype == torch.float32 and bool((m > 0).all())
    # ends on a column pass: columns to ~eps, rows to the truncation level
    torch.testing.assert_close(m.sum(-2), torch.ones(8, HC), rtol=0, atol=1e-5)
    torch.testing.assert_close(m.sum(-1), torch.ones(8, HC), rtol=0, atol=1e-3)


def test_hc_mixes_formula_against_fp64_loop():
    gen = torch.Generator().manual_seed(1)
    x = _bf16_lanes(3, gen)
    w = _site_weights(gen)
    mixes = hc_mixes(x, w, TINY)
    assert mixes.pre.shape == (3, HC) and mixes.post.shape == (3, HC)
    assert mixes.comb.shape == (3, HC, HC)
    fn, sc, base = w.fn.double(), w.scale.double(), w.base.double()
    for t in range(3):
        flat = x[t].double().reshape(-1)
        rstd = 1.0 / math.sqrt(float((flat * flat).sum()) / flat.numel() + TINY.rms_norm_eps)
        mix = [float((fn[j] * flat).sum()) * rstd for j in range(TINY.mix_hc)]
        sig = lambda v: 1.0 / (1.0 + math.exp(-v))  # noqa: E731
        pre = [sig(mix[h] * sc[0] + base[h]) + TINY.hc.eps for h in range(HC)]
        post = [2 * sig(mix[HC + h] * sc[1] + base[HC + h]) for h in range(HC)]
        logits = torch.tensor([mix[2 * HC + k] * float(sc[2]) + float(base[2 * HC + k])
                               for k in range(HC * HC)]).reshape(HC, HC)
        comb = _loop_sinkhorn(logits, 20, TINY.hc.eps)
        torch.testing.assert_close(mixes.pre[t].double(), torch.tensor(pre, dtype=torch.float64),
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(mixes.post[t].double(),
                                   torch.tensor(post, dtype=torch.float64), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(mixes.comb[t].double(), comb, rtol=1e-4, atol=1e-5)


def test_hc_mixes_rms_is_one_statistic_over_all_lanes():
    # scaling every lane by the same factor leaves the mixes unchanged (unweighted RMS norm)
    gen = torch.Generator().manual_seed(2)
    x = _bf16_lanes(2, gen)
    w = _site_weights(gen)
    a, b = hc_mixes(x, w, TINY), hc_mixes(x * 8.0, w, TINY)
    torch.testing.assert_close(a.pre, b.pre, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.comb, b.comb, rtol=1e-4, atol=1e-6)
    # ... but scaling one lane does change them
    x2 = x.clone()
    x2[:, 1] *= 8.0
    assert not torch.allclose(hc_mixes(x2, w, TINY).pre, a.pre, rtol=1e-3, atol=1e-4)


@settings(max_examples=4, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 3))
def test_hc_pre_matches_scalar_loop(seed, t):
    gen = torch.Generator().manual_seed(seed)
    x = _bf16_lanes(t, gen)
    pre = torch.rand(t, HC, generator=gen) + 1e-6
    got = hc_pre(x, pre, TINY)
    assert got.dtype == torch.bfloat16 and got.shape == (t, D)
    xn, pn = x.numpy(), pre.numpy()
    ref = np.zeros((t, D), dtype=np.float32)
    for i in range(t):
        for d in range(D):
            acc = np.float32(pn[i, 0] * xn[i, 0, d])
            for h in range(1, HC):
                acc = np.float32(acc + np.float32(pn[i, h] * xn[i, h, d]))
            ref[i, d] = acc
    assert torch.equal(got, torch.from_numpy(ref).to(torch.bfloat16))


@settings(max_examples=4, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 3))
def test_hc_post_matches_scalar_loop(seed, t):
    gen = torch.Generator().manual_seed(seed)
    x = _bf16_lanes(t, gen)
    y = torch.randn(t, D, generator=gen).to(torch.bfloat16)
    post = 2 * torch.rand(t, HC, generator=gen)
    comb = torch.rand(t, HC, HC, generator=gen)  # deliberately not symmetric
    got = hc_post(y, x, post, comb, TINY)
    assert got.dtype == torch.float32 and got.shape == (t, HC, D)
    assert torch.equal(got, got.to(torch.bfloat16).to(torch.float32))  # BF16 values
    xn, yn, pn, mn = x.numpy(), y.float().numpy(), post.numpy(), comb.numpy()
    ref = np.zeros((t, HC, D), dtype=np.float32)
    for i in range(t):
        for o in range(HC):
            for d in range(D):
                acc = np.float32(pn[i, o] * yn[i, d])
                for k in range(HC):  # reduction over the FIRST (input-lane) axis of comb
                    acc = np.float32(acc + np.float32(mn[i, k, o] * xn[i, k, d]))
                ref[i, o, d] = acc
    assert torch.equal(got, torch.from_numpy(ref).to(torch.bfloat16).to(torch.float32))
    # the transpose would be a different operator
    assert not torch.equal(got, hc_post(y, x, post, comb.transpose(1, 2), TINY))


def test_initial_pre_mix_is_one_hot_lane_zero():
    m = initial_pre_mix(5, TINY)
    assert m.dtype == torch.float32 and m.shape == (5, HC)
    assert torch.equal(m[:, 0], torch.ones(5)) and torch.equal(m[:, 1:], torch.zeros(5, HC - 1))
    x = _bf16_lanes(5, torch.Generator().manual_seed(3))
    assert torch.equal(hc_pre(x, m, TINY), x[:, 0].to(torch.bfloat16))


def test_delayed_pre_mix_staggers_across_two_sites():
    gen = torch.Generator().manual_seed(4)
    x0 = _bf16_lanes(3, gen)
    w_attn, w_ffn = _site_weights(gen), _site_weights(gen)
    seen = {}

    def attention(h):
        seen["attn_in"] = h.clone()
        return (h.float() * 0.5).to(torch.bfloat16)

    def ffn(h):
        seen["ffn_in"] = h.clone()
        return (h.float().tanh()).to(torch.bfloat16)

    incoming = initial_pre_mix(3, TINY)
    x2, next_pre = hc_block(x0, incoming, w_attn, attention, w_ffn, ffn, TINY)

    m_attn = hc_mixes(x0, w_attn, TINY)
    # Attention collapses with the INCOMING (one-hot) mix, not its own pre
    assert torch.equal(seen["attn_in"], x0[:, 0].to(torch.bfloat16))
    assert not torch.equal(seen["attn_in"], hc_pre(x0, m_attn.pre, TINY))
    x1 = hc_post(attention(x0[:, 0].to(torch.bfloat16)), x0, m_attn.post, m_attn.comb, TINY)
    # FFN collapses the post-Attention lanes with the ATTENTION site's pre
    assert torch.equal(seen["ffn_in"], hc_pre(x1, m_attn.pre, TINY))
    m_ffn = hc_mixes(x1, w_ffn, TINY)
    assert torch.equal(x2, hc_post(ffn(hc_pre(x1, m_attn.pre, TINY)), x1, m_ffn.post,
                                   m_ffn.comb, TINY))
    # the Block hands the FFN pre to the next layer; the head collapses with it
    assert torch.equal(next_pre, m_ffn.pre)
    assert torch.equal(hc_head(x2, next_pre, TINY), hc_pre(x2, m_ffn.pre, TINY))
    # hc_site alone returns its own pre as the delayed coefficient
    _, own = hc_site(x0, incoming, w_attn, attention, TINY)
    assert torch.equal(own, m_attn.pre)


def test_shape_errors_name_the_argument():
    x = torch.zeros(2, HC, D)
    with pytest.raises(ValueError, match="pre"):
        hc_pre(x, torch.zeros(2, HC + 1), TINY)
    with pytest.raises(ValueError, match="x_hc"):
        hc_pre(torch.zeros(2, HC, D + 1), torch.zeros(2, HC), TINY)
    with pytest.raises(ValueError, match="logits"):
        sinkhorn(torch.zeros(3, 3), TINY)
