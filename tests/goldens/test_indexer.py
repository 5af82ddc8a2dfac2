"""goldens.indexer: BF16 score boundaries, Top-K rows, candidate blocks, budget chunking.

The score reference is a scalar loop (FP64 sums, explicit FP32 -> BF16 roundings) that
shares no code with the module; Top-K is re-derived with Python sorting.  TINY geometry:
4 index heads x 32, topk 8, candidate blocks of 4 (keep 4), cache blocks of 16.
"""

from __future__ import annotations


import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goldens.config import TINY
from goldens.indexer import (DEFAULT_MAX_LOGITS_BYTES, index_query, logits_chunk_rows,
                             paged_indexer, reuse_topk, select_candidate_blocks)
from goldens.quant import dequantize_index_key, quantize_fp8_weight, quantize_index_key
from goldens.rope import precompute_rope_tables

I32 = torch.int32
CFG = TINY
H, DH = CFG.index.n_heads, CFG.index.head_dim
BS = CFG.cache.block_size
NUM_BLOCKS = 8
PAGES = 3
WIDTH = PAGES * BS  # 48 compressed positions per request


def make_cache(seed=0):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(NUM_BLOCKS * BS, DH, generator=g)
    packed, scales = quantize_index_key(keys, CFG.cache.index_group)
    return (packed.view(NUM_BLOCKS, BS, 1, DH // 2).clone(),
            scales.view(NUM_BLOCKS, BS, 1, DH // CFG.cache.index_group).clone())


# request 0: decode rows; request 1: short prefill incl. lens 0; request 2: long
TABLE = torch.tensor([[5, 2, -1], [7, -1, -1], [1, 6, 3]], dtype=I32)
REQ = [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
LENS = [5, 6, 7, 0, 1, 3, 16, 29, 30, 33, 48]
PAD = 2


def make_batch(seed=1, pad=PAD):
    g = torch.Generator().manual_seed(seed)
    n = len(REQ)
    T = n + pad
    q = torch.randn(T, H, DH, generator=g).bfloat16()
    w = (torch.randn(T, H, generator=g) * 0.3).bfloat16()
    req = torch.tensor(REQ + [9] * pad, dtype=I32)  # padding rows: out-of-range junk
    lens = torch.tensor(LENS + [999] * pad, dtype=I32)
    return q, w, req, lens, n


def bf16(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float64).float().bfloat16())


def reference_scores(q, w, cache, table, req, lens, n):
    key_flat = dequantize_index_key(cache[0].view(-1, DH // 2), cache[1].view(-1, 1)).double()
    out = torch.full((n, WIDTH), float("-inf"), dtype=torch.float64)
    for t in range(n):
        r = int(req[t])
        for k in range(int(lens[t])):
            row = int(table[r, k // BS]) * BS + k % BS
            key = key_flat[row].tolist()
            total = 0.0
            for h in range(H):
                qh = q[t, h].double().tolist()
                dot = bf16(sum(a * b for a, b in zip(qh, key)))
                total += bf16(max(dot, 0.0) * float(w[t, h]))
            out[t, k] = bf16(total)
    return out


def reference_topk(scores_row, r, table, mask_row=None):
    cand = [(s, k) for k, s in enumerate(scores_row.tolist()) if s != float("-inf")
            and (mask_row is None or bool(mask_row[k]))]
    cand.sort(key=lambda sk: (-sk[0], sk[1]))
    picked = sorted(k for _, k in cand[:CFG.index.topk])
    rows = [int(table[r, k // BS]) * BS + k % BS for k in picked]
    return rows + [-1] * (CFG.index.topk - len(rows))


def run(q, w, cache, req, lens, n, **kw):
    return paged_indexer(CFG, q, w, cache[0], cache[1], TABLE, req, lens, n, **kw)


def test_scores_and_topk_match_scalar_reference():
    cache = make_cache()
    q, w, req, lens, n = make_batch()
    res = run(q, w, cache, req, lens, n)
    ref = reference_scores(q, w, cache, TABLE, req, lens, n)
    assert torch.equal(res.scores[:n].double(), ref)
    for t in range(n):
        assert res.topk_rows[t].tolist() == reference_topk(ref[t], REQ[t], TABLE), t
    assert (res.topk_rows[n:] == -1).all()
    assert res.topk_rows[3].tolist() == [-1] * 8  # compressed_lens 0 selects nothing
    assert res.topk_rows.dtype == I32 and res.candidate_mask is None


def test_output_rows_are_unique_visible_sorted_and_minus_one_padded():
    cache = make_cache(3)
    q, w, req, lens, n = make_batch(4)
    res = run(q, w, cache, req, lens, n)
    for t in range(n):
        rows = res.topk_rows[t].tolist()
        live = [x for x in rows if x >= 0]
        assert rows == live + [-1] * (len(rows) - len(live))  # trailing -1 only
        assert len(live) == min(CFG.index.topk, LENS[t])  # every visible score is finite
        r = REQ[t]
        logical = [[k for k in range(LENS[t]) if int(TABLE[r, k // BS]) * BS + k % BS == x][0]
                   for x in live]
        assert logical == sorted(set(logical)) and all(k < LENS[t] for k in logical)


def test_ties_go_to_lower_positions():
    cache = make_cache()
    q, w, req, lens, n = make_batch()
    q.zero_()  # every visible score is 0
    res = run(q, w, cache, req, lens, n)
    t = 7  # request 2, 29 visible positions
    expect = [int(TABLE[2, k // BS]) * BS + k % BS for k in range(8)]
    assert res.topk_rows[t].tolist() == expect


# ---- budget chunking ------------------------------------------------------------------------

def test_budget_arithmetic():
    assert logits_chunk_rows(CFG, WIDTH) == DEFAULT_MAX_LOGITS_BYTES // (4 * WIDTH)
    assert logits_chunk_rows(CFG, 4, max_logits_bytes=1) == 1  # one padded row retained
    assert logits_chunk_rows(CFG, 4, max_logits_bytes=4 * 8 * 3) == 3  # width padded to topk
    with pytest.raises(ValueError, match="max_logits_bytes: 0"):
        logits_chunk_rows(CFG, 4, max_logits_bytes=0)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(budget=st.integers(1, 4 * WIDTH * 5), mode=st.sampled_from(["full", "cand", "reindex"]),
       seed=st.integers(0, 50))
def test_budget_chunked_equals_unchunked(budget, mode, seed):
    cache = make_cache(seed)
    q, w, req, lens, n = make_batch(seed + 1)
    kw = {}
    if mode == "cand":
        kw["select_candidates"] = True
    elif mode == "reindex":
        g = torch.Generator().manual_seed(seed)
        kw["candidate_mask"] = torch.rand(n + PAD, WIDTH, generator=g) < 0.4
    whole = run(q, w, cache, req, lens, n, **kw)
    parts = run(q, w, cache, req, lens, n, max_logits_bytes=budget, **kw)
    assert whole.num_chunks == 1
    assert parts.num_chunks == -(-n // max(1, budget // (4 * WIDTH)))
    assert torch.equal(whole.topk_rows, parts.topk_rows)
    assert torch.equal(whole.scores, parts.scores)
    if mode == "cand":
        assert torch.equal(whole.candidate_mask, parts.candidate_mask)


# ---- hierarchical candidates ----------------------------------------------------------------

def test_candidate_mask_pins_the_newest_partial_block():
    cbs, keep = CFG.index.candidate_block_size, CFG.index.candidate_topk_blocks
    lens = torch.tensor([30, 30, 2, 0], dtype=I32)
    scores = torch.full((4, WIDTH), float("-inf"))
    for t in range(3):
        L = int(lens[t])
        scores[t, :L] = torch.arange(L, 0, -1).float()  # older positions score higher
    scores[1, 28:30] = -50.0  # newest partial block (positions 28, 29) scores lowest
    mask = select_candidate_blocks(CFG, scores, lens)
    blocks = mask.view(4, -1, cbs)
    for t in (0, 1):
        chosen = blocks[t].all(-1).nonzero().flatten().tolist()
        assert chosen == [0, 1, 2, 7]  # top 3 by score + pinned block 7 (holds 29)
        assert blocks[t].any(-1).sum() == keep
    assert blocks[2].all(-1).nonzero().flatten().tolist() == [0]  # fewer blocks than keep
    assert not mask[3].any()  # nothing visible: the -inf blocks are dropped


def test_candidate_mask_from_the_paged_indexer():
    cache = make_cache(2)
    q, w, req, lens, n = make_batch(2)
    res = run(q, w, cache, req, lens, n, select_candidates=True)
    cbs = CFG.index.candidate_block_size
    for t in range(n):
        L = LENS[t]
        m = res.candidate_mask[t]
        if L == 0:
            assert not m.any()
            continue
        assert m[(L - 1) // cbs * cbs:(L - 1) // cbs * cbs + cbs].all()  # pinned block
        visible_blocks = -(-L // cbs)
        assert int(m.view(-1, cbs).all(-1).sum()) == min(CFG.index.candidate_topk_blocks,
                                                          visible_blocks)
        assert not m[-(-L // cbs) * cbs:].any()
    assert not res.candidate_mask[n:].any()
    # the candidate source's own Top-K is unrestricted by the mask it publishes
    assert torch.equal(res.topk_rows, run(q, w, cache, req, lens, n).topk_rows)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), density=st.floats(0.0, 1.0))
def test_reindex_never_selects_outside_the_mask(seed, density):
    cache = make_cache(seed % 7)
    q, w, req, lens, n = make_batch(seed)
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n + PAD, WIDTH, generator=g) < density
    res = run(q, w, cache, req, lens, n, candidate_mask=mask)
    for t in range(n):
        r = REQ[t]
        phys = {int(TABLE[r, k // BS]) * BS + k % BS: k for k in range(LENS[t])}
        for x in res.topk_rows[t].tolist():
            if x >= 0:
                assert bool(mask[t, phys[x]]), (t, x)
        assert res.topk_rows[t].tolist() == reference_topk(res.scores[t], r, TABLE, mask[t])
    full = run(q, w, cache, req, lens, n, candidate_mask=torch.ones(n + PAD, WIDTH, dtype=torch.bool))
    assert torch.equal(full.topk_rows, run(q, w, cache, req, lens, n).topk_rows)


def test_reuse_takes_the_source_rows_unchanged():
    cache = make_cache()
    q, w, req, lens, n = make_batch()
    src = run(q, w, cache, req, lens, n).topk_rows
    out = reuse_topk(src)
    assert torch.equal(out, src) and out.data_ptr() != src.data_ptr()


def test_empty_work():
    cache = make_cache()
    q, w, req, lens, _ = make_batch()
    res = run(q, w, cache, req, lens, 0, select_candidates=True)
    assert (res.topk_rows == -1).all() and not res.candidate_mask.any() and res.num_chunks == 0


# ---- index query ----------------------------------------------------------------------------

def test_index_query_boundaries():
    g = torch.Generator().manual_seed(5)
    T, n = 5, 4
    qr = torch.randn(T, CFG.q_lora_rank, generator=g).bfloat16()
    x = torch.randn(T, CFG.hidden_size, generator=g).bfloat16()
    wq = torch.randn(H * DH, CFG.q_lora_rank, generator=g) * 0.1
    payload, scales = quantize_fp8_weight(wq)
    wp = (torch.randn(CFG.hidden_size, H, generator=g) * 0.05).bfloat16()
    pos = torch.tensor([0, 7, -1, 40, 9999], dtype=I32)
    cos, sin = precompute_rope_tables(CFG, compressed=True, capacity=64)
    out = index_query(CFG, qr, payload, scales, x, wp, pos, n, cos, sin)
    assert out.q.shape == (T, H, DH) and out.weights.shape == (T, H)
    assert not out.q[n:].any() and not out.weights[n:].any()
    # weights: bf16(bf16(x @ wp) * Dh^-0.5 * H^-0.5)
    w0 = (x[:n].double() @ wp.double()).float().bfloat16().float()
    expect = (w0 * torch.tensor(DH ** -0.5 * H ** -0.5, dtype=torch.float32)).bfloat16()
    assert torch.equal(out.weights[:n], expect)
    # rotation preserves each head's pair norms; the identity row (position -1) is unrotated
    pos0 = index_query(CFG, qr, payload, scales, x, wp, torch.tensor([0] * 4 + [0], dtype=I32),
                       n, cos, sin)
    assert torch.equal(out.q[0], pos0.q[0]) and torch.equal(out.q[2], pos0.q[2])
    pn = lambda v: v.float().view(H, DH // 2, 2).norm(dim=-1)
    torch.testing.assert_close(pn(out.q[3]), pn(pos0.q[3]), rtol=2e-2, atol=1e-2)
    with pytest.raises(ValueError, match=r"position_ids\[4\]: 9999 is at or past the RoPE "
                                         r"table capacity 64"):
        index_query(CFG, qr, payload, scales, x, wp, pos, 5, cos, sin)


# ---- bad input ------------------------------------------------------------------------------

def _table(**cells):
    t = TABLE.clone()
    for key, v in cells.items():
        r, c = map(int, key[1:].split("_"))
        t[r, c] = v
    return t


BAD = [
    ("block id out of range", dict(index_block_table=_table(r2_1=NUM_BLOCKS)),
     r"index_block_table\[2, 1\]: block 8 outside \[0, num_blocks=8\)"),
    ("unallocated page", dict(index_block_table=_table(r2_1=-1)),
     r"index_block_table\[2, 1\]: -1, unallocated, but token 7 sees compressed positions up to 28"),
    ("position at or past table capacity", dict(lens=LENS[:10] + [WIDTH + 1]),
     r"compressed_lens\[10\]: position 48 is at or past the block table capacity 48"),
    ("request out of range", dict(req=REQ[:4] + [3] + REQ[5:]),
     r"token_to_req_indices\[4\]: 3 outside \[0, B=3\)"),
    ("negative compressed length", dict(lens=[-1] + LENS[1:]), r"compressed_lens\[0\]: -1 < 0"),
    ("mask shape", dict(candidate_mask=torch.ones(3, WIDTH, dtype=torch.bool)),
     r"candidate_mask: shape \[3, 48\], expected \[13, 48\]"),
    ("mask with candidate selection",
     dict(candidate_mask=torch.ones(13, WIDTH, dtype=torch.bool), select_candidates=True),
     r"candidate_mask: the candidate source selects its own mask"),
    ("budget", dict(max_logits_bytes=0), r"max_logits_bytes: 0, expected an int >= 1"),
    ("num_tokens", dict(num_tokens=14), r"num_tokens: 14, expected an int in \[0, T=13\]"),
    ("key dtype", dict(index_key=torch.zeros(NUM_BLOCKS, BS, 1, DH // 2)), r"index_key: dtype"),
]


@pytest.mark.parametrize("name,over,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_before_touching_anything(name, over, match):
    cache = make_cache()
    q, w, req, lens, n = make_batch()
    over = dict(over)
    if "lens" in over:
        lens = torch.tensor(over.pop("lens") + [999] * PAD, dtype=I32)
    if "req" in over:
        req = torch.tensor(over.pop("req") + [9] * PAD, dtype=I32)
    args = dict(index_key=cache[0], index_key_scale=cache[1], index_block_table=TABLE,
                num_tokens=n)
    args.update(over)
    before = [cache[0].clone(), cache[1].clone(), TABLE.clone()]
    with pytest.raises(ValueError, match=match):
        paged_indexer(CFG, q, w, args.pop("index_key"), args.pop("index_key_scale"),
                      args.pop("index_block_table"), req, lens, args.pop("num_tokens"), **args)
    assert torch.equal(before[0], cache[0]) and torch.equal(before[1], cache[1])
    assert torch.equal(before[2], TABLE)


# ---- composed with metadata and the compressor ----------------------------------------------

def test_indexer_reads_the_keys_its_source_published():
    """metadata -> compressor publication (ratio-1 source 6, ratio-2 source 2) -> indexer:
    the rows the indexer dequantizes are the compressor's rotated BF16 keys after FP4."""
    from goldens.compressor import (CompressorWeights, SourceCaches, allocate_state_cache,
                                    compress_and_publish)
    from goldens.metadata import build_forward_metadata

    g = torch.Generator().manual_seed(11)
    qsl = torch.tensor([0, 5, 5, 12], dtype=I32)
    kv_lens = torch.tensor([0, 3, 0], dtype=I32)
    wt = torch.tensor([[4], [2], [6]], dtype=I32)
    c2 = torch.tensor([[3], [1], [5]], dtype=I32)
    c1 = torch.tensor([[7], [0], [2]], dtype=I32)
    states = torch.tensor([[2], [0], [1]], dtype=I32)
    md = build_forward_metadata(CFG, qsl, kv_lens, wt, {2: c2, 4: c2, 6: c1},
                                {2: states, 4: states}, num_padded_tokens=14)
    T, h, d = md.num_padded_tokens, CFG.hidden_size, CFG.head_dim
    x = torch.randn(T, h, generator=g).bfloat16()
    cos, sin = precompute_rope_tables(CFG, compressed=True, capacity=64)
    for src, ratio in ((2, 2), (6, 1)):
        wkv = torch.randn(h, d, generator=g) * h ** -0.5
        w = CompressorWeights(wkv=wkv if ratio == 2 else wkv.bfloat16(),
                              wgate=torch.randn(h, d, generator=g) * h ** -0.5 if ratio == 2 else None,
                              norm=torch.ones(d), index_wk=(torch.randn(d, DH, generator=g)
                                                            * d ** -0.5).bfloat16(),
                              index_norm=torch.ones(DH))
        caches = SourceCaches.allocate(CFG, NUM_BLOCKS)
        kw = dict(state_block_table=md.state_block_tables[src],
                  state_cache=allocate_state_cache(CFG, 3)) if ratio == 2 else {}
        res = compress_and_publish(
            CFG, ratio, x, w, query_start_loc=md.query_start_loc, position_ids=md.position_ids,
            token_to_req_indices=md.token_to_req_indices, num_tokens=md.num_tokens,
            compressed_slots=md.compressed_slots[src], freqs_cos=cos, freqs_sin=sin,
            caches=caches, **kw)
        assert torch.equal(res.published, md.compressed_slots[src] >= 0)
        assert torch.equal(res.compressed_positions[res.published],
                           md.compressed_rope_position_ids[src][res.published])
        # the indexer's key rows are exactly the quantized published keys
        slots = md.compressed_slots[src][res.published]
        want = dequantize_index_key(*quantize_index_key(res.index_key[res.published]))
        got = dequantize_index_key(caches.index_key.view(-1, DH // 2)[slots],
                                   caches.index_key_scale.view(-1, 1)[slots])
        assert torch.equal(got, want)
        table = (c2 if ratio == 2 else c1)
        q = torch.randn(T, H, DH, generator=g).bfloat16()
        wts = torch.rand(T, H, generator=g).bfloat16()
        out = paged_indexer(CFG, q, wts, caches.index_key, caches.index_key_scale, table,
                            md.token_to_req_indices, md.compressed_lens[src], md.num_tokens)
        for t in range(md.num_tokens):
            live = [r for r in out.topk_rows[t].tolist() if r >= 0]
            assert len(live) == min(CFG.index.topk, int(md.compressed_lens[src][t]))
            assert set(live) <= set(slots.tolist())  # only rows this source published
