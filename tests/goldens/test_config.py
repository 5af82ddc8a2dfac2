"""Presets, layer schedule and parallel arithmetic of goldens.config."""

from collections import Counter
from dataclasses import replace

import pytest

from goldens.config import (FLASH, TINY, ConfigError, Mode, Parallel, layer_config, local_experts,
                            local_heads, local_o_groups, local_o_width, local_vocab, preset,
                            rank_slab, slab_width)


def test_flash_values_from_the_released_config():
    c = FLASH
    assert (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.head_dim) == (129280, 5120, 40, 64, 512)
    assert (c.rope_dim, c.nope_dim, c.q_lora_rank, c.o_lora_rank, c.o_groups) == (64, 448, 1280, 1024, 8)
    assert (c.sliding_window, c.rms_norm_eps) == (128, 1e-20)
    r = c.rope
    assert (r.theta, r.compress_theta, r.factor, r.beta_fast, r.beta_slow) == (10000.0, 160000.0, 16.0, 32, 1)
    assert (r.original_max_position, r.max_position) == (65536, 1048576)
    m = c.moe
    assert (m.n_routed_experts, m.n_shared_experts, m.num_experts_per_tok, m.intermediate_size) == (384, 1, 6, 2304)
    assert (m.scoring_func, m.routed_scaling_factor, m.swiglu_limit, m.norm_topk_prob) == ("sqrtsoftplus", 1.5, 10.0, True)
    i = c.index
    assert (i.n_heads, i.head_dim, i.topk, i.candidate_topk_blocks, i.candidate_block_size) == (32, 128, 512, 2048, 8)
    assert c.compress_ratios == (0, 0) + (2,) * 18 + (1,) * 20
    assert c.kv_source_layer_ids == (2, 8, 14, 20)
    assert c.index_source_layer_ids == (2, 8, 14, 20, 24, 28, 32, 36)
    assert c.candidate_source_layer_id == 20
    assert (c.hc.hc_mult, c.hc.sinkhorn_iters, c.hc.eps, c.hc_dim, c.mix_hc) == (4, 20, 1e-6, 20480, 24)
    k = c.cache
    assert (k.block_size, k.state_capacity, c.state_width) == (128, 4, 1024)
    assert (k.window_group, k.compressed_group, k.index_group) == (32, 16, 32)
    assert (k.max_batch_per_dp, k.decode_max_tokens, k.prefill_max_tokens) == (32, 192, 4096)
    assert c.o_group_in == 4096
    assert c.engram.layer_ids == (1, 14)
    assert c.quant.weight_block_size == (32, 32) and c.quant.scale_fmt == "ue8m0"


def test_flash_schedule_counts():
    counts = Counter(lc.mode for lc in FLASH.layers())
    assert counts == {Mode.SWA: 2, Mode.C2A_FULL: 3, Mode.C2A_REUSE: 15, Mode.C1A_FULL: 1,
                      Mode.C1A_REINDEX: 4, Mode.C1A_REUSE: 15}


@pytest.mark.parametrize("layer,mode,kv,idx,cand", [
    (0, Mode.SWA, None, None, None), (1, Mode.SWA, None, None, None),
    (2, Mode.C2A_FULL, 2, 2, None), (3, Mode.C2A_REUSE, 2, 2, None),
    (8, Mode.C2A_FULL, 8, 8, None), (13, Mode.C2A_REUSE, 8, 8, None),
    (19, Mode.C2A_REUSE, 14, 14, None), (20, Mode.C1A_FULL, 20, 20, 20),
    (21, Mode.C1A_REUSE, 20, 20, 20), (24, Mode.C1A_REINDEX, 20, 24, 20),
    (27, Mode.C1A_REUSE, 20, 24, 20), (39, Mode.C1A_REUSE, 20, 36, 20),
])
def test_flash_layer_sources(layer, mode, kv, idx, cand):
    lc = layer_config(layer)
    assert (lc.mode, lc.kv_source, lc.index_source, lc.candidate_source) == (mode, kv, idx, cand)
    assert lc.rope_profile == ("base" if mode is Mode.SWA else "compressed")
    assert lc.is_candidate_source == (layer == 20)


def test_representative_layers_match_the_contract():
    reps = {m: FLASH.representative_layer(m) for m in Mode}
    assert reps == {Mode.SWA: 0, Mode.C2A_FULL: 2, Mode.C2A_REUSE: 3, Mode.C1A_FULL: 20,
                    Mode.C1A_REUSE: 21, Mode.C1A_REINDEX: 24}


def test_tiny_has_every_mode_and_source_relation():
    layers = TINY.layers()
    assert {lc.mode for lc in layers} == set(Mode)
    c2a_kv = {lc.kv_source for lc in layers if lc.ratio == 2}
    assert len(c2a_kv) >= 2  # reuse picks the latest of several same-ratio sources
    reuse_after_reindex = [lc for lc in layers if lc.mode is Mode.C1A_REUSE
                           and lc.index_source != lc.kv_source]
    assert reuse_after_reindex  # reuse of a reindex layer's Top-K
    assert TINY.hidden_size < FLASH.hidden_size and TINY.num_layers < FLASH.num_layers
    assert type(TINY.rope) is type(FLASH.rope) and type(TINY.cache) is type(FLASH.cache)


@pytest.mark.parametrize("changes,rule", [
    (dict(num_heads=12), "num_heads % o_groups"),
    (dict(compress_ratios=(0, 0, 3) + (2,) * 17 + (1,) * 20), "compress_ratios within"),
    (dict(compress_ratios=(0,) * 39), "len(compress_ratios)"),
    (dict(kv_source_layer_ids=(8, 14, 20)), "KV source of its ratio"),
    (dict(index_source_layer_ids=(2, 8, 14, 24)), "every KV source is an index source"),
    (dict(candidate_source_layer_id=24), "candidate source is both"),
    (dict(kv_source_layer_ids=(1, 2, 8, 14, 20)), "kv_source_layer_ids: layer 1 has ratio 0"),
    (dict(hidden_size=5000), "hidden_size % 32"),
])
def test_inconsistent_config_names_the_rule(changes, rule):
    with pytest.raises(ConfigError) as err:
        replace(FLASH, **changes)
    assert rule in str(err.value)


def test_bad_layer_and_preset_names():
    with pytest.raises(ConfigError, match="layer: 40"):
        layer_config(40)
    with pytest.raises(ConfigError, match="preset"):
        preset("huge")
    assert preset("TINY") is TINY


@pytest.mark.parametrize("tp,heads,groups,width", [(1, 64, 8, 8192), (2, 32, 4, 4096),
                                                   (4, 16, 2, 2048), (8, 8, 1, 1024)])
def test_tp_arithmetic(tp, heads, groups, width):
    assert local_heads(FLASH, tp) == heads
    assert local_o_groups(FLASH, tp) == groups
    assert local_o_width(FLASH, tp) == width
    assert local_vocab(FLASH, tp) * tp == FLASH.vocab_size


def test_ep_arithmetic():
    assert [local_experts(FLASH, ep) for ep in (2, 4, 8)] == [192, 96, 48]
    p = Parallel(tp=4, dp=2, ep=8)
    assert p.world_size == 8
    assert [p.tp_rank(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [p.group_base(r) for r in range(8)] == [0, 0, 0, 0, 4, 4, 4, 4]
    assert Parallel(tp=2, dp=2).world_size == 4


@pytest.mark.parametrize("kwargs,field", [
    (dict(tp=3), "tp: 3"), (dict(tp=16), "tp: 16"), (dict(tp=2, dp=1, ep=16), "ep: 16"),
    (dict(tp=8, dp=1, ep=4), "ep % tp"), (dict(tp=2, dp=1, ep=8), "dp == ep // tp"),
    (dict(dp=0), "dp: 0"),
])
def test_bad_parallel_layouts(kwargs, field):
    with pytest.raises(ConfigError, match=field.replace("%", "%")):
        Parallel(**kwargs)


def test_local_sizes_reject_indivisible():
    with pytest.raises(ConfigError, match="num_heads % tp"):
        local_heads(TINY, 16)
    with pytest.raises(ConfigError, match="n_routed_experts % ep"):
        local_experts(replace(TINY, moe=replace(TINY.moe, n_routed_experts=12)), 8)


def test_slab_examples():
    assert [rank_slab(2, 4, r) for r in range(4)] == [(0, 1), (1, 1), (2, 0), (2, 0)]
    assert [rank_slab(5, 4, r) for r in range(4)] == [(0, 2), (2, 2), (4, 1), (5, 0)]
    # a reserved-capacity batch keeps the capacity slab; active rows mask its suffix
    assert slab_width(33, 4) == 9
    assert [rank_slab(31, 4, r, capacity=33) for r in range(4)] == [(0, 9), (9, 9), (18, 9), (27, 4)]
    assert [rank_slab(24, 4, r, capacity=32) for r in range(4)] == [(0, 8), (8, 8), (16, 8), (24, 0)]
    assert [rank_slab(0, 2, r, capacity=4) for r in range(2)] == [(0, 0), (0, 0)]


def test_slab_rejects_active_past_capacity():
    with pytest.raises(ConfigError, match="active: 9"):
        rank_slab(9, 4, 0, capacity=8)
    with pytest.raises(ConfigError, match="tp_rank: 4"):
        rank_slab(8, 4, 4)
