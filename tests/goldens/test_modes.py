"""goldens.modes: the six attention half-layers composed, at TINY.

TINY layers: 0-1 SWA; 2, 4 C2A Full; 3, 5 C2A Reuse; 6 C1A Full (candidate source);
7, 9 C1A Reuse; 8 C1A Reindex.  Every test walks the layers in order inside one forward
(``begin_forward``), so each Reuse / Reindex layer consumes what its source published.

* every mode runs for decode (1-6 rows per request over long prefixes) and packed prefill
  (several rows per request, with and without a cached prefix), both reserved-capacity;
* ownership: each call changes only tensors in ``OWNERSHIP[mode]`` of its own layer
  (byte comparison of every cache tensor, scratch included);
* Reuse attends to exactly the source's Top-K rows; Reindex selects inside the candidate
  mask;
* prefill then two decode steps with caches carried across steps == one prefill of the
  whole sequence (caches byte-identical, outputs within the contract row bound);
* replicated and sharded wirings agree exactly on active rows for TP 1/2/4/8;
* bad inputs raise ValueError before any cache byte changes.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from goldens.config import TINY, Mode, slab_width
from goldens.modes import (OWNERSHIP, ForwardBatch, ModelCaches, ModeWeights, RopeTables,
                           attention_half_layer, build_forward_batch, changed_keys, owned_keys,
                           random_mode_weights, snapshot_caches)
from goldens.sparse_attention import gather_compressed_kv
from goldens.tp import AttentionBatch, decode_attention, unshard_rows
from harness.compare import check_row_bound
from harness.verdict import all_passed

from cache_history import fill_history




CFG = TINY
I32 = torch.int32
BS = CFG.cache.block_size
ROPE = RopeTables.build(CFG, 512)
WEIGHTS = {layer: random_mode_weights(CFG, layer, seed=3) for layer in range(CFG.num_layers)}
LAYERS = list(range(CFG.num_layers))
MODE_LAYER = {m: CFG.representative_layer(m) for m in Mode}


def row_bound_ok(actual, ref):
    """The contract's per-row bound (harness comparator), non-finite failing."""
    return all_passed(check_row_bound("out", actual, ref))


def token_x(layer: int, req: int, pos: int) -> torch.Tensor:
    """The normalized input of one token at one layer: a function of (layer, req, pos) only,
    so differently packed batches feed identical rows."""
    g = torch.Generator().manual_seed(1_000_003 * layer + 1009 * req + pos)
    return torch.randn(CFG.hidden_size, generator=g).to(torch.bfloat16)


# ---- scenarios -------------------------------------------------------------------------------

class Scenario:
    """Requests with fixed page tables that cover ``capacity`` positions each; caches hold
    random history (window rows, compressed rows, index keys, state ring) unless
    ``history=False``.  ``step(rows, kv)`` builds one forward's batch and inputs."""

    def __init__(self, capacity: list[int], seed: int = 0, history: bool = True):
        g = torch.Generator().manual_seed(seed)
        self.B = B = len(capacity)
        pages = -(-max(capacity) // BS) + 1  # one trailing column, unallocated (-1)
        self.window_blocks = B * pages + 2  # two spare blocks nobody addresses
        perm = torch.randperm(B * pages, generator=g).to(I32).view(B, pages)
        self.window_table = perm.clone()
        self.window_table[:, -1] = -1
        cpages = {1: -(-max(capacity) // BS) + 1, 2: -(-max(capacity) // (2 * BS)) + 1}
        self.compressed_blocks = B * max(cpages.values()) + 1
        self.ctables = {}
        for src in CFG.kv_source_layer_ids:
            r = CFG.compress_ratios[src]
            t = torch.randperm(self.compressed_blocks, generator=g)[:B * cpages[r]]
            t = t.to(I32).view(B, cpages[r])
            t[:, -1] = -1
            self.ctables[src] = self.ctables.get(
                next((s for s in self.ctables if CFG.compress_ratios[s] == r), None), t)
        self.state_blocks = B + 3
        sperm = torch.randperm(self.state_blocks, generator=g)[:B].to(I32)
        self.stables = {s: sperm[:, None].clone() for s in CFG.kv_source_layer_ids
                        if CFG.compress_ratios[s] == 2}
        self.caches = ModelCaches.allocate(CFG, window_blocks=self.window_blocks,
                                           compressed_blocks=self.compressed_blocks,
                                           state_blocks=self.state_blocks, fill=0x22)
        if history:
            self._fill_history(g)

    def _fill_history(self, g):
        fill_history(self.caches, CFG, g)

    def step(self, rows: list[int], kv: list[int], pad: int = 0):
        qsl = torch.tensor([0] + torch.tensor(rows).cumsum(0).tolist(), dtype=I32)
        T = sum(rows) + pad
        batch = build_forward_batch(CFG, qsl, torch.tensor(kv, dtype=I32), self.window_table,
                                    self.ctables, self.stables, num_padded_tokens=T,
                                    num_state_blocks=self.state_blocks)
        return batch

    @staticmethod
    def inputs(batch: ForwardBatch, layer: int, pad_value: float = 0.0) -> torch.Tensor:
        md = batch.metadata
        x = torch.full((md.num_padded_tokens, CFG.hidden_size), pad_value, dtype=torch.bfloat16)
        for t in range(md.num_tokens):
            x[t] = token_x(layer, int(md.token_to_req_indices[t]), int(md.position_ids[t]))
        return x


def run_forward(sc: Scenario, batch: ForwardBatch, *, check_ownership=False, tp=1,
                wiring="replicated", stop=None):
    """Layers 0.. in order (through ``stop`` exclusive); returns {layer: (out, aux)}."""
    sc.caches.begin_forward(CFG, batch)
    results = {}
    for layer in LAYERS[:stop]:
        x = Scenario.inputs(batch, layer, pad_value=7.0)
        before = snapshot_caches(sc.caches) if check_ownership else None
        out, caches, aux = attention_half_layer(CFG, layer, x, WEIGHTS[layer], sc.caches, batch,
                                                ROPE, tp=tp, wiring=wiring)
        assert caches is sc.caches
        if check_ownership:
            changed = changed_keys(before, sc.caches)
            owned = owned_keys(CFG, layer)
            assert changed <= owned, (layer, sorted(changed - owned))
            if batch.active:
                assert {("window_kv", layer), ("window_kv_scale", layer)} <= changed
        results[layer] = (out, aux)
    return results


DECODE = dict(capacity=[150, 90, 200, 64, 120], rows=[1, 6, 3, 2, 5], kv=[131, 77, 180, 45, 99],
              pad=4)
PREFILL = dict(capacity=[40, 64, 30, 48], rows=[13, 9, 30, 7], kv=[0, 37, 0, 21], pad=3)


# ---- every mode, decode and prefill, ownership ----------------------------------------------

@pytest.mark.parametrize("case", [DECODE, PREFILL], ids=["decode", "prefill"])
def test_every_mode_runs_and_writes_only_what_it_owns(case):
    sc = Scenario(case["capacity"], seed=1)
    batch = sc.step(case["rows"], case["kv"], case["pad"])
    active, T = batch.active, batch.tokens
    assert active < T  # reserved capacity
    res = run_forward(sc, batch, check_ownership=True)
    modes = {CFG.layer_config(layer).mode for layer in res}
    assert modes == set(Mode)
    for layer, (out, aux) in res.items():
        assert out.shape == (T, CFG.hidden_size) and out.dtype == torch.bfloat16
        assert bool(torch.isfinite(out.float()).all())
        assert bool(out[:active].abs().amax(-1).gt(0).all()), layer
        assert bool((out[active:] == 0).all()), layer
        if aux.topk_rows is not None:
            assert bool((aux.topk_rows[active:] == -1).all())
            assert bool((aux.topk_rows[:active] >= 0).any())
    # the C2A Full layers published every closing group, i.e. (p + 1) even, of the batch
    md = batch.metadata
    closing = int(((md.position_ids[:active] + 1) % 2 == 0).sum())
    assert int(res[2][1].compressor.published.sum()) == closing
    assert int(res[6][1].compressor.published.sum()) == active


def test_ownership_table_is_the_contract():
    window = {"window_kv", "window_kv_scale"}
    pub = {"compressed_kv", "compressed_kv_scale", "index_key", "index_key_scale"}
    assert OWNERSHIP[Mode.SWA] == window
    assert OWNERSHIP[Mode.C2A_FULL] == window | pub | {"state_cache", "topk_rows"}
    assert OWNERSHIP[Mode.C1A_FULL] == window | pub | {"topk_rows", "candidate_mask"}
    assert OWNERSHIP[Mode.C1A_REINDEX] == window | {"topk_rows"}
    assert OWNERSHIP[Mode.C2A_REUSE] == OWNERSHIP[Mode.C1A_REUSE] == window
    for m in (Mode.C1A_REINDEX, Mode.C2A_REUSE, Mode.C1A_REUSE, Mode.SWA):
        assert not OWNERSHIP[m] & (pub | {"state_cache"})
    # Reuse has no compressor or indexer weights; Reindex no compressor
    assert WEIGHTS[3].compressor is None and WEIGHTS[3].indexer is None
    assert WEIGHTS[8].compressor is None and WEIGHTS[8].indexer is not None
    with pytest.raises(ValueError, match="compressor"):
        ModeWeights(Mode.C1A_REUSE, WEIGHTS[7].attn, WEIGHTS[6].compressor)
    with pytest.raises(ValueError, match="indexer"):
        ModeWeights(Mode.C1A_REINDEX, WEIGHTS[8].attn)


@pytest.mark.parametrize("case", [DECODE, PREFILL], ids=["decode", "prefill"])
def test_reserved_capacity_equals_the_compact_batch(case):
    """Padding rows (junk inputs) change no cache byte and no active output."""
    padded, compact = Scenario(case["capacity"], seed=8), Scenario(case["capacity"], seed=8)
    pb = padded.step(case["rows"], case["kv"], case["pad"])
    cb = compact.step(case["rows"], case["kv"], 0)
    rp, rc = run_forward(padded, pb), run_forward(compact, cb)
    a, b = padded.caches.tensors(), compact.caches.tensors()
    for key in a:
        if key[0] in ("topk_rows", "candidate_mask"):
            assert torch.equal(a[key][:cb.tokens], b[key]), key
            assert not a[key][cb.tokens:].any() if a[key].dtype == torch.bool \
                else bool((a[key][cb.tokens:] == -1).all()), key
        else:
            assert torch.equal(a[key].view(torch.uint8), b[key].view(torch.uint8)), key
    for layer in rp:
        assert torch.equal(rp[layer][0][:cb.tokens], rc[layer][0]), layer


def test_zero_active_rows_write_nothing():
    sc = Scenario([40, 40], seed=2)
    batch = sc.step([0, 0], [10, 20], pad=4)
    before = snapshot_caches(sc.caches)
    res = run_forward(sc, batch)
    for out, _ in res.values():
        assert bool((out == 0).all())
    changed = changed_keys(before, sc.caches)
    assert {k for k in changed if k[0] not in ("topk_rows", "candidate_mask")} == set()


# ---- Reuse and Reindex -------------------------------------------------------------------------

def test_reuse_uses_exactly_the_source_topk_rows():
    sc = Scenario(DECODE["capacity"], seed=3)
    batch = sc.step(DECODE["rows"], DECODE["kv"], DECODE["pad"])
    active = batch.active
    res = run_forward(sc, batch, stop=3)  # through C2A Full 2
    src_rows = sc.caches.scratch.topk_rows[2].clone()
    # swap in different (valid) rows for the source: Reuse must follow them exactly
    alt = torch.roll(src_rows, 1, dims=0)
    alt[active:] = -1
    sc.caches.scratch.publish(2, topk_rows=alt)
    for rows in (alt, src_rows):
        sc.caches.scratch.publish(2, topk_rows=rows)
        ref_caches = sc.caches.clone()
        x = Scenario.inputs(batch, 3)
        out, _, aux = attention_half_layer(CFG, 3, x, WEIGHTS[3], sc.caches, batch, ROPE)
        assert torch.equal(aux.topk_rows, rows)
        # direct composition with those rows
        md = batch.metadata
        rc, rs = torch.ones(batch.tokens, CFG.rope_dim // 2), torch.zeros(batch.tokens,
                                                                          CFG.rope_dim // 2)
        pos = md.position_ids.long()
        live = pos >= 0
        rc[live], rs[live] = ROPE.compressed_cos[pos[live]], ROPE.compressed_sin[pos[live]]
        src = ref_caches.sources[2]
        comp = gather_compressed_kv(src.compressed_kv, src.compressed_kv_scale, rows)
        wc = ref_caches.windows[3]
        ab = AttentionBatch(rc, rs, md.window_slots, md.window_indices, wc.payload, wc.scales, comp)
        ref = decode_attention(x, WEIGHTS[3].attn, ab, CFG, 1, "replicated", active)
        assert torch.equal(out, ref)
        if rows is alt:
            out_alt = out
    assert not torch.equal(out_alt, out)
    assert torch.equal(res[2][1].topk_rows, src_rows)


def test_reindex_selects_inside_the_candidate_mask():
    sc = Scenario(DECODE["capacity"], seed=4)
    batch = sc.step(DECODE["rows"], DECODE["kv"], DECODE["pad"])
    res = run_forward(sc, batch, stop=9)
    md, active = batch.metadata, batch.active
    mask = res[6][1].candidate_mask
    assert res[8][1].candidate_mask is not None and torch.equal(res[8][1].candidate_mask, mask)
    table = batch.compressed_block_tables[6]
    lens = md.compressed_lens[6]
    restricted = 0
    for t in range(active):
        r = int(md.token_to_req_indices[t])
        logical = {int(table[r, k // BS]) * BS + k % BS: k for k in range(int(lens[t]))}
        picked = [logical[int(x)] for x in res[8][1].topk_rows[t] if int(x) >= 0]
        assert picked and all(bool(mask[t, k]) for k in picked), t
        assert len(picked) == min(CFG.index.topk, int(mask[t].sum()))
        restricted += int(mask[t, :int(lens[t])].sum()) < int(lens[t])
    assert restricted > 0  # the mask really excludes visible positions
    # the Reindex query is its own: scores differ from the candidate source's
    assert not torch.equal(res[8][1].index_scores, res[6][1].index_scores)


# ---- caches carried across steps -------------------------------------------------------------

def test_prefill_then_decode_steps_equal_one_prefill():
    steps = [([9, 14, 6], [0, 0, 0]), ([1, 6, 3], [9, 14, 6]), ([2, 1, 5], [10, 20, 9])]
    total = [sum(s[0][r] for s in steps) for r in range(3)]
    split = Scenario([32, 32, 32], seed=5, history=False)
    per_token: dict[tuple[int, int, int], torch.Tensor] = {}
    for rows, kv in steps:
        batch = split.step(rows, kv, pad=2)
        res = run_forward(split, batch, check_ownership=True)
        md = batch.metadata
        for layer, (out, _) in res.items():
            for t in range(batch.active):
                per_token[(layer, int(md.token_to_req_indices[t]), int(md.position_ids[t]))] = out[t]

    whole = Scenario([32, 32, 32], seed=5, history=False)
    batch = whole.step(total, [0, 0, 0])
    res = run_forward(whole, batch)
    md = batch.metadata
    a, b = split.caches.tensors(), whole.caches.tensors()
    for key in a:
        if key[0] in ("topk_rows", "candidate_mask"):
            continue  # per-forward scratch
        assert torch.equal(a[key].view(torch.uint8), b[key].view(torch.uint8)), key
    for layer, (out, _) in res.items():
        got = torch.stack([per_token[(layer, int(md.token_to_req_indices[t]),
                                      int(md.position_ids[t]))] for t in range(batch.active)])
        assert row_bound_ok(got, out[:batch.active]), layer


# ---- wirings ---------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=[DECODE, PREFILL], ids=["decode", "prefill"])
def wiring_setup(request):
    case = request.param
    sc = Scenario(case["capacity"], seed=6)
    batch = sc.step(case["rows"], case["kv"], case["pad"])
    sc.caches.begin_forward(CFG, batch)
    before = {}
    for layer in LAYERS:
        before[layer] = sc.caches.clone()
        attention_half_layer(CFG, layer, Scenario.inputs(batch, layer, 3.0), WEIGHTS[layer],
                             sc.caches, batch, ROPE)
    return batch, before


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
def test_replicated_and_sharded_agree_for_every_tp(mode, wiring_setup):
    batch, before = wiring_setup
    layer = MODE_LAYER[mode]
    T, active = batch.tokens, batch.active
    x = Scenario.inputs(batch, layer, 3.0)
    tp1 = None
    for tp in (1, 2, 4, 8):
        rc, sc_ = before[layer].clone(), before[layer].clone()
        rep, _, ra = attention_half_layer(CFG, layer, x, WEIGHTS[layer], rc, batch, ROPE, tp=tp)
        slabs, _, sa = attention_half_layer(CFG, layer, x, WEIGHTS[layer], sc_, batch, ROPE,
                                            tp=tp, wiring="sharded")
        width = slab_width(T, tp)
        assert len(slabs) == tp and all(s.shape == (width, CFG.hidden_size) for s in slabs)
        assert bool((torch.cat(slabs)[active:] == 0).all())
        assert torch.equal(unshard_rows(slabs, T)[:active], rep[:active]), tp
        assert bool((rep[active:] == 0).all())
        ta, tb = rc.tensors(), sc_.tensors()
        assert all(torch.equal(ta[k].view(torch.uint8), tb[k].view(torch.uint8)) for k in ta)
        if ra.topk_rows is not None:
            assert torch.equal(ra.topk_rows, sa.topk_rows)
        if tp == 1:
            tp1 = rep
        else:
            assert row_bound_ok(rep[:active], tp1[:active]), tp


# ---- bad input -------------------------------------------------------------------------------

def _bad_fixture():
    sc = Scenario(PREFILL["capacity"], seed=7)
    batch = sc.step(PREFILL["rows"], PREFILL["kv"], PREFILL["pad"])
    run_forward(sc, batch, stop=2)  # scratch begun, SWA layers done
    return sc, batch


def _assert_raises_untouched(sc, layer, batch, match, rope=ROPE, active=None):
    before = snapshot_caches(sc.caches)
    with pytest.raises(ValueError, match=match):
        attention_half_layer(CFG, layer, Scenario.inputs(batch, layer), WEIGHTS[layer],
                             sc.caches, batch, rope, active=active)
    assert changed_keys(before, sc.caches) == set()


@pytest.mark.parametrize("layer", [2, 6])
def test_block_id_out_of_range_raises_before_writes(layer):
    sc, batch = _bad_fixture()
    # window block past the cache
    wt = sc.window_table.clone()
    last = batch.active - 1  # the page of a newly published row
    wt[int(batch.metadata.token_to_req_indices[last]),
       int(batch.metadata.position_ids[last]) // BS] = sc.window_blocks + 5
    bad = build_forward_batch(CFG, batch.metadata.query_start_loc, batch.metadata.kv_seq_lens,
                              wt, sc.ctables, sc.stables, num_padded_tokens=batch.tokens)
    _assert_raises_untouched(sc, layer, bad, "window_(slots|indices).*out of range")
    # compressed block past the source cache (read by the indexer, published by Full)
    ct = {k: v.clone() for k, v in sc.ctables.items()}
    for k in ct:
        ct[k][1, 0] = sc.compressed_blocks + 3
    bad = build_forward_batch(CFG, batch.metadata.query_start_loc, batch.metadata.kv_seq_lens,
                              sc.window_table, ct, sc.stables, num_padded_tokens=batch.tokens)
    _assert_raises_untouched(sc, layer, bad, "out of range")


def test_unallocated_page_raises_before_writes():
    sc, batch = _bad_fixture()
    # the lowering rejects it outright ...
    wt = sc.window_table.clone()
    wt[1, 0] = -1
    with pytest.raises(ValueError, match="unallocated"):
        build_forward_batch(CFG, batch.metadata.query_start_loc, batch.metadata.kv_seq_lens,
                            wt, sc.ctables, sc.stables, num_padded_tokens=batch.tokens)
    # ... and a table swapped after lowering is caught by the half-layer
    ct = {k: v.clone() for k, v in batch.compressed_block_tables.items()}
    ct[6][1, 0] = -1
    _assert_raises_untouched(sc, 6, ForwardBatch(batch.metadata, ct), "unallocated")
    ct = {k: v.clone() for k, v in batch.compressed_block_tables.items()}
    ct[2][1, 0] = -1
    ct[4][1, 0] = -1
    _assert_raises_untouched(sc, 2, ForwardBatch(batch.metadata, ct), "unallocated")


@pytest.mark.parametrize("layer", [0, 2, 6])
def test_position_at_table_capacity_raises_before_writes(layer):
    sc, batch = _bad_fixture()
    top = int(batch.metadata.position_ids.max())
    small = RopeTables.build(CFG, top)  # the last position is at the capacity
    _assert_raises_untouched(sc, layer, batch, "capacity", rope=small)


def test_duplicate_live_state_block_raises_before_writes():
    sc, batch = _bad_fixture()
    dup = {s: t.clone() for s, t in sc.stables.items()}
    for t in dup.values():
        t[2, 0] = t[0, 0]
    with pytest.raises(ValueError, match="distinct"):
        build_forward_batch(CFG, batch.metadata.query_start_loc, batch.metadata.kv_seq_lens,
                            sc.window_table, sc.ctables, dup, num_padded_tokens=batch.tokens)
    md = dataclasses.replace(batch.metadata, state_block_tables=dup)
    _assert_raises_untouched(sc, 2, ForwardBatch(md, batch.compressed_block_tables), "distinct")
    oob = {s: t.clone() for s, t in sc.stables.items()}
    for t in oob.values():
        t[1, 0] = sc.state_blocks
    md = dataclasses.replace(batch.metadata, state_block_tables=oob)
    _assert_raises_untouched(sc, 4, ForwardBatch(md, batch.compressed_block_tables),
                             "out of range")


def test_missing_source_and_bad_active_raise_before_writes():
    sc, batch = _bad_fixture()
    _assert_raises_untouched(sc, 3, batch, "index source 2 has not published")
    run_forward(sc, batch, stop=3)
    sc.caches.scratch.published.discard(6)
    _assert_raises_untouched(sc, 8, batch, "candidate source 6")
    sc.caches.scratch.publish(2, topk_rows=torch.full_like(sc.caches.scratch.topk_rows[2],
                                                           sc.compressed_blocks * BS))
    _assert_raises_untouched(sc, 3, batch, "out of range")
    _assert_raises_untouched(sc, 0, batch, "active", active=batch.active - 1)
    with pytest.raises(ValueError, match="mode"):
        attention_half_layer(CFG, 3, Scenario.inputs(batch, 3), WEIGHTS[2], sc.caches, batch,
                             ROPE)


# ---- bench -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_bench_flash_one_mode():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "goldens.bench", "--modes", "c1a_reuse",
                           "--json"], capture_output=True, text=True, env=env, timeout=1800,
                          cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    import json
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["mode"] for r in rows] == ["c1a_reuse"]
    r = rows[0]
    assert r["tokens"] == 192 and r["finite"] and r["padding_zero"]
    assert r["peak_delta_gib"] < 12.0
