"""MoE experts golden: one-expert-at-a-time vs a naive dense all-experts computation, EP
partials, SwiGLU clamps and weight-before-W2 on a crafted expert, FLASH memory bound."""

import os
import resource
import threading
import time

import pytest
import torch
from hypothesis import given, settings, strategies as st

from goldens.config import FLASH, TINY
from goldens.moe import (ExpertWeights, Fp4Workspace, combine, dequantize_fp4_fast, ep_partial, moe_block,
                         moe_block_ep, quantize_routed_expert, quantize_shared_expert,
                         routed_expert, routed_partial, swiglu)
from goldens.quant import (dequantize_fp4_expert_weight, dequantize_fp8_weight, dequantize_mxfp8,
                           quantize_mxfp8_activation)
from goldens.router import route
from moe_model import tiny_moe

E, K, I, D = (TINY.moe.n_routed_experts, TINY.moe.num_experts_per_tok,
              TINY.moe.intermediate_size, TINY.hidden_size)
LIMIT = TINY.moe.swiglu_limit


def _contract_ok(actual, reference):
    """Per-row contract bound: RMS(a-r) <= 1e-6 + 0.01 RMS(r), max|a-r| <= 1e-5 + 0.05 RMS(r)."""
    a, r = actual.double(), reference.double()
    diff = a - r
    rms_r = r.square().mean(-1).sqrt()
    ok_rms = diff.square().mean(-1).sqrt() <= 1e-6 + 0.01 * rms_r
    ok_max = diff.abs().amax(-1) <= 1e-5 + 0.05 * rms_r
    return bool((ok_rms & ok_max).all())


def _tiny_model(seed, t=24):
    return tiny_moe(seed, t, TINY)


def _mx64(x):
    p, s = quantize_mxfp8_activation(x)
    return dequantize_mxfp8(p, s).double()


def _naive_dense(x, idx, wt, experts, shared):
    """Every expert on every token in FP64 with a dense [T, E] routing matrix (zero weight for
    unselected pairs), BF16 rounding at the spec'd boundaries, one final cast."""
    t = x.shape[0]
    dense = torch.zeros(t, E, dtype=torch.float64)
    dense.scatter_(1, idx.long(), wt.double())
    a = _mx64(x)

    def ffn(w1, w3, w2, r):
        g = (a @ w1.T).to(torch.bfloat16).double().clamp(max=LIMIT)
        u = (a @ w3.T).to(torch.bfloat16).double().clamp(-LIMIT, LIMIT)
        h = g * torch.sigmoid(g) * u
        if r is not None:
            h = h * r[:, None]
        h = h.to(torch.bfloat16)
        return (_mx64(h) @ w2.T).to(torch.bfloat16).double()

    routed = torch.zeros(t, D, dtype=torch.float64)
    for e, ew in enumerate(experts):
        w1, w3, w2 = (dequantize_fp4_expert_weight(ew.w1, ew.w1_scale).double(),
                      dequantize_fp4_expert_weight(ew.w3, ew.w3_scale).double(),
                      dequantize_fp4_expert_weight(ew.w2, ew.w2_scale).double())
        routed += ffn(w1, w3, w2, dense[:, e])  # unselected: h = 0 -> y = 0
    sw = [dequantize_fp8_weight(p, s).double() for p, s in
          ((shared.w1, shared.w1_scale), (shared.w3, shared.w3_scale),
           (shared.w2, shared.w2_scale))]
    return (ffn(*sw, None) + routed).to(torch.bfloat16)


def test_fast_fp4_dequant_is_bit_identical_to_quant():
    gen = torch.Generator().manual_seed(0)
    packed = torch.randint(0, 256, (64, 128), dtype=torch.uint8, generator=gen)
    scales = torch.randint(0, 255, (64, 8), dtype=torch.uint8, generator=gen)
    assert torch.equal(dequantize_fp4_fast(packed, scales),
                       dequantize_fp4_expert_weight(packed, scales))
    # a reused workspace gives the same values for matrices of either orientation
    ws = Fp4Workspace()
    other = torch.randint(0, 256, (256, 32), dtype=torch.uint8, generator=gen)
    oscales = torch.randint(100, 140, (256, 2), dtype=torch.uint8, generator=gen)
    for p, s in ((packed, scales), (other, oscales), (packed, scales)):
        assert torch.equal(dequantize_fp4_fast(p, s, ws, "w1"), dequantize_fp4_expert_weight(p, s))
    with pytest.raises(ValueError, match="scales"):
        dequantize_fp4_fast(packed, torch.full((64, 8), 255, dtype=torch.uint8))


@settings(max_examples=2, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_one_expert_at_a_time_matches_naive_dense(seed):
    x, idx, wt, experts, shared = _tiny_model(seed)
    got = moe_block(x, idx, wt, experts, shared, TINY)
    ref = _naive_dense(x, idx, wt, experts, shared)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    assert _contract_ok(got, ref)
    # the check can fail: dropping the busiest routed expert breaks it on its rows
    drop = int(torch.bincount(idx.flatten().long(), minlength=E).argmax())
    kept = [routed_partial(x, idx, wt, experts[:drop], TINY, first=0, count=drop),
            routed_partial(x, idx, wt, experts[drop + 1:], TINY, first=drop + 1,
                           count=E - drop - 1)]
    partial = combine(_shared_only(x, shared), kept)
    hit = (idx == drop).any(-1)
    assert not _contract_ok(partial[hit], ref[hit])
    assert _contract_ok(partial[~hit], ref[~hit])


def _shared_only(x, shared):
    from goldens.moe import shared_expert
    return shared_expert(x, shared, TINY)


def test_experts_without_tokens_are_never_fetched():
    x, idx, wt, experts, shared = _tiny_model(3, t=2)
    fetched = []

    class Spy:
        def __getitem__(self, e):
            fetched.append(e)
            return experts[e]

    routed_partial(x, idx, wt, Spy(), TINY)
    assert fetched == sorted(set(idx.flatten().tolist()))


@pytest.fixture(scope="module")
def ep_case():
    x, idx, wt, experts, shared = _tiny_model(11)
    whole = routed_partial(x, idx, wt, experts, TINY)
    return x, idx, wt, experts, shared, whole, moe_block(x, idx, wt, experts, shared, TINY)


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_ep_partials_in_rank_order_reproduce_the_whole(ep_case, ep):
    x, idx, wt, experts, shared, whole, block = ep_case
    n_local = E // ep
    parts = [ep_partial(x, idx, wt, experts[r * n_local:(r + 1) * n_local], TINY, ep, r)
             for r in range(ep)]
    for r, p in enumerate(parts):  # a rank's partial touches only its experts' tokens
        mine = ((idx >= r * n_local) & (idx < (r + 1) * n_local)).any(-1)
        assert bool((p[~mine] == 0).all()) and bool((p[mine] != 0).any(-1).all())
    total = torch.zeros_like(whole)
    for p in parts:
        total = total + p
    torch.testing.assert_close(total, whole, rtol=1e-6, atol=1e-6)
    assert torch.equal(moe_block_ep(x, idx, wt, experts, shared, TINY, ep), block)
    # rank order matters for the expert -> rank mapping: a swapped pair of local lists breaks it
    if ep == 2:
        swapped = [ep_partial(x, idx, wt, experts[n_local:], TINY, ep, 0),
                   ep_partial(x, idx, wt, experts[:n_local], TINY, ep, 1)]
        assert not torch.allclose(swapped[0] + swapped[1], whole, rtol=1e-3, atol=1e-3)


def test_swiglu_clamps_on_large_inputs():
    g = torch.tensor([50.0, 50.0, -50.0, 3.0, 10.0])
    u = torch.tensor([50.0, -50.0, 50.0, 2.0, 11.0])
    got = swiglu(g, u, LIMIT).double()
    sil = lambda v: v / (1 + torch.exp(torch.tensor(-v, dtype=torch.float64)))  # noqa: E731
    ref = torch.stack([sil(10.0) * 10, sil(10.0) * -10, sil(-50.0) * 10, sil(3.0) * 2,
                       sil(10.0) * 10])
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-12)
    # the gate clamp is one-sided: a very negative gate is NOT raised to -limit
    assert abs(float(got[2])) < 1e-15


def test_crafted_expert_clamps_and_weight_before_w2():
    # W1 = W3 = 4*I on the first I channels, W2 = I: g = u = 4x exactly, y = MX(h) exactly
    w1 = torch.zeros(I, D)
    w1[:, :I] = 4 * torch.eye(I)
    w2 = torch.zeros(D, I)
    w2[:I] = torch.eye(I)
    ew = quantize_routed_expert(w1, w1.clone(), w2)
    x = torch.zeros(3, D)
    # multiples of 1/4 up to 4: exact in MXFP8, and 4x spans both clamp sides
    x[:, :I] = (torch.arange(3 * I).reshape(3, I) % 33 - 16).float() / 4
    x = x.to(torch.bfloat16)
    r = torch.tensor([0.3, 1.1, 0.7])
    y = routed_expert(x, r, ew, TINY)
    g = (4 * x[:, :I].float())
    assert bool((g > LIMIT).any()) and bool((g < -LIMIT).any())

    def formula(gc, uc, weight_before):
        h = torch.nn.functional.silu(gc) * uc
        if weight_before:
            h = h * r[:, None]
        mx = _mx64(torch.cat([h.to(torch.bfloat16), torch.zeros(3, D - I, dtype=torch.bfloat16)],
                             1).float()[:, :I].contiguous().to(torch.bfloat16))
        out = mx if weight_before else mx * r[:, None].double()
        return out.to(torch.bfloat16)

    clamped = formula(g.clamp(max=LIMIT), g.clamp(-LIMIT, LIMIT), True)
    assert torch.equal(y[:, :I], clamped)
    assert bool((y[:, I:] == 0).all())
    assert not torch.equal(y[:, :I], formula(g, g, True))          # clamps are active
    assert not torch.equal(y[:, :I], formula(g.clamp(max=LIMIT), g.clamp(-LIMIT, LIMIT), False))


class _RandomFlashExperts:
    """FLASH routed experts materialized on demand, one at a time.  Each matrix is a base
    random byte pattern XOR a per-expert random row (cheap, distinct per expert); scales are
    per-expert random E8M0 codes around 2^-7."""

    def __init__(self, cfg, seed=0):
        gen = torch.Generator().manual_seed(seed)
        i, d = cfg.moe.intermediate_size, cfg.hidden_size
        self.shapes = {"w1": (i, d), "w3": (i, d), "w2": (d, i)}
        self.base = {k: torch.randint(0, 256, (n, kk // 2), dtype=torch.uint8, generator=gen)
                     for k, (n, kk) in self.shapes.items()}
        self.seed = seed
        self.fetched = 0

    def __getitem__(self, e):
        self.fetched += 1
        gen = torch.Generator().manual_seed(self.seed * 1000 + e + 1)
        out = []
        for k, (n, kk) in self.shapes.items():
            row = torch.randint(0, 256, (kk // 2,), dtype=torch.uint8, generator=gen)
            out.append(self.base[k] ^ row)
            out.append(torch.randint(119, 122, (n, kk // 32), dtype=torch.uint8, generator=gen))
        return ExpertWeights(*out)


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
def test_flash_moe_192_tokens_stays_under_8_gib():
    cfg = FLASH
    gen = torch.Generator().manual_seed(0)
    t, i, d = cfg.cache.decode_max_tokens, cfg.moe.intermediate_size, cfg.hidden_size
    x = torch.randn(t, d, generator=gen).to(torch.bfloat16)
    idx, wt = route(x, torch.randn(cfg.moe.n_routed_experts, d, generator=gen) * 0.02,
                    torch.zeros(cfg.moe.n_routed_experts), cfg)
    shared = quantize_shared_expert(torch.randn(i, d, generator=gen) * 0.02,
                                    torch.randn(i, d, generator=gen) * 0.02,
                                    torch.randn(d, i, generator=gen) * 0.02)
    experts = _RandomFlashExperts(cfg)
    peak, stop = [_rss_bytes()], threading.Event()
    base = peak[0]

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    try:
        out = moe_block(x, idx, wt, experts, shared, cfg)
    finally:
        stop.set()
        sampler.join()
    elapsed = time.perf_counter() - t0
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    growth = max(peak[0], maxrss) - base
    print(f"\nFLASH MoE {t} tokens: {elapsed:.1f} s, {experts.fetched} experts fetched, "
          f"peak RSS growth {growth / 2**30:.2f} GiB (sampled {(peak[0] - base) / 2**30:.2f})")
    assert out.shape == (t, d) and out.dtype == torch.bfloat16
    assert bool(torch.isfinite(out.float()).all()) and float(out.float().abs().max()) > 0
    assert experts.fetched == len(set(idx.flatten().tolist()))
    assert growth < 8 * 2**30
