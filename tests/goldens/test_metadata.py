"""goldens.metadata: ForwardMetadata lowering against a slow per-token model.

The reference below walks tokens and positions with plain Python loops over lists; it
shares no helper with the module under test.  Hypothesis draws ragged TINY batches
(empty requests, trailing padding, block-crossing prefill chunks, decode rows over long
prefixes, shuffled physical pages, ratio-1 and ratio-2 sources, disabled state blocks);
a small FLASH decode batch pins the production geometry.  Every bad-input path checks
that the ValueError names the field, the request (where there is one) and the bound.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goldens.config import FLASH, TINY
from goldens.metadata import ForwardMetadata, build_forward_metadata

I32, I64 = torch.int32, torch.int64


def i32(x):
    return torch.tensor(x, dtype=I32)


# ---- slow reference ----------------------------------------------------------

def slow_reference(config, qsl, kv, wt, ctables, stables, T, tp):
    """Expected fields as ``{name: (dtype, value as nested lists)}`` (per-source fields
    as ``{name: {src: (dtype, value)}}``).  Inputs are plain lists."""
    bs, W = config.cache.block_size, config.sliding_window
    B = len(qsl) - 1
    qlens = [qsl[r + 1] - qsl[r] for r in range(B)]
    new = [kv[r] + qlens[r] for r in range(B)]

    def slot(table, r, row):
        return table[r][row // bs] * bs + row % bs

    req, pos = [-1] * T, [-1] * T
    for r in range(B):
        for t in range(qsl[r], qsl[r + 1]):
            req[t] = r
            pos[t] = kv[r] + (t - qsl[r])

    window_slots, window_indices, window_lens = [], [], []
    for t in range(T):
        if req[t] < 0:
            window_slots.append(-1)
            window_indices.append([-1] * W)
            window_lens.append(0)
            continue
        window_slots.append(slot(wt, req[t], pos[t]))
        row = [slot(wt, req[t], q) for q in range(pos[t] - W + 1, pos[t] + 1) if q >= 0]
        window_lens.append(len(row))
        window_indices.append(row + [-1] * (W - len(row)))

    exp = {
        "num_tokens": (None, qsl[-1]),
        "num_padded_tokens": (None, T),
        "query_start_loc": (I32, list(qsl)),
        "query_lens": (I32, qlens),
        "logit_row_indices": (I32, [qsl[r + 1] - 1 if qlens[r] else -1 for r in range(B)]),
        "token_to_req_indices": (I32, req),
        "moe_token_owners": (I32, [t % tp for t in range(T)]),
        "position_ids": (I32, pos),
        "kv_seq_lens": (I32, list(kv)),
        "new_kv_seq_lens": (I32, new),
        "window_slots": (I64, window_slots),
        "window_indices": (I32, window_indices),
        "window_lens": (I32, window_lens),
    }
    per = {k: {} for k in (
        "compressed_slots", "index_slots", "state_block_tables", "compressed_seq_lens",
        "compressed_seq_remainders", "compressed_lens", "compressor_output_start_loc",
        "compressor_source_token_indices", "compressor_position_ids",
        "compressed_rope_position_ids")}
    for src in config.kv_source_layer_ids:
        ratio = config.compress_ratios[src]
        slots, clens, rope = [], [], []
        for t in range(T):
            r, p = req[t], pos[t]
            if r < 0:
                slots.append(-1)
                clens.append(0)
                rope.append(-1)
                continue
            done = (p + 1) % ratio == 0
            disabled = ratio == 2 and stables[src][r][0] == -1
            slots.append(slot(ctables[src], r, p // ratio) if done and not disabled else -1)
            clens.append((p + 1) // ratio)
            rope.append(p + 1 - ratio if done else -1)
        starts, src_rows, gpos = [0], [], []
        for r in range(B):
            for p in range(kv[r], new[r]):
                if (p + 1) % ratio == 0:  # p closes group (p+1)/ratio - 1
                    src_rows.append(qsl[r] + p - kv[r])
                    gpos.append(p + 1 - ratio)
            starts.append(len(src_rows))
        per["compressed_slots"][src] = (I64, slots)
        per["index_slots"][src] = (I64, slots)
        per["compressed_seq_lens"][src] = (I32, [n // ratio for n in new])
        per["compressed_seq_remainders"][src] = (I32, [n % ratio for n in new])
        per["compressed_lens"][src] = (I32, clens)
        per["compressor_output_start_loc"][src] = (I32, starts)
        per["compressor_source_token_indices"][src] = (I32, src_rows)
        per["compressor_position_ids"][src] = (I32, gpos)
        per["compressed_rope_position_ids"][src] = (I32, rope)
        if ratio == 2:
            per["state_block_tables"][src] = (I32, [list(row) for row in stables[src]])
    return exp, per


def assert_matches_reference(meta: ForwardMetadata, config, qsl, kv, wt, ctables, stables,
                             T, tp):
    exp, per = slow_reference(config, qsl, kv, wt, ctables, stables, T, tp)
    names = {f.name for f in dataclasses.fields(meta)} - {"source_ratios"}
    assert names == set(exp) | set(per), "every ForwardMetadata field must be checked"
    assert dict(meta.source_ratios) == {s: config.compress_ratios[s]
                                        for s in config.kv_source_layer_ids}

    def check(label, got, dtype, want):
        if dtype is None:
            assert got == want, f"{label}: {got} != {want}"
            return
        assert isinstance(got, torch.Tensor), label
        assert got.dtype == dtype, f"{label}: dtype {got.dtype} != {dtype}"
        if label.startswith("window_indices"):
            assert tuple(got.shape) == (T, config.sliding_window), label
        elif label.startswith("state_block_tables"):
            assert got.dim() == 2 and got.shape[1] == 1, label
        else:
            assert got.dim() == 1 and got.shape[0] == len(want), f"{label}: {got.shape}"
        assert got.tolist() == want, f"{label}:\n got  {got.tolist()}\n want {want}"

    for name, (dtype, want) in exp.items():
        check(name, getattr(meta, name), dtype, want)
    for name, by_src in per.items():
        got = getattr(meta, name)
        assert set(got) == set(by_src), f"{name}: sources {sorted(got)} != {sorted(by_src)}"
        for src, (dtype, want) in by_src.items():
            check(f"{name}[{src}]", got[src], dtype, want)


# ---- batch generation --------------------------------------------------------

def _page_table(rnd, needs, extra_width, bs, leave_empty):
    """INT32-list table with ``needs[r]`` shuffled distinct physical pages per request."""
    width = max(needs, default=0) + extra_width
    pool = list(range(sum(needs) + 8))
    rnd.shuffle(pool)
    table = []
    for r, need in enumerate(needs):
        row = [-1] * width
        if not leave_empty[r]:
            for k in range(need):
                row[k] = pool.pop()
        table.append(row)
    return table


def _state_table(rnd, qlens, p_disable, p_alias):
    """Distinct blocks for live requests; empty requests may alias a live block."""
    pool = list(range(2 * len(qlens) + 2))
    rnd.shuffle(pool)
    rows = []
    for q in qlens:
        if rnd.random() < p_disable:
            rows.append([-1])
        elif q == 0 and rows and rnd.random() < p_alias:
            rows.append([rows[0][0]])  # not live: sharing is allowed
        else:
            rows.append([pool.pop()])
    return rows


@st.composite
def ragged_batches(draw, config=TINY):
    bs = config.cache.block_size
    B = draw(st.integers(0, 5))
    qlens, kv = [], []
    for _ in range(B):
        kind = draw(st.sampled_from(["empty", "prefill", "cached_prefill", "decode"]))
        if kind == "empty":
            qlens.append(0)
            kv.append(draw(st.integers(0, 60)))
        elif kind == "prefill":
            qlens.append(draw(st.integers(1, 3 * bs)))
            kv.append(0)
        elif kind == "cached_prefill":
            qlens.append(draw(st.integers(1, 2 * bs)))
            kv.append(draw(st.integers(1, 3 * bs)))
        else:
            qlens.append(draw(st.integers(1, config.cache.decode_rows_per_request)))
            kv.append(draw(st.integers(2 * bs, 20 * bs)))
    qsl = [0]
    for q in qlens:
        qsl.append(qsl[-1] + q)
    new = [k + q for k, q in zip(kv, qlens)]
    rnd = draw(st.randoms(use_true_random=False))
    pad = draw(st.integers(0, 4))
    tp = draw(st.sampled_from([1, 2, 4]))
    # empty requests may own no pages at all
    leave = [q == 0 and draw(st.booleans()) for q in qlens]
    wt = _page_table(rnd, [-(-n // bs) for n in new], draw(st.integers(0, 2)), bs, leave)
    ctables, shared = {}, {}
    for src in config.kv_source_layer_ids:
        ratio = config.compress_ratios[src]
        if ratio not in shared:
            shared[ratio] = _page_table(rnd, [-(-(n // ratio) // bs) for n in new],
                                        draw(st.integers(0, 2)), bs, leave)
        ctables[src] = shared[ratio]
    stables = {src: _state_table(rnd, qlens, draw(st.sampled_from([0.0, 0.3])), 0.5)
               for src in config.kv_source_layer_ids if config.compress_ratios[src] == 2}
    clone_shared = draw(st.booleans())
    return dict(qsl=qsl, kv=kv, wt=wt, ctables=ctables, stables=stables,
                T=qsl[-1] + pad, tp=tp, clone_shared=clone_shared)


def _table(rows):
    """INT32 [B, width] from equal-width row lists (width 0 when B == 0)."""
    return torch.tensor(rows, dtype=I32).reshape(len(rows), len(rows[0]) if rows else 0)


def _to_tensors(config, b):
    """Same-ratio sources get one tensor object, or equal-content clones."""
    ctables, by_ratio = {}, {}
    for src, table in b["ctables"].items():
        ratio = config.compress_ratios[src]
        t = _table(table)
        if ratio in by_ratio:
            t = by_ratio[ratio].clone() if b["clone_shared"] else by_ratio[ratio]
        by_ratio.setdefault(ratio, t)
        ctables[src] = t
    B = len(b["kv"])
    return dict(
        query_start_loc=i32(b["qsl"]),
        kv_seq_lens=i32(b["kv"]),
        window_block_table=_table(b["wt"]),
        compressed_block_tables=ctables,
        state_block_tables={s: torch.tensor(v, dtype=I32).reshape(B, 1)
                            for s, v in b["stables"].items()},
    )


def _build_and_compare(config, b):
    meta = build_forward_metadata(config, **_to_tensors(config, b),
                                  num_padded_tokens=b["T"], tp=b["tp"])
    assert_matches_reference(meta, config, b["qsl"], b["kv"], b["wt"], b["ctables"],
                             b["stables"], b["T"], b["tp"])
    return meta


# ---- agreement with the slow model ---------------------------------------------

@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ragged_batches())
def test_tiny_ragged_batches_match_slow_reference(batch):
    _build_and_compare(TINY, batch)


def test_flash_decode_batch_matches_slow_reference():
    rnd = random.Random(7)
    qlens = [1, 6, 3, 0, 2]
    kv = [1000, 127, 4095, 50, 0]
    b = _flash_batch(rnd, qlens, kv, pad=3)
    meta = _build_and_compare(FLASH, b)
    assert set(meta.compressed_slots) == {2, 8, 14, 20}
    assert set(meta.state_block_tables) == {2, 8, 14}
    assert meta.window_indices.shape == (sum(qlens) + 3, 128)
    # request 1 crosses its first 128-row page at position 127 -> 128
    assert meta.window_lens[1:7].tolist() == [128] * 6


def _flash_batch(rnd, qlens, kv, pad):
    bs = FLASH.cache.block_size
    new = [k + q for k, q in zip(kv, qlens)]
    qsl = [0]
    for q in qlens:
        qsl.append(qsl[-1] + q)
    no = [False] * len(qlens)
    wt = _page_table(rnd, [-(-n // bs) for n in new], 1, bs, no)
    c2 = _page_table(rnd, [-(-(n // 2) // bs) for n in new], 0, bs, no)
    c1 = _page_table(rnd, [-(-n // bs) for n in new], 2, bs, no)
    ctables = {2: c2, 8: c2, 14: c2, 20: c1}
    stables = {s: _state_table(rnd, qlens, 0.0, 0.0) for s in (2, 8, 14)}
    stables[8][2] = [-1]  # one disabled ratio-2 compressor on a live request
    return dict(qsl=qsl, kv=kv, wt=wt, ctables=ctables, stables=stables,
                T=qsl[-1] + pad, tp=4, clone_shared=False)


def test_hand_computed_tiny_batch():
    """Independent anchor for the slow model: values worked out by hand."""
    meta = build_forward_metadata(
        TINY, i32([0, 3, 3, 5]), i32([0, 10, 14]),
        i32([[0, -1], [1, -1], [2, 3]]),
        {2: i32([[4, -1], [5, -1], [6, -1]]), 4: i32([[4, -1], [5, -1], [6, -1]]),
         6: i32([[7, -1], [8, -1], [9, 10]])},
        {2: i32([[0], [0], [1]]), 4: i32([[-1], [2], [3]])},
        num_padded_tokens=7, tp=2)
    assert meta.num_tokens == 5 and meta.num_padded_tokens == 7
    assert meta.position_ids.tolist() == [0, 1, 2, 14, 15, -1, -1]
    assert meta.token_to_req_indices.tolist() == [0, 0, 0, 2, 2, -1, -1]
    assert meta.logit_row_indices.tolist() == [2, -1, 4]
    assert meta.moe_token_owners.tolist() == [0, 1, 0, 1, 0, 1, 0]
    assert meta.window_slots.tolist() == [0, 1, 2, 46, 47, -1, -1]
    assert meta.window_indices[4].tolist() == [40, 41, 42, 43, 44, 45, 46, 47]
    assert meta.window_indices[1].tolist() == [0, 1] + [-1] * 6
    assert meta.window_lens.tolist() == [1, 2, 3, 8, 8, 0, 0]
    # position 15 closes ratio-2 group 7 -> row 7 of page 6; request 0 is disabled at 4
    assert meta.compressed_slots[2].tolist() == [-1, 64, -1, -1, 103, -1, -1]
    assert meta.compressed_slots[4].tolist() == [-1, -1, -1, -1, 103, -1, -1]
    assert meta.index_slots[6].tolist() == [112, 113, 114, 158, 159, -1, -1]
    assert meta.compressed_lens[2].tolist() == [0, 1, 1, 7, 8, 0, 0]
    assert meta.compressed_seq_lens[2].tolist() == [1, 5, 8]
    assert meta.compressed_seq_remainders[2].tolist() == [1, 0, 0]
    assert meta.compressor_output_start_loc[2].tolist() == [0, 1, 1, 2]
    assert meta.compressor_source_token_indices[2].tolist() == [1, 4]
    assert meta.compressor_position_ids[2].tolist() == [0, 14]
    assert meta.compressed_rope_position_ids[2].tolist() == [-1, 0, -1, -1, 14, -1, -1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.num_tokens = 0


def test_zero_requests_with_padding_rows_are_all_padding():
    empty = torch.zeros(0, 1, dtype=I32)
    meta = build_forward_metadata(
        TINY, i32([0]), i32([]), empty, {2: empty, 4: empty, 6: empty},
        {2: empty, 4: empty}, num_padded_tokens=3)
    assert meta.position_ids.tolist() == [-1, -1, -1]
    assert meta.window_indices.tolist() == [[-1] * 8] * 3
    assert meta.compressor_source_token_indices[6].tolist() == []


def test_build_does_not_mutate_inputs_and_outputs_are_fresh():
    b = _valid_inputs()
    snapshot = {k: (v.clone() if isinstance(v, torch.Tensor) else
                    {s: t.clone() for s, t in v.items()}) for k, v in b.items()}
    meta = build_forward_metadata(TINY, **b)
    meta.state_block_tables[2][0, 0] = 99
    for k, v in b.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, snapshot[k]), k
        else:
            for s in v:
                assert torch.equal(v[s], snapshot[k][s]), f"{k}[{s}]"


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ragged_batches(), st.data())
def test_any_missing_visible_page_is_reported_for_its_request(batch, data):
    """Knock out one visible page of one live request (window or ratio-1 table)."""
    bs = TINY.cache.block_size
    live = [r for r in range(len(batch["kv"])) if batch["qsl"][r + 1] > batch["qsl"][r]]
    if not live:
        return
    r = data.draw(st.sampled_from(live))
    new_len = batch["kv"][r] + batch["qsl"][r + 1] - batch["qsl"][r]
    page = data.draw(st.integers(0, -(-new_len // bs) - 1))
    field = data.draw(st.sampled_from(["window_block_table", "compressed_block_tables[6]"]))
    inputs = _to_tensors(TINY, batch)
    if field == "window_block_table":
        inputs[field] = _set(inputs[field], (r, page), -1)
    else:
        tables = inputs["compressed_block_tables"]
        inputs["compressed_block_tables"] = {**tables, 6: _set(tables[6], (r, page), -1)}
    with pytest.raises(ValueError) as err:
        build_forward_metadata(TINY, **inputs, num_padded_tokens=batch["T"])
    msg = str(err.value)
    assert field in msg and f"request {r} " in msg and f"page {page} " in msg, msg


# ---- bad inputs ------------------------------------------------------------------

def _valid_inputs():
    """TINY: request 0 prefill at 0..2, request 1 empty (owns no pages), request 2 decode
    at 20..24 (window pages 0-1, ratio-1 pages 0-1, ratio-2 rows 0..11 in page 0)."""
    return dict(
        query_start_loc=i32([0, 3, 3, 8]),
        kv_seq_lens=i32([0, 5, 20]),
        window_block_table=i32([[3, -1], [-1, -1], [0, 5]]),
        compressed_block_tables={2: i32([[1, -1], [-1, -1], [2, -1]]),
                                 4: i32([[1, -1], [-1, -1], [2, -1]]),
                                 6: i32([[4, -1], [-1, -1], [7, 6]])},
        state_block_tables={2: i32([[0], [0], [1]]), 4: i32([[2], [-1], [3]])},
    )


def test_valid_inputs_build():
    meta = build_forward_metadata(TINY, **_valid_inputs(), num_state_blocks=4)
    assert meta.num_tokens == 8


def _mut(**changes):
    def apply(b):
        for key, fn in changes.items():
            b[key] = fn(b[key])
        return b
    return apply


def _set(t, idx, value):
    t = t.clone()
    t[idx] = value
    return t


def _with(d, key, value):
    d = dict(d)
    if value is None:
        del d[key]
    else:
        d[key] = value
    return d


BAD_INPUTS = [
    # (id, mutation of the valid inputs, extra kwargs, substrings the message must contain)
    ("qsl_dtype", _mut(query_start_loc=lambda t: t.long()), {},
     ["query_start_loc", "torch.int64", "torch.int32"]),
    ("kv_dtype", _mut(kv_seq_lens=lambda t: t.float()), {}, ["kv_seq_lens", "dtype"]),
    ("window_dtype", _mut(window_block_table=lambda t: t.long()), {},
     ["window_block_table", "dtype"]),
    ("compressed_dtype", _mut(compressed_block_tables=lambda d: _with(d, 6, d[6].long())), {},
     ["compressed_block_tables[6]", "dtype"]),
    ("state_dtype", _mut(state_block_tables=lambda d: _with(d, 2, d[2].long())), {},
     ["state_block_tables[2]", "dtype"]),
    ("not_a_tensor", _mut(kv_seq_lens=lambda t: t.tolist()), {}, ["kv_seq_lens", "Tensor"]),
    ("kv_shape", _mut(kv_seq_lens=lambda t: i32([0, 5, 20, 1])), {},
     ["kv_seq_lens", "shape [4]", "[3]"]),
    ("qsl_shape_2d", _mut(query_start_loc=lambda t: t[None]), {}, ["query_start_loc", "shape"]),
    ("qsl_empty", _mut(query_start_loc=lambda t: t[:0]), {}, ["query_start_loc", "shape"]),
    ("window_shape", _mut(window_block_table=lambda t: t[:2]), {},
     ["window_block_table", "shape [2, 2]", "[3, *]"]),
    ("compressed_shape", _mut(compressed_block_tables=lambda d: _with(d, 6, d[6][:, 0])), {},
     ["compressed_block_tables[6]", "shape"]),
    ("state_shape", _mut(state_block_tables=lambda d: _with(d, 4, d[4].repeat(1, 2))), {},
     ["state_block_tables[4]", "shape [3, 2]", "[3, 1]"]),
    ("qsl_nonzero_start", _mut(query_start_loc=lambda t: i32([1, 3, 3, 8])), {},
     ["query_start_loc", "expected 0"]),
    ("qsl_decreasing", _mut(query_start_loc=lambda t: i32([0, 3, 2, 8])), {},
     ["query_start_loc", "request 1", "nondecreasing"]),
    ("kv_negative", _mut(kv_seq_lens=lambda t: i32([0, 5, -1])), {},
     ["kv_seq_lens", "request 2", ">= 0"]),
    ("max_position", _mut(kv_seq_lens=lambda t: i32([0, 5, 8190])), {},
     ["kv_seq_lens", "request 2", "8195", "max_position 8192"]),
    ("window_unallocated", _mut(window_block_table=lambda t: _set(t, (2, 1), -1)), {},
     ["window_block_table", "request 2", "page 1", "unallocated"]),
    ("window_boundary_page",  # new length 17: position 16 is the first row of page 1
     _mut(kv_seq_lens=lambda t: i32([0, 5, 12]),
          window_block_table=lambda t: _set(t, (2, 1), -1)), {},
     ["window_block_table", "request 2", "page 1", "17 rows"]),
    ("window_too_narrow", _mut(window_block_table=lambda t: t[:, :1]), {},
     ["window_block_table", "request 2", "needs 2 pages", "1 columns"]),
    ("compressed_unallocated",
     _mut(compressed_block_tables=lambda d: _with(d, 6, _set(d[6], (2, 0), -1))), {},
     ["compressed_block_tables[6]", "request 2", "page 0", "unallocated"]),
    ("compressed_too_narrow",
     _mut(compressed_block_tables=lambda d: {**d, 6: d[6][:, :1]}), {},
     ["compressed_block_tables[6]", "request 2", "needs 2 pages", "1 columns"]),
    ("compressed_unallocated_ratio2",
     _mut(compressed_block_tables=lambda d: {**d, 2: _set(d[2], (0, 0), -1),
                                             4: _set(d[4], (0, 0), -1)}), {},
     ["compressed_block_tables[2]", "request 0", "page 0"]),
    ("unshared_same_ratio",
     _mut(compressed_block_tables=lambda d: _with(d, 4, _set(d[4], (2, 0), 9))), {},
     ["compressed_block_tables[4]", "ratio-2", "share", "compressed_block_tables[2]"]),
    ("unshared_same_ratio_shape",
     _mut(compressed_block_tables=lambda d: _with(d, 4, torch.cat([d[4], d[4]], 1))), {},
     ["compressed_block_tables[4]", "share"]),
    ("missing_compressed_table", _mut(compressed_block_tables=lambda d: _with(d, 6, None)), {},
     ["compressed_block_tables[6]", "missing"]),
    ("non_source_compressed_table",
     _mut(compressed_block_tables=lambda d: _with(d, 8, d[6])), {},
     ["compressed_block_tables[8]", "not a compressed KV source"]),
    ("duplicate_live_state",
     _mut(state_block_tables=lambda d: _with(d, 2, i32([[1], [-1], [1]]))), {},
     ["state_block_tables[2]", "live requests must own distinct state blocks", "request 2",
      "request 0", "block 1"]),
    ("state_below_minus_one",
     _mut(state_block_tables=lambda d: _with(d, 4, i32([[2], [-2], [3]]))), {},
     ["state_block_tables[4]", "request 1", "-2", "< -1"]),
    ("state_out_of_range", _mut(), {"num_state_blocks": 3},
     ["state_block_tables[4]", "request 2", "block 3", "num_state_blocks 3"]),
    ("missing_state_table", _mut(state_block_tables=lambda d: _with(d, 4, None)), {},
     ["state_block_tables[4]", "missing", "ratio-2"]),
    ("state_table_for_ratio1",
     _mut(state_block_tables=lambda d: _with(d, 6, i32([[5], [6], [7]]))), {},
     ["state_block_tables[6]", "not a ratio-2 KV source"]),
    ("padded_short", _mut(), {"num_padded_tokens": 7},
     ["num_padded_tokens", "7", "num_tokens", "8"]),
    ("tp_zero", _mut(), {"tp": 0}, ["tp", ">= 1"]),
    ("num_state_blocks_negative", _mut(), {"num_state_blocks": -1}, ["num_state_blocks"]),
]


@pytest.mark.parametrize("mutate,kwargs,needles", [c[1:] for c in BAD_INPUTS],
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_inputs_raise_naming_field_request_and_bound(mutate, kwargs, needles):
    with pytest.raises(ValueError) as err:
        build_forward_metadata(TINY, **mutate(_valid_inputs()), **kwargs)
    msg = str(err.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"


def test_tolerated_inputs():
    """Pages and blocks of requests without work are not inspected; equal-content clones of
    a shared table, a disabled live compressor and wide tables are accepted."""
    b = _valid_inputs()
    b["window_block_table"] = _set(b["window_block_table"], (1, 0), -7)
    b["compressed_block_tables"] = {**b["compressed_block_tables"],
                                    4: b["compressed_block_tables"][2].clone()}
    b["state_block_tables"] = {2: i32([[0], [0], [-1]]), 4: i32([[2], [2], [3]])}
    meta = build_forward_metadata(TINY, **b)
    assert meta.compressed_slots[2][3:].tolist() == [-1] * 5  # request 2 disabled at 2
    assert meta.compressed_slots[4][3:].tolist() == [-1, 42, -1, 43, -1]
