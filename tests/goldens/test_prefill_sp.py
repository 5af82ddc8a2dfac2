"""goldens.prefill_sp: the prefill sequence-parallel Attention site at TINY.

The reference is the replicated composition built here from the existing goldens (local rows
= all rows): ``hc_mixes``, ``hc_pre`` with the incoming pre-mix, ``attn_norm``, the mode's
``attention_half_layer`` in the replicated (all-reduce) wiring at the same TP size,
``hc_post``; at TP 1 also ``goldens.forward.attention_site`` (the model's own site).

Comparator: EXACT byte equality on the active rows.  The arithmetic is the same: the mHC
goldens give a row the same bytes in any batch (FP64-accumulated products and sigmoid,
elementwise collapse / expand, FP64 RMS statistic; tests/goldens/test_batch_invariance.py),
the gathered attention input equals the replicated input on the active rows, and the
reduce-scatter is the all-reduce's rank-ordered FP32 sum with one BF16 cast.  So the
contract's per-row RMS/peak bound would only hide a real defect here.

Inactive input rows of the SP slabs are NaN (and the replicated input's padding rows finite
junk): an SP output that read one would not be finite or not zero.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from goldens.config import TINY, Mode, slab_width
from goldens.forward import AttentionSiteWeights, attention_site
from goldens.mhc import HcSiteWeights, hc_mixes, hc_post, hc_pre
from goldens.modes import (ForwardBatch, ModelCaches, RopeTables, attention_half_layer,
                           build_forward_batch, changed_keys, random_mode_weights,
                           snapshot_caches)
from goldens.norm import rms_norm
from goldens.prefill_sp import (SpGroupInputs, local_active_rows, prefill_sp_dp,
                                prefill_sp_site)

from cache_history import fill_history

CFG = TINY
I32 = torch.int32
BS = CFG.cache.block_size
HC, D = CFG.hc.hc_mult, CFG.hidden_size
ROPE = RopeTables.build(CFG, 256)
LAYERS = list(range(CFG.num_layers))
MODE_LAYER = {m: CFG.representative_layer(m) for m in Mode}
NAN = float("nan")

# packed prefill chunks (with and without a cached prefix), reserved capacity
CAPACITY = [24, 40, 32]
MAIN = dict(rows=[5, 3, 6], kv=[0, 20, 9], pad=3)  # 14 active of T = 17
FEW = dict(rows=[1, 1, 0], kv=[0, 20, 9], pad=15)  # 2 of 17: TP4 ranks 1-3 empty
SHORT = dict(rows=[2, 1, 0], kv=[3, 0, 9], pad=0)  # T = 3 < TP4: rank 3 past T
IDLE = dict(rows=[0, 0, 0], kv=[4, 20, 9], pad=17)  # an idle DP group
ONE = dict(rows=[0, 1, 0], kv=[4, 20, 9], pad=16)  # a one-token DP group


def _site_weights(layer: int) -> AttentionSiteWeights:
    g = torch.Generator().manual_seed(500 + layer)
    mix, hc_dim = CFG.mix_hc, CFG.hc_dim
    hc = HcSiteWeights(torch.randn(mix, hc_dim, generator=g) * hc_dim ** -0.5,
                       torch.rand(3, generator=g) * 1.5 + 0.5, torch.randn(mix, generator=g))
    norm = 1.0 + 0.1 * torch.randn(D, generator=g)
    return AttentionSiteWeights(hc, norm, random_mode_weights(CFG, layer, seed=11))


SITES = {layer: _site_weights(layer) for layer in LAYERS}


# ---- fixtures --------------------------------------------------------------------------------

class Scenario:
    """Three requests with scattered page tables, caches full of random history."""

    def __init__(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        B, pages = len(CAPACITY), -(-max(CAPACITY) // BS) + 1
        self.window_table = torch.randperm(B * pages, generator=g).to(I32).view(B, pages)
        cpages = {1: pages, 2: -(-max(CAPACITY) // (2 * BS)) + 1}
        blocks = B * max(cpages.values()) + 1
        self.ctables = {}
        for r in (2, 1):
            t = torch.randperm(blocks, generator=g)[:B * cpages[r]].to(I32).view(B, cpages[r])
            for src in CFG.kv_source_layer_ids:
                if CFG.compress_ratios[src] == r:
                    self.ctables[src] = t
        self.state_blocks = B + 2
        sperm = torch.randperm(self.state_blocks, generator=g)[:B].to(I32)[:, None]
        self.stables = {s: sperm.clone() for s in CFG.kv_source_layer_ids
                        if CFG.compress_ratios[s] == 2}
        self.caches = ModelCaches.allocate(CFG, window_blocks=B * pages, compressed_blocks=blocks,
                                           state_blocks=self.state_blocks, fill=0x22)
        fill_history(self.caches, CFG, g)

    def batch(self, case: dict) -> ForwardBatch:
        qsl = torch.tensor([0] + torch.tensor(case["rows"]).cumsum(0).tolist(), dtype=I32)
        return build_forward_batch(CFG, qsl, torch.tensor(case["kv"], dtype=I32),
                                   self.window_table, self.ctables, self.stables,
                                   num_padded_tokens=sum(case["rows"]) + case["pad"],
                                   num_state_blocks=self.state_blocks)


def site_inputs(layer: int, T: int, salt: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-order residual lanes FP32 [T, hc, D] (BF16 values) and incoming pre-mix [T, hc]."""
    g = torch.Generator().manual_seed(7000 + 31 * layer + salt)
    x_hc = torch.randn(T, HC, D, generator=g).bfloat16().float()
    pre = torch.rand(T, HC, generator=g) + 0.05
    return x_hc, pre


def to_slabs(full: torch.Tensor, n: int, tp: int, junk: float = NAN) -> list[torch.Tensor]:
    """Rank slabs of ``ceil(T / tp)`` rows: the active rows of ``full``, ``junk`` elsewhere."""
    T = full.shape[0]
    w = slab_width(T, tp)
    out = []
    for r in range(tp):
        s = torch.full((w, *full.shape[1:]), junk)
        c = local_active_rows(n, T, tp, r)
        s[:c] = full[r * w:r * w + c]
        out.append(s)
    return out


def unshard(slabs: list[torch.Tensor], n: int) -> torch.Tensor:
    return torch.cat(slabs)[:n]


def replicated_site(layer, x_hc, pre, caches, batch, tp):
    """The reference: the same site with replicated residuals (every rank holds all rows)."""
    w = SITES[layer]
    m = hc_mixes(x_hc, w.hc, CFG)
    x = rms_norm(hc_pre(x_hc, pre, CFG), w.norm, CFG.rms_norm_eps)
    y, _, aux = attention_half_layer(CFG, layer, x, w.attention, caches, batch, ROPE, tp=tp)
    return hc_post(y, x_hc, m.post, m.comb, CFG), y, m.pre, x, aux


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def caches_equal(a: ModelCaches, b: ModelCaches) -> bool:
    ta, tb = a.tensors(), b.tensors()
    return ta.keys() == tb.keys() and all(same_bytes(ta[k], tb[k]) for k in ta)


def assert_inactive_zero(res, n: int, T: int, tp: int):
    """Every inactive slab row (past the rank's active count) of all three outputs is exactly
    zero, active rows are finite; the gathered input is zero at or past ``n``."""
    for r in range(tp):
        c = local_active_rows(n, T, tp, r)
        for name in ("x_hc_out", "attn_output", "next_pre_mix"):
            s = getattr(res, name)[r]
            assert s.shape[0] == slab_width(T, tp), (name, r)
            assert bool((s[c:] == 0).all()), (name, r)
            assert bool(torch.isfinite(s[:c].float()).all()), (name, r)
    assert bool((res.attn_input[n:] == 0).all())


@pytest.fixture(scope="module")
def walk():
    """The MAIN batch, every layer once in order (replicated, TP 1) so Reuse / Reindex layers
    find their sources' scratch; ``before[layer]`` are the caches just before each layer."""
    sc = Scenario(seed=1)
    batch = sc.batch(MAIN)
    sc.caches.begin_forward(CFG, batch)
    before = {}
    for layer in LAYERS:
        before[layer] = sc.caches.clone()
        x_hc, pre = site_inputs(layer, batch.tokens)
        replicated_site(layer, x_hc, pre, sc.caches, batch, 1)
    return batch, before


# ---- (a) SP == replicated, every mode and TP -------------------------------------------------

def test_local_active_rows_is_the_contract_formula():
    for T in (0, 1, 3, 7, 17):
        for tp in (1, 2, 4, 8):
            w = -(-T // tp)
            for n in range(T + 1):
                got = [local_active_rows(n, T, tp, r) for r in range(tp)]
                assert got == [max(0, min(w, n - r * w)) for r in range(tp)]
                assert sum(got) == n


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
def test_sp_equals_replicated_on_active_rows(mode, tp, walk):
    batch, before = walk
    layer, T, n = MODE_LAYER[mode], batch.tokens, batch.active
    x_hc, pre = site_inputs(layer, T)
    sp_caches, rep_caches = before[layer].clone(), before[layer].clone()
    res = prefill_sp_site(CFG, layer, SpGroupInputs(to_slabs(x_hc, n, tp), to_slabs(pre, n, tp),
                                                    batch, sp_caches), n, SITES[layer], ROPE, tp=tp)
    x_out, y, pre_out, x_norm, aux = replicated_site(layer, x_hc, pre, rep_caches, batch, tp)
    assert same_bytes(unshard(res.x_hc_out, n), x_out[:n])
    assert same_bytes(unshard(res.attn_output, n), y[:n])
    assert same_bytes(unshard(res.next_pre_mix, n), pre_out[:n])
    assert same_bytes(res.attn_input[:n], x_norm[:n])
    assert bool(y[:n].abs().amax(-1).gt(0).all())  # the site really produced output
    assert caches_equal(sp_caches, rep_caches)  # same cache bytes, scratch included
    if aux.topk_rows is not None:
        assert torch.equal(res.aux.topk_rows, aux.topk_rows)
    assert_inactive_zero(res, n, T, tp)
    if tp == 1:  # the model's own Attention site
        model_x, model_pre = attention_site(CFG, layer, x_hc, pre, SITES[layer],
                                            before[layer].clone(), batch, ROPE)
        assert same_bytes(unshard(res.x_hc_out, n), model_x[:n])
        assert same_bytes(unshard(res.next_pre_mix, n), model_pre[:n])


# ---- (b) inactive rows, empty ranks, (d) two consecutive boundaries --------------------------

def chain(case: dict, tp: int):
    """Every layer in order, each site's x_hc_out / next_pre_mix slabs feeding the next SP site
    directly, next to the replicated chain; returns the pairs compared per layer."""
    sp_sc, rep_sc = Scenario(seed=4), Scenario(seed=4)
    batch = sp_sc.batch(case)
    T, n = batch.tokens, batch.active
    sp_sc.caches.begin_forward(CFG, batch)
    rep_sc.caches.begin_forward(CFG, batch)
    x_hc, pre = site_inputs(0, T, salt=1)
    slabs, pres = to_slabs(x_hc, n, tp), to_slabs(pre, n, tp)
    for layer in LAYERS:
        res = prefill_sp_site(CFG, layer, SpGroupInputs(slabs, pres, batch, sp_sc.caches), n,
                              SITES[layer], ROPE, tp=tp)
        x_hc, y, pre, _, _ = replicated_site(layer, x_hc, pre, rep_sc.caches, batch, tp)
        assert same_bytes(unshard(res.x_hc_out, n), x_hc[:n]), layer
        assert same_bytes(unshard(res.attn_output, n), y[:n]), layer
        assert same_bytes(unshard(res.next_pre_mix, n), pre[:n]), layer
        assert_inactive_zero(res, n, T, tp)
        slabs, pres = res.x_hc_out, res.next_pre_mix  # inactive rows zero, never read
    assert caches_equal(sp_sc.caches, rep_sc.caches)
    return res


@pytest.mark.parametrize("tp", [2, 4])
def test_residual_and_pre_mix_pass_consecutive_boundaries(tp):
    chain(MAIN, tp)


@pytest.mark.parametrize("case", [FEW, SHORT], ids=["few", "short"])
def test_empty_ranks_are_exact_zero(case):
    tp = 4
    res = chain(case, tp)
    T, n = sum(case["rows"]) + case["pad"], sum(case["rows"])
    empty = [r for r in range(tp) if local_active_rows(n, T, tp, r) == 0]
    assert empty == [1, 2, 3] if case is FEW else empty == [3]
    for r in empty:
        for name in ("x_hc_out", "attn_output", "next_pre_mix"):
            assert bool((getattr(res, name)[r] == 0).all()), (name, r)


# ---- (c) empty DP groups ----------------------------------------------------------------------

@pytest.mark.parametrize("second", [IDLE, ONE], ids=["idle", "one_token"])
def test_dp_groups_run_independently_and_an_empty_group_touches_no_cache_byte(second):
    """Two DP groups (``--dp-tokens 14,0`` / ``14,1``) through every layer: each group equals
    its own single-group run; the idle group returns zero slabs and changes no byte."""
    tp = 4
    live, other, alone, other_alone = (Scenario(seed=5), Scenario(seed=6), Scenario(seed=5),
                                       Scenario(seed=6))
    lb, ob = live.batch(MAIN), other.batch(second)
    for s, b in ((live, lb), (other, ob), (alone, lb), (other_alone, ob)):
        s.caches.begin_forward(CFG, b)
    before = snapshot_caches(other.caches)
    counts = [lb.active, ob.active]
    for layer in LAYERS:
        ins = [site_inputs(layer, b.tokens, salt=g) for g, b in enumerate((lb, ob))]
        slabs = [(to_slabs(x, n, tp), to_slabs(p, n, tp)) for (x, p), n in zip(ins, counts)]
        groups = [SpGroupInputs(*slabs[0], lb, live.caches),
                  SpGroupInputs(*slabs[1], ob, other.caches)]
        res = prefill_sp_dp(CFG, layer, groups, counts, SITES[layer], ROPE, tp=tp)
        refs = [prefill_sp_site(CFG, layer, SpGroupInputs(*slabs[g], b, c), counts[g],
                                SITES[layer], ROPE, tp=tp)
                for g, (b, c) in enumerate(((lb, alone.caches), (ob, other_alone.caches)))]
        for g in range(2):
            for name in ("x_hc_out", "attn_output", "next_pre_mix"):
                assert all(same_bytes(a, b) for a, b in zip(getattr(res[g], name),
                                                            getattr(refs[g], name))), (layer, g)
            assert_inactive_zero(res[g], counts[g], [lb, ob][g].tokens, tp)
        if second is IDLE:
            for name in ("x_hc_out", "attn_output", "next_pre_mix"):
                assert all(bool((s == 0).all()) for s in getattr(res[1], name)), (layer, name)
            assert res[1].aux is None and res[1].num_tokens == 0
            assert bool((res[1].attn_input == 0).all())
        else:
            assert bool(res[1].attn_output[0][0].abs().gt(0).any())
    assert caches_equal(live.caches, alone.caches)
    assert caches_equal(other.caches, other_alone.caches)
    assert live.caches.scratch.published  # the live group did write
    if second is IDLE:
        assert changed_keys(before, other.caches) == set()
        assert other.caches.scratch.published == set()
    else:
        assert changed_keys(before, other.caches)


# ---- (e) bad input -----------------------------------------------------------------------------

@pytest.fixture()
def bad_setup():
    """Two DP groups at TP 4 after the SWA layers; layer 2 (C2A Full) is next."""
    tp = 4
    a, b = Scenario(seed=7), Scenario(seed=8)
    ba, bb = a.batch(MAIN), b.batch(FEW)
    a.caches.begin_forward(CFG, ba)
    b.caches.begin_forward(CFG, bb)
    groups = []
    for s, bt in ((a, ba), (b, bb)):
        x_hc, pre = site_inputs(2, bt.tokens)
        groups.append(SpGroupInputs(to_slabs(x_hc, bt.active, tp), to_slabs(pre, bt.active, tp),
                                    bt, s.caches))
    return tp, groups, [ba.active, bb.active]


def _refused(groups, match, *, layer=2, counts=None, tp=4, single=None):
    """The call raises ValueError matching ``match`` and no group's cache byte changes."""
    snaps = [snapshot_caches(g.caches) for g in groups]
    published = [set(g.caches.scratch.published) for g in groups]
    with pytest.raises(ValueError, match=match):
        if single is None:
            prefill_sp_dp(CFG, layer, groups, counts, SITES[layer], ROPE, tp=tp)
        else:
            prefill_sp_site(CFG, layer, groups[0], single, SITES[layer], ROPE, tp=tp)
    for g, snap, pub in zip(groups, snaps, published):
        assert changed_keys(snap, g.caches) == set()
        assert g.caches.scratch.published == pub


def test_bad_counts_are_refused_by_name(bad_setup):
    tp, groups, counts = bad_setup
    _refused(groups, r"num_tokens: 18 outside \[0, T=17\]", single=18)
    _refused(groups, r"num_tokens: 13 must equal inputs\.batch\.metadata\.num_tokens .* = 14",
             single=13)
    _refused(groups, r"num_tokens\[2\]: 0 != num_tokens\[0\] = 14; TP peers",
             single=[14, 14, 0, 14])
    _refused(groups, r"num_tokens: 3 per-rank counts, expected one per TP rank \(4\)",
             single=[14, 14, 14])
    _refused(groups, r"dp_tokens: 1 counts for 2 DP groups", counts=counts[:1])
    _refused(groups, r"dp_tokens\[1\]: 3 must equal groups\[1\]\.batch\.metadata\.num_tokens",
             counts=[counts[0], 3])
    _refused(groups, r"dp_tokens\[1\]: 18 outside \[0, T=17\]", counts=[counts[0], 18])
    _refused(groups, r"tp: 3 is not one of", counts=counts, tp=3)
    # the prefill_sp_dp call itself succeeds on the same inputs (the fixture is valid)
    prefill_sp_dp(CFG, 2, groups, counts, SITES[2], ROPE, tp=tp)


def test_bad_slabs_are_refused_by_name(bad_setup):
    tp, groups, counts = bad_setup
    g1 = groups[1]
    wide = list(g1.x_hc)
    wide[1] = torch.zeros(6, HC, D)
    _refused([groups[0], dataclasses.replace(g1, x_hc=wide)],
             r"groups\[1\]\.x_hc\[1\]: 6 rows.*T_local = ceil\(T/tp\) = ceil\(17/4\) = 5",
             counts=counts)
    _refused([groups[0], dataclasses.replace(g1, incoming_pre=list(g1.incoming_pre)[:3])],
             r"groups\[1\]\.incoming_pre: expected a list of one slab per TP rank \(4\), got 3",
             counts=counts)
    bf16 = [s.bfloat16() for s in g1.incoming_pre]
    _refused([groups[0], dataclasses.replace(g1, incoming_pre=bf16)],
             r"groups\[1\]\.incoming_pre\[0\]: dtype torch.bfloat16", counts=counts)
    _refused([groups[0], dataclasses.replace(g1, caches=groups[0].caches)],
             r"groups\[1\]\.caches: the same ModelCaches object as groups\[0\]", counts=counts)


def test_bad_metadata_and_mode_state_are_refused_before_any_group_runs(bad_setup):
    tp, groups, counts = bad_setup
    g0, g1 = groups
    pos0 = g0.batch.metadata.position_ids.clone()
    pos0[3] += 2  # inside request 0's 5-row chunk
    bad = ForwardBatch(dataclasses.replace(g0.batch.metadata, position_ids=pos0),
                       g0.batch.compressed_block_tables)
    _refused([g1, dataclasses.replace(g0, batch=bad)],
             r"groups\[1\]\.batch\.metadata\.position_ids\[3\]: 5, expected 3 \(positions must "
             r"be consecutive inside request 0", counts=[counts[1], counts[0]])
    # group 1 cannot run a Reuse layer whose source has not published in its forward; group 0
    # can, and must not run either
    res = prefill_sp_dp(CFG, 2, [groups[0]], [counts[0]], SITES[2], ROPE, tp=tp)
    assert res[0].aux.topk_rows is not None
    x_hc, pre = site_inputs(3, g1.batch.tokens)
    g1_reuse = SpGroupInputs(to_slabs(x_hc, counts[1], tp), to_slabs(pre, counts[1], tp),
                             g1.batch, g1.caches)
    x_hc, pre = site_inputs(3, g0.batch.tokens)
    g0_reuse = SpGroupInputs(to_slabs(x_hc, counts[0], tp), to_slabs(pre, counts[0], tp),
                             g0.batch, g0.caches)
    _refused([g0_reuse, g1_reuse], r"index source 2 has not published", layer=3, counts=counts)
    # an idle group is not asked for its sources: it runs nothing
    idle = dataclasses.replace(g1_reuse, batch=Scenario(seed=8).batch(IDLE))
    res = prefill_sp_dp(CFG, 3, [g0_reuse, idle], [counts[0], 0], SITES[3], ROPE, tp=tp)
    assert res[0].aux is not None and res[1].aux is None
