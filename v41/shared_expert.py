"""MoE shared expert, MXFP8 weights decoded in-kernel (golden: ``goldens.moe.shared_expert``).

Per row tile of up to ``ROW_TILE`` active tokens (the launch's tokens rounded up to 16;
brackets mark a BF16 cast, as in the golden)::

    a   = MX(x)                                   activation rule, group 32 (v41.mx_linear)
    g_j = [a @ W1_j^T]    u_j = [a @ W3_j^T]      FP32 accumulation, one BF16 cast
    g_j = min(g_j, limit) u_j = clamp(u_j, -limit, limit)       FP32
    h_j = [silu(g_j) * u_j]                       FP32, silu = g / (1 + exp(-g))
    y   = [sum_j MX(h_j) @ W2[:, j]^T]            FP32 accumulation, one BF16 cast

Schedule: one ``SE_ROWS`` iteration per row tile, inside it

1. ``MX(x)`` of the row tile into the scratch output ``xq`` by the nested loop ``SE_XQ``
   over column blocks, each ONE task (:func:`v41.rope_heads.mx_rows`; FLASH T=192 343.7
   -> 302.6 us, compile CPU 16.8 -> ~3 s, flat in T, against 4-token pieces unrolled at
   trace time and a join copy the products read; T=384, two row tiles, 557.4 -> 585.2);
   a kernel built for several row tiles unrolls the blocks in the row iteration instead
   (each loop iteration is a root function, at most 128 per stitched submission): T=384
   585.2 -> 436.6 us;
2. ``SE_W13``: per ``I_TILE`` block ``j`` of the intermediate width, ``W1_j`` and ``W3_j``
   (``I_TILE`` rows, all of ``hidden``) decoded and applied to that tile, ``MX(h_j)``
   written into the scratch output ``h_mx`` by ONE task (``MX(h)`` quantizes groups of 32
   columns, so quantizing each ``h_j`` on its own equals quantizing the whole row);
3. ``SE_W2``: per ``N_TILE`` rows of ``W2`` (all of ``inter``), decoded and applied to
   the row tile's rows of ``h_mx``, ``y`` written.

Ordering (pypto 0.2.0 tracks the dynamic rows of ``xq`` / ``h_mx`` as one cell per
column block, last writer only; :mod:`v41.order`): each K view of a step 2 product waits
for the one writer of every ``xq`` column block it reads (an earlier nested loop of the
same row iteration, or its own code before the loop when unrolled), and each ``W2``
product for the one writer of every column block of ``h_mx`` in this row tile.  Every
weight element is decoded once per row tile (once per launch up to ``ROW_TILE`` tokens); no
expanded weight exists beyond one tile.  (The scratch tensors are outputs because an
in-kernel ``pypto.tensor`` written by one loop and read by a sibling loop crashes the
simulator, see :mod:`v41.routed_experts`.)

The golden's per-K-group FP32 partials differ from the cube's FP32 accumulation by
reassociation only; its silu is FP64 with one rounding, the kernel's FP32 (last-bit
differences before the BF16 cast; the TINY matrix cases matched bit for bit).

Inactive rows (contract, reference-facts 4.14): the row loop covers only the tiles below
``num_tokens`` (the last tile's ``valid_shape`` stops at row ``num_tokens - 1``, so padding
``x`` rows are never read); a second loop writes exact zeros to rows ``num_tokens ..
tokens - 1``.  ``num_tokens`` is a runtime INT32 ``[1]`` tensor the caller validates to
``[0, tokens]`` before launch (``harness.entries.shared_expert.validate_launch``).

ABI
---
============  ========================  ========  =====
name          shape                     dtype     role
============  ========================  ========  =====
x             (tokens, hidden)          bfloat16  in
num_tokens    (1,)                      int32     in
w1            (inter, hidden)           uint8     in   (E4M3 codes)
w1_scale      (inter / 32, hidden / 32) uint8     in   (E8M0 codes)
w3            (inter, hidden)           uint8     in
w3_scale      (inter / 32, hidden / 32) uint8     in
w2            (hidden, inter)           uint8     in
w2_scale      (hidden / 32, inter / 32) uint8     in
y             (tokens, hidden)          bfloat16  out
xq            (tokens, hidden)          bfloat16  out  (scratch: MX(x), active rows)
h_mx          (tokens, inter)           bfloat16  out  (scratch: MX(h), active rows)
============  ========================  ========  =====

``tokens`` from ``case["tokens"]`` (>= 1) is a dynamic axis; ``inter`` is
``config.moe.intermediate_size``.
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
import functools

from v41 import mx_decode, mx_linear
from v41.abi import Arg, case_int, jit_options, resolve
from v41.cube_tiles import cube_tiles, row_tile
from v41.rope_heads import column_block, mx_rows
from v41.subgraph import one_subgraph

ROW_TILE = 192  # most tokens per row tile (the weights are decoded once per row tile)
# MX(x) column blocks (rope_heads.column_block): ~MX_ELEMS elements, >= MX_COLS channels
MX_ELEMS = 192 * 128
MX_COLS = 128
I_TILE = 128  # intermediate columns per W1/W3 tile (one h_mx column block, one writer task)
# W2 output rows decoded per tile: each h_mx block writer resolves one edge per W2 product
# of its K chunk, so fewer, wider W2 tiles shorten the wait before them (FLASH T=192 396.9
# -> 341.8 us with 256 instead of 128 rows; 512 exceeds the L0C, I_TILE 256 fails the pass)
N_TILE = 256
# Vector tiles: MX groups of 32 per tile of the h quantization (64 before; 512 is slower),
# rows per tile of the W2 output cast.  The h block is one [rows, I_TILE] tile in one task
# (FLASH T=192 with the W1/W3 K sums in it: 464.9 -> 396.9 us; in 64-row tiles 457.0,
# 32 / 64 column pieces 445.9 / 409.5 us)
GROUP_TILE_ROWS = 256
H_VEC_ROWS = 64
# W2 rows per tile when its E8M0 scale rows are at most NARROW_SCALE_BYTES wide (TINY: inter
# 64 -> 2 bytes): a 128-row tile then fails the lowered ExpandFunction check (an operand
# without a valid shape); 64 rows pass, as do 128 rows over wider scale rows (o_proj)
NARROW_N_TILE = 64
NARROW_SCALE_BYTES = 2

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "no_clamp": "skips both SwiGLU clamps",
    "silu_on_u": "applies silu to the up projection u instead of the gate g",
    "skip_h_quant": "feeds BF16 h to W2 without its MXFP8 re-quantization",
    "compute_padding": "computes every row, also rows at or past num_tokens (padding rows "
                       "get the expert of their x instead of zeros)",
    "skip_padding": "leaves rows at or past num_tokens unwritten",
}

ABI = (
    Arg("x", ("tokens", "hidden"), "bfloat16", "in"),
    Arg("num_tokens", (1,), "int32", "in"),
    Arg("w1", ("inter", "hidden"), "uint8", "in"),
    Arg("w1_scale", ("inter_blocks", "hidden_blocks"), "uint8", "in"),
    Arg("w3", ("inter", "hidden"), "uint8", "in"),
    Arg("w3_scale", ("inter_blocks", "hidden_blocks"), "uint8", "in"),
    Arg("w2", ("hidden", "inter"), "uint8", "in"),
    Arg("w2_scale", ("hidden_blocks", "inter_blocks"), "uint8", "in"),
    Arg("y", ("tokens", "hidden"), "bfloat16", "out"),
    Arg("xq", ("tokens", "hidden"), "bfloat16", "out"),
    Arg("h_mx", ("tokens", "inter"), "bfloat16", "out"),
)


def dims(config, case: dict) -> dict[str, int]:
    hidden, inter = config.hidden_size, config.moe.intermediate_size
    mx_linear.tile_width(inter, I_TILE)  # raises naming the width and the tile
    mx_linear.tile_width(hidden, N_TILE)
    return {"tokens": case_int(case, "tokens", minimum=1), "hidden": hidden, "inter": inter,
            "hidden_blocks": hidden // 32, "inter_blocks": inter // 32}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def swiglu_tile(pypto, g, u, limit, *, clamp=True, silu_on_u=False):
    """FP32 ``silu(min(g, limit)) * clamp(u, -limit, limit)`` of FP32 tiles ``g``, ``u``
    (``clamp`` / ``silu_on_u`` select deliberately wrong readings)."""
    if clamp:
        g = pypto.minimum(g, limit)
        u = pypto.maximum(pypto.minimum(u, limit), -limit)
    if silu_on_u:
        g, u = u, g
    # silu(g) = g / (1 + exp(-g)); exp overflows to inf for g < -88: g / inf = -0
    silu = pypto.div(g, pypto.add(pypto.exp(pypto.mul(g, -1.0)), 1.0))
    return pypto.mul(silu, u)


def weight_tile(pypto, w, w_scale, n0, n, k, table):
    """BF16 ``[n, k]``: rows ``n0 .. n0+n`` of the MXFP8 weight ``w`` decoded exactly by
    :func:`v41.mx_linear.mx_weight_tile_bf16`'s whole-row path (``table`` from
    :func:`v41.mx_decode.e4m3_table`; one subgraph)."""
    return mx_linear.mx_weight_tile_bf16(pypto, w, w_scale, n0, 0, n, k, table=table)


def _h_block(pypto, a, w1t, w3t, h_mx, start, col, rows, valid, width, k, limit, *, clamp,
             silu_on_u, skip_quant):
    """``h_mx[start : start + valid, col : col + width] = MX(h)``, ``h = [swiglu([a @ W1^T],
    [a @ W3^T])]`` (module doc) of the BF16 row tile ``a [rows, k]`` and the decoded tiles
    ``w1t``, ``w3t [width, k]``: the cube's K partials (:func:`v41.mx_linear.k_partials`),
    then ONE forced task (:mod:`v41.subgraph`, one ``[rows, width]`` vector tile) that adds
    them in K order (as :func:`v41.mx_linear.rows_times_tile`), applies SwiGLU and MX and
    writes the block: the W2 products of the row tile read these rows in later root
    functions, where pypto 0.2.0 keeps the last writer per column cell only, so a block
    written in row pieces (several tasks) would leave all but one piece unordered."""
    bf16, fp32 = pypto.DT_BF16, pypto.DT_FP32
    gp = list(mx_linear.k_partials(pypto, a, start, rows, valid, w1t, width, k))
    up = list(mx_linear.k_partials(pypto, a, start, rows, valid, w3t, width, k))
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(rows, width)
        g, u = (functools.reduce(pypto.add, ps) for ps in (gp, up))  # in K order
        g32 = pypto.cast(pypto.cast(g, bf16), fp32)
        u32 = pypto.cast(pypto.cast(u, bf16), fp32)
        h = swiglu_tile(pypto, g32, u32, limit, clamp=clamp, silu_on_u=silu_on_u)
        h32 = pypto.cast(pypto.cast(h, bf16), fp32)
        hq = mx_linear.mx_activation_bf16(pypto, h32, rows, valid, width, skip_quant=skip_quant,
                                          group_tile_rows=GROUP_TILE_ROWS, vec_rows=rows)
        # times 1.0 (exact): the write stays in this task (else a copy task of its own, one
        # more hop before the W2 products: FLASH T=192 562 instead of 580 tasks, TINY T=21
        # 39.4 -> 36.2 us)
        pypto.assemble(pypto.mul(hq, 1.0), [start, col], h_mx)


def build(config, case: dict | None = None, *, variant: str = "reference",
          i_tile: int = I_TILE, rows_per_tile: int | None = None,
          runtime_options: dict | None = None):
    """The jit kernel ``shared_expert(x, num_tokens, w1, w1_scale, w3, w3_scale, w2,
    w2_scale, y, xq, h_mx)``: rows below ``num_tokens`` get the shared expert, the rest
    zeros (``xq`` / ``h_mx`` are scratch).
    ``i_tile`` (a multiple of 32) is the intermediate column tile (``inter`` when
    smaller); a smaller one splits a TINY row into several parts, as FLASH's is."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    d = dims(config, case or {"tokens": 1})
    hidden, inter = d["hidden"], d["inter"]
    limit = float(config.moe.swiglu_limit)
    i_tile = mx_linear.tile_width(inter, i_tile)
    narrow = inter // 32 <= NARROW_SCALE_BYTES
    n_tile = mx_linear.tile_width(hidden, NARROW_N_TILE if narrow else N_TILE)
    rows = row_tile(d["tokens"], ROW_TILE, rows_per_tile)
    mx_cols = column_block(hidden, rows, MX_ELEMS, MX_COLS)
    mx_loop = None if d["tokens"] > rows else "SE_XQ"  # several row tiles: blocks unrolled
    cube = cube_tiles(rows, mx_linear.k_chunk(hidden), max(i_tile, n_tile), 2)  # BF16 operands
    clamp = variant != "no_clamp"
    silu_on_u = variant == "silu_on_u"
    skip_h_quant = variant == "skip_h_quant"
    compute_padding = variant == "compute_padding"
    zero_padding = variant not in ("compute_padding", "skip_padding")
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")
    bf16 = pypto.DT_BF16

    @pypto.frontend.jit(runtime_options=options)
    def shared_expert(
        x: pypto.Tensor([tokens_dim, hidden], pypto.DT_BF16),
        num_tokens: pypto.Tensor([1], pypto.DT_INT32),
        w1: pypto.Tensor([inter, hidden], pypto.DT_UINT8),
        w1_scale: pypto.Tensor([inter // 32, hidden // 32], pypto.DT_UINT8),
        w3: pypto.Tensor([inter, hidden], pypto.DT_UINT8),
        w3_scale: pypto.Tensor([inter // 32, hidden // 32], pypto.DT_UINT8),
        w2: pypto.Tensor([hidden, inter], pypto.DT_UINT8),
        w2_scale: pypto.Tensor([hidden // 32, inter // 32], pypto.DT_UINT8),
        y: pypto.Tensor([tokens_dim, hidden], pypto.DT_BF16),
        xq: pypto.Tensor([tokens_dim, hidden], pypto.DT_BF16),
        h_mx: pypto.Tensor([tokens_dim, inter], pypto.DT_BF16),
    ):
        tokens = x.shape[0]
        if compute_padding:
            active = tokens
        else:
            active = num_tokens[0]
        pypto.set_cube_tile_shapes(*cube)
        table = mx_decode.e4m3_table(pypto)
        for r in pypto.loop((active + rows - 1) // rows, name="SE_ROWS", idx_name="r"):
            start = r * rows
            valid = (active - start).min(rows)
            mx_rows(pypto, x, xq, start, rows, valid, mx_cols, mx_loop)  # MX(x)
            for j in pypto.loop(inter // i_tile, name="SE_W13", idx_name="j"):
                w1t = weight_tile(pypto, w1, w1_scale, j * i_tile, i_tile, hidden, table)
                w3t = weight_tile(pypto, w3, w3_scale, j * i_tile, i_tile, hidden, table)
                _h_block(pypto, xq, w1t, w3t, h_mx, start, j * i_tile, rows, valid, i_tile,
                         hidden, limit, clamp=clamp, silu_on_u=silu_on_u, skip_quant=skip_h_quant)
            for nt in pypto.loop(hidden // n_tile, name="SE_W2", idx_name="nt"):
                w2t = weight_tile(pypto, w2, w2_scale, nt * n_tile, n_tile, inter, table)
                yt = mx_linear.rows_times_tile(pypto, h_mx, start, rows, valid, w2t, n_tile,
                                               inter)
                pypto.set_vec_tile_shapes(min(rows, H_VEC_ROWS), n_tile)
                yb = pypto.view(pypto.cast(yt, bf16), [rows, n_tile], [0, 0],
                                valid_shape=[valid, n_tile])
                pypto.assemble(yb, [start, nt * n_tile], y)
        if zero_padding:  # rows active .. tokens - 1: exact zeros
            pypto.set_vec_tile_shapes(min(rows, 8), mx_linear.cols(hidden))
            for p in pypto.loop((tokens - active + rows - 1) // rows, name="SE_PADDING",
                                idx_name="p"):
                start = active + p * rows
                valid = (tokens - start).min(rows)
                pypto.assemble(pypto.full([rows, hidden], 0.0, bf16,
                                          valid_shape=[valid, hidden]), [start, 0], y)

    return shared_expert
