"""LM head kernel: one TP rank's vocabulary shard of the logits and its greedy pick (golden:
``goldens.boundary.lm_head_shard`` and ``greedy_sample``).

``logits = float32(hidden) @ head^T`` with FP32 accumulation on the cube (the golden
accumulates in FP64 and rounds once; the difference is FP32 reassociation), streamed over
vocabulary tiles of ``vocab_tile(V/tp)`` head rows: per row tile (up to :data:`ROW_TILE`
rows, so a decode batch of <= 192 rows streams the head shard once) and vocab tile one
``[rows, tile]`` product is written to ``logits``, so no ``[rows, V/tp]`` intermediate
exists besides the output.

Greedy pick with the golden's tie rule (lowest vocab index among equal maxima), in two
phases so the vocab tiles do not wait on one another:

1. per vocab tile (independent iterations): the row maxima into column ``j`` of the scratch
   ``tile_max`` and the tile-local index of the first position holding it (``amin`` of an
   FP32 iota masked by ``logit == tile max``, exact equality) into ``tile_pick``;
2. per row tile, one vector pass over those ``[rows, pick_columns]`` columns: the largest
   tile maximum, and among the tiles holding it the lowest global index
   ``rank * V/tp + j * tile + local`` (tiles ascend, so that is the shard's lowest).
   Pad columns (``pick_columns`` rounds the tile count up to 8) hold -FLT_MAX.

(FLASH TP4, 192 rows, one rank: 11.9 ms estimated with the former running fold over 505
tiles, which chained every tile to the one before it; 10.7 ms with the two phases and
16-row cube tiles; 1.83 ms with :func:`v41.cube_tiles.cube_tiles`, which takes all 192 rows
so each head tile is read once; roofline 482 us.)  Vector tiles take the whole row tile
where :data:`VEC_ELEMS` allows (:func:`vec_rows`), so a vocab step is the same few tasks at
any row count: FLASH TP1 T=4 / 48 / 192 1,542 / 1,552 / 7,260 -> 1,542 / 1,552 / 2,608
tasks, T=192 3,227 -> 2,502 us, compile flat (16-row tiles: T=192 0.46-0.70 s CPU, now
0.31 s; T=4 0.22-0.33 s).  ``best_index`` is the GLOBAL vocab
index (FP32 iota arithmetic: exact below 2^24).  The host combines the ranks' picks
(``harness.entries.lm_head.combine_rank_picks``: largest value, lowest rank on ties).

Inactive rows: rows ``r >= num_rows`` are written as a zero hidden row would give them:
logits exact zeros, ``best_value`` 0 and ``best_index`` ``rank * V/tp`` (the shard's first
index); their hidden rows are never read.  ``num_rows`` is a runtime INT32 ``[1]`` tensor
checked to ``[0, rows]`` by the host before launch.

ABI
---
===========  ====================  ========  =====
name         shape                 dtype     role
===========  ====================  ========  =====
hidden       (rows, hidden)        bfloat16  in
head         (vocab_local, hidden) float32   in
num_rows     (1,)                  int32     in
logits       (rows, vocab_local)   float32   out
best_value   (rows, 1)             float32   out
best_index   (rows, 1)             int32     out
tile_max     (rows, pick_columns)  float32   out (scratch: per-tile maxima)
tile_pick    (rows, pick_columns)  float32   out (scratch: per-tile local picks)
===========  ====================  ========  =====

``rows`` from ``case["tokens"]`` (>= 1) is a dynamic axis; ``vocab_local = V / case["tp"]``,
``pick_columns = pick_columns(vocab_local / vocab_tile)`` and the shard's offset
``case["rank"] * vocab_local`` are fixed at trace time.
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41.abi import Arg, case_int, jit_options, resolve
from v41.cube_tiles import cube_tiles, row_tile

ROW_TILE = 192  # logit rows per loop iteration (the head shard is streamed once per row tile)
VEC_ELEMS = 16384  # most FP32 elements per vector tile (64 KB of the 248 KB UB)
VOCAB_TILES = (256, 128, 64, 32, 16, 8)  # head rows per vocab step, largest dividing V/tp
FP32_EXACT_INT = 1 << 24  # FP32 index arithmetic is exact below this
NEG_MAX = -3.4028234663852886e38  # -FLT_MAX: a pad column's tile maximum

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "higher_index_ties": "breaks ties toward the HIGHER vocab index (within and across tiles)",
    "bf16_logits": "rounds the logits to BF16 (stored and picked from)",
    "local_index": "returns the shard-local index (no rank * V/tp offset)",
    "skip_padding": "leaves rows at or past num_rows unwritten",
}

ABI = (
    Arg("hidden", ("rows", "hidden"), "bfloat16", "in"),
    Arg("head", ("vocab_local", "hidden"), "float32", "in"),
    Arg("num_rows", (1,), "int32", "in"),
    Arg("logits", ("rows", "vocab_local"), "float32", "out"),
    Arg("best_value", ("rows", 1), "float32", "out"),
    Arg("best_index", ("rows", 1), "int32", "out"),
    Arg("tile_max", ("rows", "pick_columns"), "float32", "out"),
    Arg("tile_pick", ("rows", "pick_columns"), "float32", "out"),
)


def vocab_tile(vocab_local: int) -> int:
    """Head rows per vocab step: the largest of :data:`VOCAB_TILES` dividing ``vocab_local``;
    ValueError when none does (the tile's last axis must be a 32-byte multiple)."""
    for tile in VOCAB_TILES:
        if vocab_local % tile == 0:
            return tile
    raise ValueError(f"vocab_local: {vocab_local} is not a multiple of {VOCAB_TILES[-1]}")


def dims(config, case: dict) -> dict[str, int]:
    tp = case_int(case, "tp", 1, minimum=1)
    rank = case_int(case, "rank", 0)
    if config.vocab_size % tp:
        raise ValueError(f"case['tp']: vocab_size {config.vocab_size} % {tp} != 0")
    if rank >= tp:
        raise ValueError(f"case['rank']: {rank} outside [0, tp={tp})")
    if config.vocab_size > FP32_EXACT_INT:
        raise ValueError(f"config.vocab_size: {config.vocab_size} > 2^24 (FP32 index arithmetic)")
    vl = config.vocab_size // tp
    return {"rows": case_int(case, "tokens", minimum=1), "hidden": config.hidden_size,
            "vocab_local": vl, "rank": rank, "pick_columns": pick_columns(vl // vocab_tile(vl))}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def pick_columns(n_tiles: int) -> int:
    """Columns of the per-tile pick scratch: ``n_tiles`` rounded up to whole 32-byte blocks
    of FP32 (the pad columns hold -FLT_MAX, so they never win)."""
    return -(-n_tiles // 8) * 8


def vec_rows(rows: int, width: int) -> int:
    """Rows of a ``[rows, width]`` vector tile: the whole row tile where ``VEC_ELEMS``
    allows, so a vocab step is one tile however many rows the launch has."""
    return max(1, min(rows, VEC_ELEMS // width))


def _tile_pick(pypto, s, iota, rows, valid, tile, high_ties):
    """One logit tile ``s [rows, tile]``: its row maxima and the tile-local index of the
    lowest (``high_ties``: highest) position holding that maximum (exact equality)."""
    pypto.set_vec_tile_shapes(vec_rows(rows, tile), tile)
    m = pypto.amax(s, -1, keepdim=True)  # [rows, 1]
    hit = pypto.eq(s, pypto.expand_clone(m, [rows, tile], valid_shape=[valid, tile]))
    iota_t = pypto.expand_clone(iota, [rows, tile], valid_shape=[valid, tile])
    if high_ties:
        return m, pypto.amax(pypto.where(hit, iota_t, -1.0), -1, keepdim=True)
    return m, pypto.amin(pypto.where(hit, iota_t, float(tile)), -1, keepdim=True)


def _row_pick(pypto, tmax, tpick, rows, valid, cols, high_ties):
    """The shard's pick of a row tile from its per-tile picks ``[rows, cols]``: the largest
    tile maximum, and among the tiles holding it the lowest (``high_ties``: highest) global
    index, which is the lowest index of the whole shard since a tile's pick is its lowest."""
    pypto.set_vec_tile_shapes(vec_rows(rows, cols), cols)
    m = pypto.amax(tmax, -1, keepdim=True)
    hit = pypto.eq(tmax, pypto.expand_clone(m, [rows, cols], valid_shape=[valid, cols]))
    if high_ties:
        return m, pypto.amax(pypto.where(hit, tpick, -1.0), -1, keepdim=True)
    return m, pypto.amin(pypto.where(hit, tpick, float(FP32_EXACT_INT)), -1, keepdim=True)


def build(config, case: dict | None = None, *, variant: str = "reference",
          runtime_options: dict | None = None):
    """The jit kernel ``lm_head(hidden, head, num_rows, logits, best_value, best_index)`` of
    rank ``case["rank"]`` at ``case["tp"]``; rows are a dynamic axis."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    dm = dims(config, case or {"tokens": 1})
    d, vl = dm["hidden"], dm["vocab_local"]
    tile = vocab_tile(vl)
    n_tiles = vl // tile
    cols = pick_columns(n_tiles)
    base0 = 0 if variant == "local_index" else dm["rank"] * vl
    r = row_tile(dm["rows"], ROW_TILE)  # the launch's rows rounded up to 16, at most 192
    high_ties = variant == "higher_index_ties"
    bf16_logits = variant == "bf16_logits"
    zero_padding = variant != "skip_padding"
    options = jit_options(runtime_options)
    rows_dim = pypto.frontend.dynamic("rows")
    cube = cube_tiles(r, d, tile, 4)  # FP32 operands, every row of the row tile

    @pypto.frontend.jit(runtime_options=options)
    def lm_head(
        hidden: pypto.Tensor([rows_dim, d], pypto.DT_BF16),
        head: pypto.Tensor([vl, d], pypto.DT_FP32),
        num_rows: pypto.Tensor([1], pypto.DT_INT32),
        logits: pypto.Tensor([rows_dim, vl], pypto.DT_FP32),
        best_value: pypto.Tensor([rows_dim, 1], pypto.DT_FP32),
        best_index: pypto.Tensor([rows_dim, 1], pypto.DT_INT32),
        tile_max: pypto.Tensor([rows_dim, cols], pypto.DT_FP32),
        tile_pick: pypto.Tensor([rows_dim, cols], pypto.DT_FP32),
    ):
        total = hidden.shape[0]
        active = num_rows[0]
        pypto.set_vec_tile_shapes(tile)
        iota = pypto.reshape(pypto.arange(0.0, float(tile), 1.0), [1, tile])
        pypto.set_vec_tile_shapes(cols)
        # global index of each vocab tile's first row (a full() of the loop index held the
        # first iteration's value in every iteration here, so the offsets are a static row)
        tile_base = pypto.reshape(pypto.arange(float(base0), float(base0 + cols * tile),
                                               float(tile)), [1, cols])
        pypto.set_cube_tile_shapes(*cube)
        for i in pypto.loop((active + r - 1) // r, name="LM_HEAD_ROWS", idx_name="i"):
            start = i * r
            valid = (active - start).min(r)
            pypto.set_vec_tile_shapes(vec_rows(r, min(d, 512)), min(d, 512))
            x32 = pypto.cast(pypto.view(hidden, [r, d], [start, 0], valid_shape=[valid, d]),
                             pypto.DT_FP32)
            # vocab tiles are independent: each writes its logits and its own pick column
            for j in pypto.loop(n_tiles, name="LM_HEAD_VOCAB", idx_name="j"):
                xv = pypto.view(x32, [r, d], [0, 0], valid_shape=[valid, d])
                w = pypto.view(head, [tile, d], [j * tile, 0])
                s = pypto.matmul(xv, w, pypto.DT_FP32, b_trans=True)  # [r, tile]
                pypto.set_vec_tile_shapes(vec_rows(r, tile), tile)
                if bf16_logits:
                    s = pypto.cast(pypto.cast(s, pypto.DT_BF16), pypto.DT_FP32)
                s = pypto.view(s, [r, tile], [0, 0], valid_shape=[valid, tile])
                pypto.assemble(s, [start, j * tile], logits)
                m, pick = _tile_pick(pypto, s, iota, r, valid, tile, high_ties)
                pypto.set_vec_tile_shapes(r, 8)
                pypto.assemble(m, [start, j], tile_max)
                pypto.assemble(pick, [start, j], tile_pick)  # tile-local: offsets added below
            pypto.set_vec_tile_shapes(r, 8)
            for p in range(n_tiles, cols):  # at most 7 pad columns, never picked
                pypto.assemble(pypto.full([r, 1], NEG_MAX, pypto.DT_FP32, valid_shape=[valid, 1]),
                               [start, p], tile_max)
                pypto.assemble(pypto.full([r, 1], 0.0, pypto.DT_FP32, valid_shape=[valid, 1]),
                               [start, p], tile_pick)
            tmax = pypto.view(tile_max, [r, cols], [start, 0], valid_shape=[valid, cols])
            tpick = pypto.view(tile_pick, [r, cols], [start, 0], valid_shape=[valid, cols])
            pypto.set_vec_tile_shapes(vec_rows(r, cols), cols)
            tpick = pypto.add(tpick, pypto.expand_clone(tile_base, [r, cols],
                                                        valid_shape=[valid, cols]))
            best, idx = _row_pick(pypto, tmax, tpick, r, valid, cols, high_ties)
            pypto.set_vec_tile_shapes(r, 8)
            pypto.assemble(best, [start, 0], best_value)
            pypto.assemble(pypto.cast(idx, pypto.DT_INT32), [start, 0], best_index)
        if zero_padding:  # rows active .. total - 1: what a zero hidden row gives
            for p in pypto.loop((total - active + r - 1) // r, name="LM_HEAD_PADDING",
                                idx_name="p"):
                start = active + p * r
                valid = (total - start).min(r)
                pypto.set_vec_tile_shapes(r, 8)
                pypto.assemble(pypto.full([r, 1], 0.0, pypto.DT_FP32, valid_shape=[valid, 1]),
                               [start, 0], best_value)
                pypto.assemble(pypto.full([r, 1], base0, pypto.DT_INT32, valid_shape=[valid, 1]),
                               [start, 0], best_index)
                pypto.set_vec_tile_shapes(vec_rows(r, tile), tile)
                for j in pypto.loop(n_tiles, name="LM_HEAD_PADDING_VOCAB", idx_name="j"):
                    pypto.assemble(pypto.full([r, tile], 0.0, pypto.DT_FP32,
                                              valid_shape=[valid, tile]),
                                   [start, j * tile], logits)

    return lm_head
