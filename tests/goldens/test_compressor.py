"""goldens.compressor: ring ownership, chunked == unchunked, publication math, bad input.

A "stream" is one request's token sequence with its own cache pages and state block.
Each schedule feeds the streams' tokens to :func:`compress_and_publish` in several calls
(chunks of random lengths, batch rows permuted every call, empty rows, an inactive
request with NaN activations, NaN trailing padding, a finished stream's state block
handed to a new stream starting at position 0) and must reproduce, byte for byte, the
caches and latents of ONE call holding every stream whole.  State rings start as NaN,
so a read of a row the contract never wrote would poison a latent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goldens.compressor import (CompressorWeights, SourceCaches, allocate_state_cache,
                                compress_and_publish)
from goldens.config import TINY
from goldens.quant import dequantize_compressed_kv, dequantize_index_key
from goldens.rope import precompute_rope_tables

I32, I64 = torch.int32, torch.int64
NUM_BLOCKS = 16  # cache pages of 16 rows
NUM_STATE = 8
ROPE_CAP = 128
CACHE_FILL = 0xA5


def with_capacity(cap: int):
    return replace(TINY, cache=replace(TINY.cache, state_capacity=cap))


def make_weights(cfg, ratio, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, d, di = cfg.hidden_size, cfg.head_dim, cfg.index.head_dim
    wkv = torch.randn(h, d, generator=g) * h ** -0.5
    return CompressorWeights(
        wkv=wkv if ratio == 2 else wkv.bfloat16(),
        wgate=(torch.randn(h, d, generator=g) * 2 * h ** -0.5) if ratio == 2 else None,
        norm=torch.rand(d, generator=g) + 0.5,
        index_wk=(torch.randn(d, di, generator=g) * d ** -0.5).bfloat16(),
        index_norm=torch.rand(di, generator=g) + 0.5)


TABLES = precompute_rope_tables(TINY, compressed=True, capacity=ROPE_CAP)


@dataclass
class Stream:
    x: torch.Tensor  # BF16 [L, hidden]
    pages: list[int]
    block: int  # state block (-1: inactive)

    @property
    def length(self):
        return self.x.shape[0]


def make_stream(cfg, length, pages, block, seed, nan=False):
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(length, cfg.hidden_size, generator=g).bfloat16()
    if nan:
        x[:] = float("nan")
    return Stream(x, pages, block)


def slot_of(cfg, ratio, stream, p):
    if p < 0 or (p + 1) % ratio or stream.block < 0 and ratio == 2:
        return -1
    c, bs = p // ratio, cfg.cache.block_size
    return stream.pages[c // bs] * bs + c % bs


def run_call(cfg, ratio, w, rows, caches, state, pad=0, inactive_slots=False):
    """``rows``: list of (stream, start, n) in batch-row order.  Returns (result, meta)."""
    xs, pos, req, slots, qsl, blocks = [], [], [], [], [0], []
    for r, (s, start, n) in enumerate(rows):
        xs.append(s.x[start:start + n])
        for p in range(start, start + n):
            pos.append(p)
            req.append(r)
            slots.append(-1 if inactive_slots and s.block < 0 else slot_of(cfg, ratio, s, p))
        qsl.append(qsl[-1] + n)
        blocks.append(s.block)
    n_tok = qsl[-1]
    x = torch.cat(xs + [torch.full((pad, cfg.hidden_size), float("nan"))]).bfloat16() \
        if rows else torch.full((pad, cfg.hidden_size), float("nan")).bfloat16()
    # padding rows carry plausible-looking garbage that must never be used
    pos += [1] * pad
    req += [0] * pad
    slots += [0] * pad
    kw = {}
    if ratio == 2:
        kw = dict(state_block_table=torch.tensor(blocks, dtype=I32).view(-1, 1),
                  state_cache=state)
    res = compress_and_publish(
        cfg, ratio, x, w, query_start_loc=torch.tensor(qsl, dtype=I32),
        position_ids=torch.tensor(pos, dtype=I32), token_to_req_indices=torch.tensor(req, dtype=I32),
        num_tokens=n_tok, compressed_slots=torch.tensor(slots, dtype=I64),
        freqs_cos=TABLES[0], freqs_sin=TABLES[1], caches=caches, **kw)
    return res, pos[:n_tok], req[:n_tok]


def collect(res, rows, pos, req, into):
    for t in range(len(pos)):
        if bool(res.produced[t]):
            into[(id(rows[req[t]][0]), pos[t])] = res.latent[t].clone()


def snapshot(caches, state):
    out = {k: v.view(torch.uint8).clone() for k, v in caches.tensors().items()}
    if state is not None:
        out["state"] = state.view(torch.uint8).clone()
    return out


def assert_same_bytes(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} bytes differ"


def fresh(cfg, ratio):
    caches = SourceCaches.allocate(cfg, NUM_BLOCKS, fill=CACHE_FILL)
    state = allocate_state_cache(cfg, NUM_STATE, fill=float("nan")) if ratio == 2 else None
    return caches, state


# ---- chunked == unchunked -------------------------------------------------------------------

@st.composite
def schedules(draw):
    cap = draw(st.sampled_from([1, 2, 4, 7]))
    ratio = draw(st.sampled_from([2, 2, 2, 1]))
    n = draw(st.integers(2, 4))
    lengths = [draw(st.integers(0, 20)) for _ in range(n)]
    lengths[0] = max(lengths[0], 1)
    chunkings = []
    for L in lengths + [draw(st.integers(1, 12))]:  # last entry: the block-reuse stream
        cuts = sorted(set(draw(st.lists(st.integers(0, L), max_size=4))))
        bounds = [0] + cuts + [L]
        chunkings.append([b - a for a, b in zip(bounds, bounds[1:])])  # zeros = empty rows
    rounds = max(len(c) for c in chunkings) + len(chunkings[0])
    perms = [draw(st.permutations(range(n + 2))) for _ in range(rounds)]
    pads = [draw(st.integers(0, 3)) for _ in range(rounds)]
    inactive = [draw(st.integers(0, 3)) for _ in range(rounds)]
    return cap, ratio, lengths, chunkings, perms, pads, inactive


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_chunked_equals_unchunked(case):
    cap, ratio, lengths, chunkings, perms, pads, inactive = case
    cfg = with_capacity(cap)
    w = make_weights(cfg, ratio)
    bs = cfg.cache.block_size
    page_pool = list(range(NUM_BLOCKS))[::-1]  # nonidentity physical pages
    streams = []
    for i, L in enumerate(lengths + [sum(chunkings[-1])]):
        need = max(1, math.ceil(L // ratio / bs))
        pages = [page_pool.pop() for _ in range(need)]
        streams.append(make_stream(cfg, L, pages, block=5 - i, seed=i))
    reuse = streams[-1]

    # reference: one call, every stream whole, distinct state blocks
    ref_caches, ref_state = fresh(cfg, ratio)
    ref_lat = {}
    rows = [(s, 0, s.length) for s in streams]
    res, pos, req = run_call(cfg, ratio, w, rows, ref_caches, ref_state)
    collect(res, rows, pos, req, ref_lat)

    # schedule: stream 0 runs first; the reuse stream takes its block after it finishes
    caches, state = fresh(cfg, ratio)
    lat = {}
    first_reuse_round = len(chunkings[0])
    reuse_view = Stream(reuse.x, reuse.pages, streams[0].block)
    offsets = [0] * len(streams)
    junk = make_stream(cfg, 5, [0], block=-1, seed=99, nan=(ratio == 2))
    for rnd, perm in enumerate(perms):
        entries = []
        for i, chunks in enumerate(chunkings[:-1]):
            if rnd < len(chunks):
                entries.append((streams[i], offsets[i], chunks[rnd], i))
        k = rnd - first_reuse_round
        if 0 <= k < len(chunkings[-1]):
            entries.append((reuse_view, offsets[-1], chunkings[-1][k], len(streams) - 1))
        if inactive[rnd]:
            entries.append((junk, 0, inactive[rnd], None))
        if not entries:
            continue
        order = [e for j in perm for e in entries[j:j + 1]] + entries[len(perm):]
        call = [(s, start, n) for s, start, n, _ in order]
        res, pos, req = run_call(cfg, ratio, w, call, caches, state, pad=pads[rnd],
                                 inactive_slots=True)
        for t in range(len(pos)):
            if bool(res.produced[t]):
                src = order[req[t]][3]
                if src is not None:
                    lat[(id(streams[src]), pos[t])] = res.latent[t].clone()
        for s, start, n, i in order:
            if i is not None:
                offsets[i] += n

    assert offsets[:-1] == lengths and offsets[-1] == reuse.length
    assert lat.keys() == ref_lat.keys()
    for key in lat:
        assert torch.equal(lat[key], ref_lat[key]), key
    ref_snap, snap = snapshot(ref_caches, None), snapshot(caches, None)
    assert_same_bytes(ref_snap, snap)
    if ratio == 2:
        # each block's final owner holds its last min(L, cap) projections, as in the reference
        owners = [(streams[i], streams[i].block) for i in range(1, len(streams) - 1)]
        owners.append((reuse, streams[0].block))
        for s, blk in owners:
            for p in range(max(0, s.length - cap), s.length):
                a = state[blk, p % cap].view(torch.int32)
                b = ref_state[s.block, p % cap].view(torch.int32)
                assert torch.equal(a, b), (blk, p)
        untouched = set(range(NUM_STATE)) - {s.block for s in streams[:-1]}
        for blk in untouched:
            assert torch.isnan(state[blk]).all()


# ---- ring ownership details -----------------------------------------------------------------

def test_long_chunk_writes_only_the_last_capacity_rows():
    cfg = with_capacity(4)
    w = make_weights(cfg, 2)
    caches, state = fresh(cfg, 2)
    s = make_stream(cfg, 9, [3], block=2, seed=1)
    run_call(cfg, 2, w, [(s, 0, 9)], caches, state)
    kv = (s.x.double() @ w.wkv.double()).float()
    sc = (s.x.double() @ w.wgate.double()).float()
    d = cfg.head_dim
    for p in range(5, 9):
        assert torch.equal(state[2, p % 4, :d], kv[p]) and torch.equal(state[2, p % 4, d:], sc[p])
    others = [b for b in range(NUM_STATE) if b != 2]
    assert torch.isnan(state[others]).all()


def test_pair_math_and_publication_against_formulas():
    """Predecessor from the ring (second call starts at odd position 3)."""
    cfg = with_capacity(2)
    w = make_weights(cfg, 2, seed=3)
    caches, state = fresh(cfg, 2)
    s = make_stream(cfg, 4, [7], block=1, seed=5)
    run_call(cfg, 2, w, [(s, 0, 3)], caches, state)
    res, _, _ = run_call(cfg, 2, w, [(s, 3, 1)], caches, state)
    kv = (s.x.double() @ w.wkv.double()).float()
    sc = (s.x.double() @ w.wgate.double()).float()
    a = 1.0 / (1.0 + torch.exp(sc[3] - sc[2]))  # softmax weight of position 2
    pooled = (a * kv[2] + (1 - a) * kv[3]).bfloat16().double()
    latent = pooled * torch.rsqrt(pooled.square().mean() + cfg.rms_norm_eps) * w.norm.double()
    torch.testing.assert_close(res.latent[0].double(), latent, rtol=1e-2, atol=1e-2)
    assert int(res.compressed_positions[0]) == 2
    # compressed KV: the latent rotated at position 2 (group start), decoded from the cache
    cos, sin = TABLES[0][2].double(), TABLES[1][2].double()
    lat = res.latent[0].double()
    rd = cfg.rope_dim
    re, im = lat[-rd::2], lat[-rd + 1::2]
    rot = lat.clone()
    rot[-rd::2], rot[-rd + 1::2] = re * cos - im * sin, im * cos + re * sin
    row = 7 * cfg.cache.block_size + 1
    got = dequantize_compressed_kv(caches.compressed_kv.view(-1, cfg.head_dim // 2)[row],
                                   caches.compressed_kv_scale.view(-1, cfg.head_dim // 16)[row])
    err = (got.double() - rot).norm() / rot.norm()
    assert err < 0.15  # FP4 g16
    # index key from the UNROTATED latent, then RoPE at the same position
    k = (res.latent[0].double() @ w.index_wk.double()).float().bfloat16().double()
    k = k * torch.rsqrt(k.square().mean() + cfg.rms_norm_eps) * w.index_norm.double()
    kr = k.clone()
    re, im = k[-rd::2], k[-rd + 1::2]
    kr[-rd::2], kr[-rd + 1::2] = re * cos - im * sin, im * cos + re * sin
    torch.testing.assert_close(res.index_key[0].double(), kr, rtol=2e-2, atol=2e-2)
    gk = dequantize_index_key(caches.index_key.view(-1, 16)[row],
                              caches.index_key_scale.view(-1, 1)[row])
    assert (gk.double() - kr).norm() / kr.norm() < 0.2  # FP4 g32


def test_ratio1_publishes_every_token_with_a_slot():
    cfg = TINY
    w = make_weights(cfg, 1)
    caches, _ = fresh(cfg, 1)
    s = make_stream(cfg, 5, [2], block=0, seed=2)
    res, _, _ = run_call(cfg, 1, w, [(s, 0, 5)], caches, None)
    assert res.published.tolist() == [True] * 5
    assert res.compressed_positions.tolist() == list(range(5))
    expect = (s.x.double() @ w.wkv.double()).float().bfloat16().double()
    expect = expect * torch.rsqrt(expect.square().mean(-1, keepdim=True) + 1e-20) * w.norm.double()
    torch.testing.assert_close(res.latent.double(), expect, rtol=1e-2, atol=1e-2)
    flat = caches.compressed_kv.view(-1, cfg.head_dim // 2)
    assert (flat[32:37] != CACHE_FILL).any(dim=-1).all()
    assert (flat[37:48] == CACHE_FILL).all() and (flat[:32] == CACHE_FILL).all()


def test_inactive_request_touches_no_state_or_cache():
    cfg = with_capacity(4)
    w = make_weights(cfg, 2)
    caches, state = fresh(cfg, 2)
    state[:] = 1.5
    live = make_stream(cfg, 4, [1], block=3, seed=1)
    dead = make_stream(cfg, 6, [2], block=-1, seed=2, nan=True)
    before = snapshot(caches, state)
    res, _, _ = run_call(cfg, 2, w, [(dead, 0, 6), (live, 0, 4)], caches, state)
    after = snapshot(caches, state)
    assert not res.produced[:6].any() and res.produced[6:].tolist() == [False, True, False, True]
    assert not torch.isnan(res.latent).any()
    # only block 3 and live's page 1 (rows 16, 17) changed
    changed_state = (before["state"] != after["state"]).view(NUM_STATE, -1).any(-1)
    assert changed_state.nonzero().flatten().tolist() == [3]
    rows = (before["compressed_kv"] != after["compressed_kv"]).view(-1, 32).any(-1)
    assert rows.nonzero().flatten().tolist() == [16, 17]


def test_empty_work_touches_nothing():
    cfg = with_capacity(4)
    for ratio in (1, 2):
        w = make_weights(cfg, ratio)
        caches, state = fresh(cfg, ratio)
        before = snapshot(caches, state)
        kw = dict(state_block_table=torch.tensor([[0], [99]], dtype=I32), state_cache=state) \
            if ratio == 2 else {}
        res = compress_and_publish(
            cfg, ratio, torch.full((3, cfg.hidden_size), float("nan")).bfloat16(), w,
            query_start_loc=torch.tensor([0, 0, 0], dtype=I32),
            position_ids=torch.tensor([1, 3, 5], dtype=I32),
            token_to_req_indices=torch.tensor([7, -4, 0], dtype=I32), num_tokens=0,
            compressed_slots=torch.tensor([0, 1, 10**9], dtype=I64),
            freqs_cos=TABLES[0], freqs_sin=TABLES[1], caches=caches, **kw)
        assert not res.produced.any() and not res.published.any()
        assert_same_bytes(before, snapshot(caches, state))


def test_negative_positions_are_inert():
    cfg = with_capacity(2)
    w = make_weights(cfg, 2)
    caches, state = fresh(cfg, 2)
    before = snapshot(caches, state)
    x = torch.full((2, cfg.hidden_size), float("nan")).bfloat16()
    compress_and_publish(
        cfg, 2, x, w, query_start_loc=torch.tensor([0, 2], dtype=I32),
        position_ids=torch.tensor([-1, -1], dtype=I32),
        token_to_req_indices=torch.tensor([5, 5], dtype=I32), num_tokens=2,
        compressed_slots=torch.tensor([3, 4], dtype=I64), freqs_cos=TABLES[0],
        freqs_sin=TABLES[1], caches=caches,
        state_block_table=torch.tensor([[0]], dtype=I32), state_cache=state)
    assert_same_bytes(before, snapshot(caches, state))


# ---- bad input raises before any byte changes ------------------------------------------------

def _bad_call(cfg, **over):
    w = make_weights(cfg, 2)
    caches, state = fresh(cfg, 2)
    a = make_stream(cfg, 4, [1], block=0, seed=1)
    b = make_stream(cfg, 3, [2], block=1, seed=2)
    x = torch.cat([a.x, b.x])
    args = dict(query_start_loc=torch.tensor([0, 4, 7], dtype=I32),
                position_ids=torch.tensor([0, 1, 2, 3, 6, 7, 8], dtype=I32),
                token_to_req_indices=torch.tensor([0, 0, 0, 0, 1, 1, 1], dtype=I32),
                num_tokens=7,
                compressed_slots=torch.tensor([-1, 16, -1, 17, -1, 35, -1], dtype=I64),
                freqs_cos=TABLES[0], freqs_sin=TABLES[1], caches=caches,
                state_block_table=torch.tensor([[0], [1]], dtype=I32), state_cache=state)
    args.update(over)
    return w, x, args, caches, state


BAD = [
    ("state block out of range", dict(state_block_table=torch.tensor([[0], [NUM_STATE]], dtype=I32)),
     r"state_block_table\[1, 0\]: 8 outside \[-1, num_state_blocks=8\)"),
    ("state block below -1", dict(state_block_table=torch.tensor([[-2], [1]], dtype=I32)),
     r"state_block_table\[0, 0\]: -2 outside"),
    ("duplicate live state block", dict(state_block_table=torch.tensor([[1], [1]], dtype=I32)),
     r"state_block_table\[1, 0\].*distinct state blocks.*block 1"),
    ("cache block out of range",
     dict(compressed_slots=torch.tensor([-1, 16, -1, 17, -1, NUM_BLOCKS * 16, -1], dtype=I64)),
     r"compressed_slots\[5\]: 256 at or past the cache rows 256"),
    ("slot on an incomplete pair",
     dict(compressed_slots=torch.tensor([-1, 16, 20, 17, -1, 35, -1], dtype=I64)),
     r"compressed_slots\[2\].*does not complete a ratio-2 group"),
    ("duplicate slot", dict(compressed_slots=torch.tensor([-1, 16, -1, 16, -1, 35, -1], dtype=I64)),
     r"compressed_slots\[3\]: row 16 is also published by token 1"),
    ("slot on a disabled request",
     dict(state_block_table=torch.tensor([[0], [-1]], dtype=I32)),
     r"compressed_slots\[5\].*disabled"),
    ("position past RoPE capacity",
     dict(position_ids=torch.tensor([0, 1, 2, 3, ROPE_CAP, ROPE_CAP + 1, ROPE_CAP + 2], dtype=I32)),
     r"position_ids\[5\]: compressed position 128 is at or past the RoPE table capacity 128"),
    ("nonconsecutive positions",
     dict(position_ids=torch.tensor([0, 1, 2, 3, 6, 7, 9], dtype=I32)),
     r"position_ids\[6\]: 9, expected 8"),
    ("token in the wrong request",
     dict(token_to_req_indices=torch.tensor([0, 0, 0, 1, 1, 1, 1], dtype=I32)),
     r"token_to_req_indices\[3\]: 1, expected 0"),
    ("num_tokens mismatch", dict(num_tokens=6), r"num_tokens: 6 != query_start_loc\[-1\] = 7"),
    ("decreasing query_start_loc", dict(query_start_loc=torch.tensor([0, 5, 4], dtype=I32)),
     r"query_start_loc: decreases at request 1"),
    ("state ring of another capacity", dict(state_cache=torch.zeros(NUM_STATE, 3, 128)),
     r"state_cache: shape \[8, 3, 128\], expected \[8, 4, 128\]"),
    ("slots dtype", dict(compressed_slots=torch.zeros(7)), r"compressed_slots: dtype"),
]


@pytest.mark.parametrize("name,over,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_before_any_write(name, over, match):
    cfg = TINY
    w, x, args, caches, state = _bad_call(cfg, **over)
    st_live = args["state_cache"]
    before = snapshot(caches, st_live)
    with pytest.raises(ValueError, match=match):
        compress_and_publish(cfg, 2, x, w, **args)
    assert_same_bytes(before, snapshot(caches, st_live))


def test_good_call_of_the_bad_fixture_writes():
    """Control for the table above: unmodified, the same call does write."""
    w, x, args, caches, state = _bad_call(TINY)
    before = snapshot(caches, state)
    compress_and_publish(TINY, 2, x, w, **args)
    after = snapshot(caches, state)
    assert not torch.equal(before["state"], after["state"])
    assert not torch.equal(before["compressed_kv"], after["compressed_kv"])
