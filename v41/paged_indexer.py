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

Kernel algorithm (per token): a row of up to ``ROW_KEYS`` (1024) positions that is its own
Top-K-padded row (``width >= topk``, so every column is a key) is ONE key tile: per part of
the tile (below) a decode task, one subgraph that takes the part's physical rows from the
block-table row, gathers the packed E2M1 rows and E8M0 scales and decodes them to BF16 with
:func:`v41.kv_decode.fp4_keys` (exact; the decoder's constants recomputed in the task;
``fp4_keys``'s own :func:`v41.subgraph.one_subgraph` nests in the tile's, so it is the same
task), and a cube product with the token's query (read in place); then one subgraph scores
the row (weights read in place, positions at or past ``compressed_lens[t]`` and
candidate-mask exclusions MASKED), writes it to the token's row of the FP32 ``scores``
buffer ``[tokens, max(width, topk)]`` (every byte, once) and selects its Top-K from the
scores it holds.  A launch of ``FEW_TOKENS`` (32) tokens or more decodes the whole row in one
part and puts two tokens in each loop iteration (``IDX_PAIRS``, an odd last token in
``IDX_LAST``); a smaller launch takes one token an iteration and ``KEY_TILE`` (512) parts
(``IDX_FEW``: a shorter chain per token).  The choice is made on the chip from the dynamic
``tokens`` (loop counts ``tokens * few`` and ``(tokens // 2) * (1 - few)``), so one compiled
kernel serves every launch.  Wider rows (and rows shorter than the Top-K) are scored in
tiles of ``KEY_TILE`` keys, a loop over the dynamic count of tiles holding visible
positions, each tile a decode, a product and a scoring task; the tiles of the row no
scoring task writes (past the length, past the width) are written MASKED by a second
per-token loop, one task a tile, and the Top-K is one subgraph per token reading the row
after those tasks (dataflow edges).  Either way every byte of ``scores`` has exactly one
writer and the buffer holds what the golden's does (the C1A Full candidate source reads
it: :mod:`v41.hierarchical_indexer`), and the Top-K (its constants recomputed in its task)
maps the chosen positions to physical rows through the block-table row.  (With a key tile
shorter than a page, the token's physical rows are gathered once per token instead.)  The
host bounds ``tokens`` per launch by the score budget (``max_logits_bytes``) and validates
every row id and length before launch
(``harness.entries.paged_indexer.validate_launch``).

Schedule (A5 cost model): the AICPU's handling of the graph, not the bytes or the vector
work, sets the time: the pipes are busy well under half the span, a task starts 5-20 k
cycles after its producer ends, and both the tasks and the root functions (loop
iterations) cost.  FLASH (width 1024 = 2 x topk), before -> after the one-tile row, the
paired tokens and the ``FEW_TOKENS`` split: T=192 223.8 -> 93.1 us (5.8x -> 2.4x
roofline; 1,304 -> 576 tasks; the TP4 bench case 184.1 -> 93.1), T=384 401.0 -> 192.0,
T=512 517.2 -> 271.7, T=48 66.3 -> 41.4, T=4 28.0 -> 25.6, T=3 28.2 -> 25.4.  Alone, the
one-tile row (3 tasks a token instead of ~6.8: two 512-key decode, product and scoring
tasks, MASKED tiles, the Top-K) gave T=192 117.7 us but T=4 32.3 (the 1024-key decode
takes 23 k cycles against 13 k for 512 keys, and it lengthens every token's chain); pairing
the tokens (the same tasks in half the root functions) gave T=192 93.1; groups of 4 or 8
tokens 95.9 (compile 0.6 / 1.0 s); 512-key parts at every T 126.7 at T=192 (960 tasks) but
25.6 at T=4, hence the split (parts vs whole rows at T=20 / 24 / 32: 31.0 / 33.8 / 38.7
against 33.9 / 34.0 / 39.0; T=48 48.0 against 41.4).  Earlier: 368 -> 184 us (2,030 ->
1,012 tasks) with the tile, MASKED-tile and Top-K tasks; without the MASKED tiles, the
Top-K masking the row in its own task: 157 us, but the columns past the length were left
unwritten; a MASKED fill of whole rows in tasks of their own: 163 us, its writes ordered
against the scoring tasks' only by timing.  Before (in launches of 32 rows): 64-key tiles
with the arithmetic decoder of ``v41.mx_decode`` (its on-chip reshapes went through global
memory) took 1,842 us; the whole-row decoder and 512-key tiles took 423 us (400 us with
each token's steps before its key loop in one subgraph scope).  A token with a short
prefix decodes a whole tile of masked keys; at decode lengths that costs less than the
extra loop iterations (256-key tiles: 109 us against 73 us for a 32-row FLASH launch).

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
``pages`` and ``candidates`` (bool) from the case dict.  ``scores``: a token's columns
below ``compressed_lens[t]`` hold its scores (``MASKED`` where the candidate mask
excludes), every other column ``MASKED``.
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
import math

from v41 import kv_decode, rank_select
from v41.abi import Arg, case_int, jit_options, resolve
from v41.cube_tiles import cube_tiles
from v41.subgraph import one_subgraph

KEY_TILE = 512  # keys decoded and scored per step (the dims' width must be a multiple)
ROW_KEYS = 1024  # a row up to this width that fills its Top-K row is one tile
FEW_TOKENS = 32  # launches of fewer tokens decode a one-tile row in KEY_TILE parts
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
    if width == padded and width <= ROW_KEYS:  # the whole row is one tile
        tile = width
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
        q2 = pypto.reshape(q, [tokens * h, d], inplace=True)
        w2 = pypto.reshape(weights, [tokens * h, 1], inplace=True)
        lens2 = None
        if causal:
            lens2 = pypto.reshape(compressed_lens, [tokens, 1], inplace=True)
        # in-place views of the inputs: a copying reshape is a task every gather waits on
        # in-place GM views of the key cache, one row per scale group
        payload = pypto.reshape(index_key, [rows * g, group // 2], inplace=True)
        scales = pypto.reshape(index_key_scale, [rows * g], inplace=True)
        pypto.set_cube_tile_shapes(*cube_tiles(h, d, tile, 2))

        def one_tile_row(t, req, parts):  # a decode and a product task per part; one task
            # scores the row, writes it and selects its Top-K
            pt = tile // parts
            dots = [_tile_dot(pypto, q2, index_block_table, req, t, j, None, payload, scales, h,
                              d, pt, bs, g, group) for j in range(parts)]
            with one_subgraph(pypto):
                scs = []
                for j in range(parts):
                    scs.append(_tile_scores(pypto, dots[j], w2, lens2, candidate_mask, t, j, h,
                                            pt, padded, use_mask))
                    pypto.assemble(scs[j], [t, j * pt], scores)
                pypto.set_vec_tile_shapes(1, tile)
                sc = scs[0] if parts == 1 else pypto.concat(scs, 1)
                _token_topk(pypto, sc, topk_rows, None, index_block_table, req, t, variant,
                            width, padded, k, bs, pages)

        def tiled_row(t, req):  # per tile decode, product, scoring; MASKED tiles; Top-K
            phys = None
            if tile % bs:  # a tile within one page: the row of every position, gathered once
                phys = _token_rows(pypto, index_block_table, req, bs, pages, width)
            if causal:  # only the tiles holding visible positions
                ntiles = (compressed_lens[t] + tile - 1) // tile
            else:
                ntiles = width // tile
            for j in pypto.loop(ntiles, name="IDX_KEY_TILES", idx_name="j"):
                dot = _tile_dot(pypto, q2, index_block_table, req, t, j, phys, payload, scales,
                                h, d, tile, bs, g, group)
                sc = _tile_scores(pypto, dot, w2, lens2, candidate_mask, t, j, h, tile, padded,
                                  use_mask)
                pypto.assemble(sc, [t, j * tile], scores)
            # the tiles no scoring task wrote (past the length, past the width): MASKED
            for j in pypto.loop(padded // tile - ntiles, name="IDX_MASKED_TILES",
                                idx_name="j"):
                _masked_tile(pypto, scores, t, (ntiles + j) * tile, tile)
            with one_subgraph(pypto):  # reads the row after its scoring and MASKED-tile tasks
                pypto.set_vec_tile_shapes(1, padded)
                _token_topk(pypto, pypto.view(scores, [1, padded], [t, 0]), topk_rows, phys,
                            index_block_table, req, t, variant, width, padded, k, bs, pages)

        def token_pairs(npairs, nlast):  # two tokens a root function: half the root functions
            for p in pypto.loop(npairs, name="IDX_PAIRS", idx_name="p"):
                for i in range(2):
                    one_tile_row(p * 2 + i, token_to_req[p * 2 + i], 1)
            for p in pypto.loop(nlast, name="IDX_LAST", idx_name="p"):
                one_tile_row(tokens - 1 + p, token_to_req[tokens - 1 + p], 1)

        if tile != padded:
            for t in pypto.loop(tokens, name="IDX_TOKENS", idx_name="t"):
                tiled_row(t, token_to_req[t])
        elif tile <= KEY_TILE:
            token_pairs(tokens // 2, tokens % 2)
        else:  # few tokens: KEY_TILE parts (a shorter chain); more: whole rows (fewer tasks)
            few = 1 // (tokens // FEW_TOKENS + 1)  # 1 when tokens < FEW_TOKENS, else 0
            for t in pypto.loop(tokens * few, name="IDX_FEW", idx_name="t"):
                one_tile_row(t, token_to_req[t], tile // KEY_TILE)
            token_pairs((tokens // 2) * (1 - few), (tokens % 2) * (1 - few))

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


def _positions(pypto, padded, k, variant):
    """``pos`` [1, padded], ``rev`` (tie keys) and ``kio`` [1, k], recomputed in every task
    that uses them (a hoisted constant is a task every token task waits on)."""
    pypto.set_vec_tile_shapes(padded)
    pos1 = pypto.arange(0.0, float(padded), 1.0)
    pypto.set_vec_tile_shapes(k)
    kio1 = pypto.arange(0.0, float(k), 1.0)
    pypto.set_vec_tile_shapes(1, padded)
    pos = pypto.reshape(pos1, [1, padded])
    if variant == "higher_ties":
        rev = pypto.add(pos, 1.0)
    else:
        rev = pypto.add(pypto.mul(pos, -1.0), float(padded))
    pypto.set_vec_tile_shapes(1, k)
    kio = pypto.reshape(kio1, [1, k])
    return pos, rev, kio


def _tile_keys(pypto, index_block_table, req, j, phys, payload, scales, tile, bs, d, g, group):
    """Key tile ``j`` decoded to BF16 ``[tile, d]`` as one subgraph (one task): its physical
    rows, the decoder's constants (recomputed in every task: hoisted, they were tasks every
    tile waited on), the scale and payload gathers and the decode."""
    with one_subgraph(pypto):  # fp4_keys's own scope nests: it joins this one
        if tile % bs == 0:  # the tile's rows from its block-table pages
            ids = _tile_rows(pypto, index_block_table, req, j, tile, bs)
        else:
            ids = pypto.view(phys, [1, tile], [0, j * tile])
        key_of = kv_decode.slot_constants(pypto, tile, g)
        nibbles = kv_decode.nibble_constants(pypto, group)
        table = kv_decode.nibble_table(pypto)
        kb = kv_decode.fp4_keys(pypto, ids, payload, scales, table, key_of, nibbles, tile, d, group,
                                scale_e8m0=True)
    return kb


def _tile_rows(pypto, index_block_table, req, j, tile, bs):
    """The physical rows of key tile ``j`` ([1, tile] INT32) from its ``tile // bs`` pages of
    the request's block-table row (computed in the decode's task: no per-token row buffer)."""
    np_ = tile // bs
    return _page_rows(pypto, pypto.view(index_block_table, [1, np_], [req, j * np_]), tile, bs)


def _page_rows(pypto, trow, n, bs):
    """``trow[p // bs] * bs + p % bs`` for the positions ``p < n`` ([1, n] INT32) of the
    block-table row piece ``trow`` (exact: ``bs`` is a power of 2)."""
    pypto.set_vec_tile_shapes(n)
    lpos = pypto.arange(0.0, float(n), 1.0)
    page_f = pypto.floor(pypto.mul(lpos, 1.0 / bs))
    page_of = pypto.cast(page_f, pypto.DT_INT32)
    offset1 = pypto.cast(pypto.sub(lpos, pypto.mul(page_f, float(bs))), pypto.DT_INT32)
    pypto.set_vec_tile_shapes(1, n)
    offset = pypto.reshape(offset1, [1, n])
    return pypto.add(pypto.mul(pypto.index_select(trow, 1, page_of), bs), offset)


def _tile_dot(pypto, q2, index_block_table, req, t, j, phys, payload, scales, h, d, tile, bs,
              g, group):
    """FP32 ``q_t . key`` ``[h, tile]`` of key tile ``j`` (two tasks: the decode, the cube
    product with the token's query read in place)."""
    kb = _tile_keys(pypto, index_block_table, req, j, phys, payload, scales, tile, bs, d, g,
                    group)
    pypto.set_vec_tile_shapes(h, d)
    qt = pypto.view(q2, [h, d], [t * h, 0])
    return pypto.matmul(qt, kb, pypto.DT_FP32, b_trans=True)


def _tile_scores(pypto, dot, w2, lens2, candidate_mask, t, j, h, tile, padded, use_mask):
    """Key tile ``j``'s FP32 scores ``[1, tile]`` from its product ``dot``: BF16 ``dot``,
    ReLU, times the head weight, BF16; the FP32 sum over heads, BF16; positions at or past
    ``compressed_lens[t]`` (``lens2`` given) and candidate-mask exclusions MASKED."""
    pypto.set_vec_tile_shapes(h, min(tile, KEY_TILE))  # [h, 1024] operands overflow the UB
    dot = pypto.maximum(pypto.cast(pypto.cast(dot, pypto.DT_BF16), pypto.DT_FP32), 0.0)
    wt = pypto.cast(pypto.view(w2, [h, 1], [t * h, 0]), pypto.DT_FP32)
    s = pypto.mul(dot, pypto.expand_clone(wt, [h, tile]))
    s = pypto.cast(pypto.cast(s, pypto.DT_BF16), pypto.DT_FP32)
    total = pypto.sum(s, 0, keepdim=True)  # [1, tile]
    pypto.set_vec_tile_shapes(1, tile)
    sc = pypto.cast(pypto.cast(total, pypto.DT_BF16), pypto.DT_FP32)
    if lens2 is not None:  # positions at or past compressed_lens[t]
        sc = pypto.where(_tile_visible(pypto, lens2, t, j, tile, padded), sc,
                         rank_select.MASKED)
    if use_mask:
        cm = pypto.cast(pypto.view(candidate_mask, [1, tile], [t, j * tile]), pypto.DT_FP32)
        sc = pypto.where(pypto.gt(cm, 0.5), sc, rank_select.MASKED)
    return sc


def _token_topk(pypto, srow, topk_rows, phys, index_block_table, req, t, variant,
                width, padded, k, bs, pages):
    """Token ``t``'s Top-K of its score row ``srow`` [1, padded], listed as physical rows
    (its constants recomputed here; the caller puts it in one subgraph)."""
    pos, rev, kio = _positions(pypto, padded, k, variant)
    pypto.set_vec_tile_shapes(1, padded)
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
    if phys is None:  # the rows from the block-table row (exact: bs is a power of 2)
        lp_c = pypto.minimum(lp, float(width - 1))
        pg_f = pypto.floor(pypto.mul(lp_c, 1.0 / bs))
        pg = pypto.cast(pg_f, pypto.DT_INT32)
        off = pypto.cast(pypto.sub(lp_c, pypto.mul(pg_f, float(bs))), pypto.DT_INT32)
        pypto.set_vec_tile_shapes(k)
        pg_1 = pypto.reshape(pg, [k])
        pypto.set_vec_tile_shapes(1, k)
        trow = pypto.view(index_block_table, [1, pages], [req, 0])
        pr2 = pypto.add(pypto.mul(pypto.index_select(trow, 1, pg_1), bs), off)
    else:
        pr2 = pypto.index_select(phys, 1, lp_1)
    out = pypto.sub(pypto.mul(pypto.add(pr2, 1), v_i), 1)
    pypto.assemble(out, [t, 0], topk_rows)


def _tile_visible(pypto, lens2, t, j, tile, padded):
    """Key tile ``j``'s positions below ``compressed_lens[t]`` ([1, tile] bool), computed in
    the tile's scoring task."""
    pypto.set_vec_tile_shapes(padded)
    pos1 = pypto.arange(0.0, float(padded), 1.0)
    pypto.set_vec_tile_shapes(1, padded)
    pos = pypto.view(pypto.reshape(pos1, [1, padded]), [1, tile], [0, j * tile])
    # compressed_lens[t] as a tensor (a scalar-filled ``full`` reads as 0), from the
    # in-place [tokens, 1] view: a [1] -> [1, 1] reshape goes through global memory
    pypto.set_vec_tile_shapes(1, 8)
    lv = pypto.cast(pypto.view(lens2, [1, 1], [t, 0]), pypto.DT_FP32)
    pypto.set_vec_tile_shapes(1, tile)
    return pypto.lt(pos, pypto.expand_clone(lv, [1, tile]))


def _masked_tile(pypto, scores, t, col, tile):
    """``scores[t, col : col + tile] = MASKED`` as one task (a tile no scoring task writes:
    every score byte has one writer)."""
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(1, tile)
        pypto.assemble(pypto.full([1, tile], rank_select.MASKED, pypto.DT_FP32), [t, col],
                       scores)


def _token_rows(pypto, index_block_table, req, bs, pages, width):
    """The physical row of every logical position of the token's request ([1, width] INT32)
    as one subgraph (only when a key tile is shorter than a page)."""
    with one_subgraph(pypto):
        return _page_rows(pypto, pypto.view(index_block_table, [1, pages], [req, 0]), width,
                          bs)
