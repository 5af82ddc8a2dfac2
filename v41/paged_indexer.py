"""Paged indexer: scores over a source's packed MXFP4 index-key cache and Top-K physical rows
(golden: ``goldens.indexer.paged_indexer``, without ``select_candidates``; the candidate
blocks are :mod:`v41.hierarchical_indexer`).

For token ``t`` of request ``r = token_to_req_indices[t]`` and logical compressed position
``k < compressed_lens[t]`` (the key is physical row ``table[r, k // bs] * bs + k % bs``)::

    dot_hk  = bf16(q_th . key_k)           (FP32 accumulation on the cube)
    s_hk    = bf16(relu(dot_hk) * w_th)
    score_k = bf16(sum_h s_hk)             (FP32 sum over heads)

Positions at or past ``compressed_lens[t]`` and, with a candidate mask (Reindex), positions
the mask excludes score ``MASKED`` (-inf).  (The golden sums the heads in FP64 and rounds
once to FP32; the FP32 sum can differ in its last bit, which the BF16 rounding almost always
absorbs; the Top-K acceptance judges the rest.)  Top-K: the ``topk`` best finite scores, ties to
the lower position (:func:`v41.rank_select.select`), listed by ascending logical position as
physical rows, trailing -1 (:func:`v41.rank_select.ascending`).

Kernel algorithm (per token): the physical row of every logical position is gathered once
from the request's block-table row; the positions up to ``compressed_lens[t]`` are scored in
tiles of ``KEY_TILE`` (512) keys, a loop over the dynamic tile count.  Each tile's packed
E2M1 rows and E8M0 scales are gathered and decoded to BF16 by
:func:`v41.kv_decode.fp4_keys` (whole rows, one subgraph, exact) inside the scoring loop:
there is no decoded-key buffer.  The tile's scores go to the token's row of the FP32
``scores`` buffer ``[tokens, max(width, topk)]`` (columns past ``width`` stay MASKED), which
the Top-K then reads.  The host bounds ``tokens`` per launch by the score budget
(``max_logits_bytes``) and validates every row id and length before launch
(``harness.entries.paged_indexer.validate_launch``).

Schedule (A5 cost model, FLASH TP4 T=192 in launches of 32 rows): 64-key tiles with the
arithmetic decoder of ``v41.mx_decode`` (its on-chip reshapes went through global memory)
took 1,842 us; the whole-row decoder and 512-key tiles take 423 us, the same Top-K rows
(400 us with each token's steps before its key loop in one subgraph scope).
A token with a short prefix decodes a whole tile of masked keys; at decode lengths that
costs less than the extra loop iterations (256-key tiles: 109 us against 73 us for a
32-row FLASH launch).

ABI
---
===================  ==================================  ========  =====
name                 shape                               dtype     role
===================  ==================================  ========  =====
q                    (tokens, heads, head_dim)           bfloat16  in
weights              (tokens, heads)                     bfloat16  in
index_key            (blocks, block_size, 1, half)       uint8     in   (E2M1 pairs)
index_key_scale      (blocks, block_size, 1, groups)     uint8     in   (E8M0 codes)
index_block_table    (requests, pages)                   int32     in
token_to_req         (tokens,)                           int32     in
compressed_lens      (tokens,)                           int32     in
candidate_mask       (tokens, width)                     uint8     in   (only with candidates)
scores               (tokens, padded)                    float32   out  (score buffer)
topk_rows            (tokens, topk)                      int32     out
===================  ==================================  ========  =====

``width = pages * block_size``, ``padded = max(width, topk)``; ``blocks``, ``requests``,
``pages`` and ``candidates`` (bool) from the case dict.
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
import math

from v41 import kv_decode, rank_select
from v41.abi import Arg, case_int, jit_options, resolve
from v41.cube_tiles import cube_tiles
from v41.subgraph import one_subgraph

KEY_TILE = 512  # keys decoded and scored per step (the dims' width must be a multiple)
INT32_MAX = 2 ** 31 - 1

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "no_causal_mask": "scores every position of the block table, ignoring compressed_lens",
    "ignore_candidates": "scores outside the candidate mask too (Reindex)",
    "descending": "lists the selected rows by DESCENDING logical position",
    "higher_ties": "breaks equal scores toward the HIGHER logical position",
}

BASE_ABI = (
    Arg("q", ("tokens", "heads", "head_dim"), "bfloat16", "in"),
    Arg("weights", ("tokens", "heads"), "bfloat16", "in"),
    Arg("index_key", ("blocks", "block_size", 1, "half"), "uint8", "in"),
    Arg("index_key_scale", ("blocks", "block_size", 1, "groups"), "uint8", "in"),
    Arg("index_block_table", ("requests", "pages"), "int32", "in"),
    Arg("token_to_req", ("tokens",), "int32", "in"),
    Arg("compressed_lens", ("tokens",), "int32", "in"),
)
MASK_ARG = Arg("candidate_mask", ("tokens", "width"), "uint8", "in")
OUT_ABI = (
    Arg("scores", ("tokens", "padded"), "float32", "out"),
    Arg("topk_rows", ("tokens", "topk"), "int32", "out"),
)


def dims(config, case: dict) -> dict[str, int]:
    """Named dimensions of one launch; raises ValueError naming the bad field."""
    case = case or {}
    ix, cc = config.index, config.cache
    if ix.head_dim % cc.index_group:
        raise ValueError(f"config.index.head_dim: {ix.head_dim} is not a multiple of "
                         f"index_group {cc.index_group}")
    pages = case_int(case, "pages", minimum=1)
    width = pages * cc.block_size
    tile = min(KEY_TILE, width)
    padded = max(width, ix.topk)
    if width <= KEY_TILE:  # one tile of the width, cut to divide the Top-K-padded row too
        tile = math.gcd(tile, padded)
    if width % tile or tile % 16:
        raise ValueError(f"case['pages']: width {width} ({pages} pages x {cc.block_size}) "
                         f"must be a multiple of {tile} and of 16")
    if padded % tile:
        raise ValueError(f"config.index.topk: {ix.topk} is not a multiple of the key tile {tile}")
    blocks = case_int(case, "blocks", minimum=1)
    groups = ix.head_dim // cc.index_group
    if blocks * cc.block_size * groups > INT32_MAX:
        raise ValueError(f"case['blocks']: {blocks} blocks x {cc.block_size} rows x {groups} "
                         f"scale slots exceeds the INT32 slot range {INT32_MAX}")
    return {"tokens": case_int(case, "tokens", minimum=1), "heads": ix.n_heads,
            "head_dim": ix.head_dim, "half": ix.head_dim // 2, "groups": groups,
            "blocks": blocks, "block_size": cc.block_size,
            "requests": case_int(case, "requests", minimum=1), "pages": pages,
            "width": width, "padded": padded, "topk": ix.topk, "tile": tile}


def abi(config, case: dict):
    masked = bool((case or {}).get("candidates"))
    return resolve(BASE_ABI + ((MASK_ARG,) if masked else ()) + OUT_ABI, dims(config, case))


def build(config, case: dict | None = None, *, variant: str = "reference",
          runtime_options: dict | None = None):
    """The jit kernel ``paged_indexer(q, weights, index_key, index_key_scale,
    index_block_table, token_to_req, compressed_lens, [candidate_mask,] scores, topk_rows)``
    for ``config`` and ``case`` (everything fixed but tokens)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    case = case or {}
    dm = dims(config, case)
    h, d, half, g = dm["heads"], dm["head_dim"], dm["half"], dm["groups"]
    bs, pages, width, padded, k, tile = (dm["block_size"], dm["pages"], dm["width"],
                                         dm["padded"], dm["topk"], dm["tile"])
    rows = dm["blocks"] * bs
    group = config.cache.index_group
    masked = bool(case.get("candidates"))
    use_mask = masked and variant != "ignore_candidates"
    causal = variant != "no_causal_mask"
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")

    def body(q, weights, index_key, index_key_scale, index_block_table, token_to_req,
             compressed_lens, candidate_mask, scores, topk_rows):
        tokens = q.shape[0]
        # in-place views of the inputs: a copying reshape is a task every gather waits on
        # in-place GM views of the key cache, one row per scale group
        payload = pypto.reshape(index_key, [rows * g, group // 2], inplace=True)
        scales = pypto.reshape(index_key_scale, [rows * g], inplace=True)
        key_of = kv_decode.slot_constants(pypto, tile, g)
        nibbles = kv_decode.nibble_constants(pypto, group)
        table = kv_decode.nibble_table(pypto)
        pypto.set_vec_tile_shapes(padded)
        pos1 = pypto.arange(0.0, float(padded), 1.0)
        pypto.set_vec_tile_shapes(k)
        kio1 = pypto.arange(0.0, float(k), 1.0)
        pypto.set_vec_tile_shapes(width)
        lpos = pypto.arange(0.0, float(width), 1.0)
        page_f = pypto.floor(pypto.mul(lpos, 1.0 / bs))
        page_of = pypto.cast(page_f, pypto.DT_INT32)
        offset1 = pypto.cast(pypto.sub(lpos, pypto.mul(page_f, float(bs))), pypto.DT_INT32)
        pypto.set_vec_tile_shapes(1, width)
        offset = pypto.reshape(offset1, [1, width])
        pypto.set_vec_tile_shapes(1, padded)
        pos = pypto.reshape(pos1, [1, padded])
        if variant == "higher_ties":
            rev = pypto.add(pos, 1.0)
        else:
            rev = pypto.add(pypto.mul(pos, -1.0), float(padded))
        pypto.set_vec_tile_shapes(1, k)
        kio = pypto.reshape(kio1, [1, k])
        pypto.set_cube_tile_shapes(*cube_tiles(h, d, tile, 2))
        for t in pypto.loop(tokens, name="IDX_TOKENS", idx_name="t"):
            req = token_to_req[t]
            visible, phys, wt, qt = _token_prelude(
                pypto, q, weights, index_block_table, compressed_lens, scores, t, req, pos,
                page_of, offset, bs, pages, width, padded, h, d)
            if causal:  # only the tiles holding visible positions
                ntiles = (compressed_lens[t] + tile - 1) // tile
            else:
                ntiles = width // tile
            for j in pypto.loop(ntiles, name="IDX_KEY_TILES", idx_name="j"):
                ids = pypto.view(phys, [1, tile], [0, j * tile])
                kb = kv_decode.fp4_keys(pypto, ids, payload, scales, table, key_of, nibbles,
                                        tile, d, group, scale_e8m0=True)
                dot = pypto.matmul(qt, kb, pypto.DT_FP32, b_trans=True)  # [h, tile]
                pypto.set_vec_tile_shapes(h, tile)
                dot = pypto.maximum(pypto.cast(pypto.cast(dot, pypto.DT_BF16), pypto.DT_FP32),
                                    0.0)
                s = pypto.mul(dot, pypto.expand_clone(wt, [h, tile]))
                s = pypto.cast(pypto.cast(s, pypto.DT_BF16), pypto.DT_FP32)
                total = pypto.sum(s, 0, keepdim=True)  # [1, tile]
                pypto.set_vec_tile_shapes(1, tile)
                sc = pypto.cast(pypto.cast(total, pypto.DT_BF16), pypto.DT_FP32)
                if causal:
                    vis = pypto.view(visible, [1, tile], [0, j * tile])
                    sc = pypto.where(vis, sc, rank_select.MASKED)
                if use_mask:
                    cm = pypto.cast(pypto.view(candidate_mask, [1, tile], [t, j * tile]),
                                    pypto.DT_FP32)
                    sc = pypto.where(pypto.gt(cm, 0.5), sc, rank_select.MASKED)
                pypto.assemble(sc, [t, j * tile], scores)
            pypto.set_vec_tile_shapes(1, padded)
            srow = pypto.view(scores, [1, padded], [t, 0])
            chosen = rank_select.select(pypto, srow, rev, kio, padded, k)
            if variant == "higher_ties":
                rev_out = pypto.add(pypto.mul(pos, -1.0), float(padded))
            else:
                rev_out = rev
            if variant == "descending":  # keys pos + 1: the top lists positions descending
                key = pypto.where(pypto.gt(chosen, 0.5), pypto.add(pos, 1.0), -1.0)
                kv, _ = pypto.topk(key, k, -1, True)
                pypto.set_vec_tile_shapes(1, k)
                valid = pypto.where(pypto.gt(kv, 0.0), 1.0, 0.0)
                lp = pypto.mul(pypto.sub(kv, 1.0), valid)
            else:
                lp, valid = rank_select.ascending(pypto, chosen, rev_out, padded, k)
                pypto.set_vec_tile_shapes(1, k)
            lp_i = pypto.cast(pypto.minimum(lp, float(width - 1)), pypto.DT_INT32)
            v_i = pypto.cast(valid, pypto.DT_INT32)
            pypto.set_vec_tile_shapes(k)
            lp_1 = pypto.reshape(lp_i, [k])
            pypto.set_vec_tile_shapes(1, k)
            pr2 = pypto.index_select(phys, 1, lp_1)
            out = pypto.sub(pypto.mul(pypto.add(pr2, 1), v_i), 1)
            pypto.assemble(out, [t, 0], topk_rows)

    if masked:
        @pypto.frontend.jit(runtime_options=options)
        def paged_indexer(
            q: pypto.Tensor([tokens_dim, h, d], pypto.DT_BF16),
            weights: pypto.Tensor([tokens_dim, h], pypto.DT_BF16),
            index_key: pypto.Tensor([dm["blocks"], bs, 1, half], pypto.DT_UINT8),
            index_key_scale: pypto.Tensor([dm["blocks"], bs, 1, g], pypto.DT_UINT8),
            index_block_table: pypto.Tensor([dm["requests"], pages], pypto.DT_INT32),
            token_to_req: pypto.Tensor([tokens_dim], pypto.DT_INT32),
            compressed_lens: pypto.Tensor([tokens_dim], pypto.DT_INT32),
            candidate_mask: pypto.Tensor([tokens_dim, width], pypto.DT_UINT8),
            scores: pypto.Tensor([tokens_dim, padded], pypto.DT_FP32),
            topk_rows: pypto.Tensor([tokens_dim, k], pypto.DT_INT32),
        ):
            body(q, weights, index_key, index_key_scale, index_block_table, token_to_req,
                 compressed_lens, candidate_mask, scores, topk_rows)
    else:
        @pypto.frontend.jit(runtime_options=options)
        def paged_indexer(
            q: pypto.Tensor([tokens_dim, h, d], pypto.DT_BF16),
            weights: pypto.Tensor([tokens_dim, h], pypto.DT_BF16),
            index_key: pypto.Tensor([dm["blocks"], bs, 1, half], pypto.DT_UINT8),
            index_key_scale: pypto.Tensor([dm["blocks"], bs, 1, g], pypto.DT_UINT8),
            index_block_table: pypto.Tensor([dm["requests"], pages], pypto.DT_INT32),
            token_to_req: pypto.Tensor([tokens_dim], pypto.DT_INT32),
            compressed_lens: pypto.Tensor([tokens_dim], pypto.DT_INT32),
            scores: pypto.Tensor([tokens_dim, padded], pypto.DT_FP32),
            topk_rows: pypto.Tensor([tokens_dim, k], pypto.DT_INT32),
        ):
            body(q, weights, index_key, index_key_scale, index_block_table, token_to_req,
                 compressed_lens, None, scores, topk_rows)
    return paged_indexer


def _token_prelude(pypto, q, weights, index_block_table, compressed_lens, scores, t, req, pos,
                   page_of, offset, bs, pages, width, padded, h, d):
    """Token ``t``'s steps before its key loop as one subgraph (one task): ``visible``
    (positions below ``compressed_lens[t]``), ``phys`` (the physical row of every logical
    position), the MASKED fill of its score row, its head weights ``wt`` FP32 ``[h, 1]``
    and its query ``qt`` BF16 ``[h, d]``."""
    with one_subgraph(pypto):
        # compressed_lens[t] as a tensor (a scalar-filled ``full`` reads as 0)
        pypto.set_vec_tile_shapes(8)
        lv = pypto.cast(pypto.view(compressed_lens, [1], [t]), pypto.DT_FP32)
        pypto.set_vec_tile_shapes(1, padded)
        limit = pypto.expand_clone(pypto.reshape(lv, [1, 1]), [1, padded])
        visible = pypto.lt(pos, limit)
        pypto.set_vec_tile_shapes(1, width)
        trow = pypto.view(index_block_table, [1, pages], [req, 0])
        phys = pypto.add(pypto.mul(pypto.index_select(trow, 1, page_of), bs), offset)
        pypto.set_vec_tile_shapes(1, padded)
        pypto.assemble(pypto.full([1, padded], rank_select.MASKED, pypto.DT_FP32),
                       [t, 0], scores)  # columns of tiles past compressed_lens[t]
        pypto.set_vec_tile_shapes(h, 16)
        wt = pypto.reshape(pypto.cast(pypto.view(weights, [1, h], [t, 0]), pypto.DT_FP32),
                           [h, 1])
        # last before the key loop: the tile the loop's copy of qt is cut in
        pypto.set_vec_tile_shapes(h, d)
        qt = pypto.reshape(pypto.view(q, [1, h, d], [t, 0, 0]), [h, d])
    return visible, phys, wt, qt

