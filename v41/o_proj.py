"""Output projection, one TP rank's FP32 partial (golden: ``goldens.o_proj.o_proj_partial``).

Per row tile of up to ``ROW_TILE`` tokens (the launch's tokens rounded up to 16; cube tiles
from :mod:`v41.cube_tiles`), for each of the rank's ``groups`` output groups:

* ``o = [inverse RoPE of the rope tail of each head]`` BF16: adjacent pairs ``(re, im)``
  de-rotated with the token's ``(cos, sin)``, ``(re c + im s, im c - re s)`` in FP32, one
  BF16 cast, head by head (:mod:`v41.rope_tail`); the NoPE channels pass through
  unchanged and the heads are concatenated back to the group width;
* ``latent_g = [o_g @ wo_a_g^T]`` BF16 x BF16 cube matmul, FP32 accumulation, ONE BF16 cast;
* ``partial = MX(latent) @ wo_b^T`` kept in FP32 (:mod:`v41.mx_linear`: activation MXFP8
  per group of 32, ``wo_b`` E4M3 codes x E8M0 32x32 block scales decoded in-kernel one
  ``[N_TILE, K]`` tile at a time; one product over all of K a tile).

Schedule (weight-stationary): ``O_ROWS`` writes every row tile's ``MX(latent)`` to the
scratch output ``lat_pre`` in column pieces, then ONE join task per row tile copies the
row tile (times 1.0, exact) to the scratch output ``lat_mx``; ``O_WO_B`` then decodes each
``wo_b`` tile ONCE per launch and applies it to every row tile, so the decode work does
not grow with ``tokens``.

Task graph (the A5 cost model's AICPU charges every task and dependency edge): each weight
tile's scale-row gather and decode are one subgraph, each column piece of a group's
latent (BF16 cast, MXFP8 activation, copy out; :func:`_latent_out`) is one subgraph, and
the K-partial adds of a ``wo_b`` product went in multi-row tiles (until the single product
below).  FLASH TP4 T=192:
1,321 -> 521 tasks, 303 -> 179 us; the same operations in the same order, so the same
output bits.  The inverse RoPE on the whole row tile and 96-row adds: T=192 170.6 -> 149.5
us (est.sh case).
A cube product's charge is mostly fixed per task (its left operand's pass over K), so the
``wo_b`` tiles take 256 rows: 40 products of 21.8 k cycles instead of 80 of 16.5 k, half
the decodes, tasks and edges; with 64-row adds: T=4 / 48 / 192 / 1024 102.6 / 108.6 /
149.5 / 575.0 -> 94.0 / 103.6 / 134.9 / 474.1 us.  The RoPE and ``wo_a`` products keep
128-column tiles (with 256 columns T=4 is 106.9 us); a ``wo_a`` tile of 80 columns (26
tasks on 28 cube cores) still costs 48.5 k cycles a task, not 34 k (149.3 us).

Row tiles of 96 and latent MX pieces of at least ``LAT_MIN_W`` columns (at least two per
group) with 96-row adds: FLASH TP4 T=4 / 48 / 192 / 384 / 1024 129.5 / 108.9 / 175.3 / - /
597.9 -> 129.5 / 108.9 / 147.3 / 222.7 / 590.9 us; compile at T=192 1.45-1.6 s CPU against
0.95-1.35 at T=4 (was 2.7: with 192-row tiles the products' ``k0`` halves to fit L0A and
the latent went in 32 pieces of 32 columns per group).  Tried: 192-row tiles with the rest
165.1 us (compile 1.7 s, T=1024 450.3 us), 128-row tiles 165.8 us, the concatenated group
as one vector tile 158.5 us (TINY T=21 46.3 -> 47.8 us).  TINY launches of several 96-row tiles
are slower than with one (T=384 / 512 70.3 / 78.1 -> 88.5 / 109.4 us).

The join and one ``wo_b`` product over all of K: each of a row tile's 16 latent pieces had
an edge to each of its 20 ``wo_b`` products, and the AICPU resolves a finished task's edges
one after another (390 cycles each; 8.2 k cycles a piece), so the products of the first row
tile started 43 k cycles after its last piece.  The join has 16 edges in and 20 out.  The
product takes K in one (its L1 K tiles of 512 summed in K order by the cube) instead of one
product per 1,024 columns added on the vector cores: 40 products and no add tasks.  FLASH
TP4 T=4 / 48 / 192 / 1024: 129.5 / 108.9 / 147.3 / 590.9 -> 111.8 / 94.4 / 129.7 / 514.8 us
(485 -> 373 tasks at T=192); the join alone, with the products split by K as before, 147.9
us; the single product alone 142.3.  ``partial`` differs from the split products' in FP32
reassociation where K > 1,024 (FLASH; 2.5e-8 RMS from the golden at T=8 TP4, as before),
and is the same bits where K <= 1,024 (TINY).  The join tile is ``JOIN_W`` columns wide
(256: 137.4 us, 1,024: 136.4; 2,048 does not fit the UB).

Compile grows with the row tile up to ``ROW_TILE``: the row tile follows the launch's
tokens because the cost model charges whole tiles and every extra task.  Measured
at T=4 / T=192: fixed 16-row tiles 759 us at T=192; the de-rotation in its own 16-row loop
and the latent's MXFP8 in an 8-row loop over a BF16 scratch: compile flat (0.88 / 1.12 s)
but 124 / 341 us (64-row loop: 164 / 252 us); only the latent's 8-row pieces in a
``pypto.loop`` over both groups: 1.14 / 1.97 s but 95.6 / 145.1 us (each ``wo_a`` task
resolves 25 successors and the second group's pieces start 24 k cycles later).

The TP sum is not in the kernel: every rank's partial goes to the host transport, which
sums them in rank order in FP32 with one BF16 cast (``harness.entries.o_proj``).

ABI (one rank; ``heads = num_heads / tp``, ``groups = o_groups / tp``, ``K = groups *
o_lora_rank``; 3-D golden tensors are passed row-major flattened, same bytes)
---
============  ==============================  ========  =====
name          shape                           dtype     role
============  ==============================  ========  =====
attn_out      (tokens, heads * head_dim)      bfloat16  in
rope_cos      (tokens, rope_dim / 2)          float32   in
rope_sin      (tokens, rope_dim / 2)          float32   in
wo_a          (groups * o_lora_rank, o_group_in)  bfloat16  in
wo_b          (hidden, K)                     uint8     in   (E4M3 codes)
wo_b_scale    (hidden / 32, K / 32)           uint8     in   (E8M0 codes)
partial       (tokens, hidden)                float32   out
lat_mx        (tokens, K)                     bfloat16  out  (scratch: MX(latent), joined)
lat_pre       (tokens, K)                     bfloat16  out  (scratch: MX(latent) pieces)
============  ==============================  ========  =====

``tokens`` (>= 1) is a dynamic axis; ``tp`` from ``case["tp"]`` (default 1).
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41 import mx_decode, mx_linear, rope_tail
from v41.abi import Arg, case_int, jit_options, resolve
from v41.cube_tiles import cube_tiles, row_tile
from v41.subgraph import one_subgraph

ROW_TILE = 96  # most tokens per row tile (the wo_b weight is still decoded once per launch)
N_TILE = 256  # wo_b output rows decoded per weight tile (and columns per wo_b product)
WO_A_N = 128  # latent columns per wo_a product
ROPE_ROWS = 192  # rows per vector tile of the inverse RoPE (the whole row tile)
LAT_ROWS = 8  # an MX-activation subgraph takes LAT_ROWS * lora latent elements
LAT_MIN_W = 128  # fewest columns of a latent MX piece (unless that leaves one piece a group)
JOIN_W = 512  # columns per vector tile of the join ([96, 512] BF16: 96 KB)
OUT_ROWS = 96  # rows per vector tile of a product's copy out

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "forward_rope": "rotates the heads' rope tail forward instead of de-rotating it",
    "wo_b_scale_up": "decodes wo_b with every E8M0 block scale one binade too large",
    "skip_act_quant": "feeds the BF16 latent to wo_b without its MXFP8 quantization",
}

ABI = (
    Arg("attn_out", ("tokens", "width"), "bfloat16", "in"),
    Arg("rope_cos", ("tokens", "half"), "float32", "in"),
    Arg("rope_sin", ("tokens", "half"), "float32", "in"),
    Arg("wo_a", ("latent", "group_in"), "bfloat16", "in"),
    Arg("wo_b", ("hidden", "latent"), "uint8", "in"),
    Arg("wo_b_scale", ("hidden_blocks", "latent_blocks"), "uint8", "in"),
    Arg("partial", ("tokens", "hidden"), "float32", "out"),
    Arg("lat_mx", ("tokens", "latent"), "bfloat16", "out"),
    Arg("lat_pre", ("tokens", "latent"), "bfloat16", "out"),
)


def dims(config, case: dict) -> dict[str, int]:
    tp = case_int(case, "tp", default=1, minimum=1)
    if config.o_groups % tp or config.num_heads % tp:
        raise ValueError(f"case['tp']: {tp} must divide o_groups {config.o_groups} and "
                         f"num_heads {config.num_heads}")
    if config.hidden_size % N_TILE:
        raise ValueError(f"config.hidden_size: {config.hidden_size} must be a multiple of "
                         f"N_TILE {N_TILE}")
    latent = config.o_groups // tp * config.o_lora_rank
    return {"tokens": case_int(case, "tokens", minimum=1),
            "width": config.num_heads // tp * config.head_dim, "half": config.rope_dim // 2,
            "latent": latent, "group_in": config.o_group_in, "hidden": config.hidden_size,
            "hidden_blocks": config.hidden_size // 32, "latent_blocks": latent // 32}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def build(config, case: dict | None = None, *, variant: str = "reference",
          rows_per_tile: int | None = None,
          runtime_options: dict | None = None):
    """The jit kernel ``o_proj(attn_out, rope_cos, rope_sin, wo_a, wo_b, wo_b_scale,
    partial, lat_mx, lat_pre)``: one rank's FP32 partial of the output projection
    (``lat_mx`` and ``lat_pre`` are scratch)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    d = dims(config, case or {"tokens": 1})
    width, half, k = d["width"], d["half"], d["latent"]
    gi, lora, hidden = config.o_group_in, config.o_lora_rank, config.hidden_size
    groups = k // lora
    hd, rd = config.head_dim, config.rope_dim
    nope, heads_per_group = hd - rd, gi // hd
    rows = row_tile(d["tokens"], ROW_TILE, rows_per_tile)
    cube_a = cube_tiles(rows, gi, WO_A_N, 2)  # BF16 operands: RoPE and wo_a products
    cube_b = cube_tiles(rows, k, N_TILE, 2)  # wo_b products: all of K in one
    inverse = variant != "forward_rope"
    skip_quant = variant == "skip_act_quant"
    scale_up = variant == "wo_b_scale_up"
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")

    @pypto.frontend.jit(runtime_options=options)
    def o_proj(
        attn_out: pypto.Tensor([tokens_dim, width], pypto.DT_BF16),
        rope_cos: pypto.Tensor([tokens_dim, half], pypto.DT_FP32),
        rope_sin: pypto.Tensor([tokens_dim, half], pypto.DT_FP32),
        wo_a: pypto.Tensor([k, gi], pypto.DT_BF16),
        wo_b: pypto.Tensor([hidden, k], pypto.DT_UINT8),
        wo_b_scale: pypto.Tensor([hidden // 32, k // 32], pypto.DT_UINT8),
        partial: pypto.Tensor([tokens_dim, hidden], pypto.DT_FP32),
        lat_mx: pypto.Tensor([d["tokens"], k], pypto.DT_BF16),  # static rows: order_audit
        lat_pre: pypto.Tensor([tokens_dim, k], pypto.DT_BF16),
    ):
        tokens = attn_out.shape[0]
        pypto.set_cube_tile_shapes(*cube_a)
        table = mx_decode.e4m3_table(pypto)
        row_tiles = (tokens + rows - 1) // rows
        for i in pypto.loop(row_tiles, name="O_ROWS", idx_name="r"):
            start = i * rows
            valid = (tokens - start).min(rows)
            cos_t, sin_t = rope_tail.row_views(pypto, rope_cos, rope_sin, start, rows, valid)
            factors = rope_tail.rope_factors(pypto, rd, inverse=inverse)
            for g in range(groups):  # unrolled at trace time
                pieces = []
                for h in range(heads_per_group):
                    c0 = g * gi + h * hd
                    pypto.set_vec_tile_shapes(min(rows, ROPE_ROWS), hd)
                    pieces.append(pypto.view(attn_out, [rows, nope], [start, c0],
                                             valid_shape=[valid, nope]))
                    tail = pypto.view(attn_out, [rows, rd], [start, c0 + nope],
                                      valid_shape=[valid, rd])
                    pieces.append(rope_tail.rotate_tail(pypto, tail, cos_t, sin_t, factors, rows,
                                                        valid, rd, tile_rows=ROPE_ROWS))
                pypto.set_vec_tile_shapes(min(rows, 16), gi)
                o = pypto.view(pypto.concat(pieces, -1), [rows, gi], [0, 0],
                               valid_shape=[valid, gi])
                lat = pypto.matmul(o, pypto.view(wo_a, [lora, gi], [g * lora, 0]),
                                   pypto.DT_FP32, b_trans=True)  # [rows, lora]
                _latent_out(pypto, lat, lat_pre, start, g * lora, rows, valid, lora,
                            skip_quant=skip_quant)
            _join(pypto, lat_pre, lat_mx, start, rows, valid, k)
        pypto.set_cube_tile_shapes(*cube_b)
        for nt in pypto.loop(hidden // N_TILE, name="O_WO_B", idx_name="nt"):
            wt = mx_linear.mx_weight_tile_bf16(pypto, wo_b, wo_b_scale, nt * N_TILE, 0, N_TILE,
                                               k, scale_up=scale_up, table=table, one_task=True)
            for i in pypto.loop(row_tiles, name="O_WO_B_ROWS", idx_name="r"):
                start = i * rows
                valid = (tokens - start).min(rows)
                _rows_times_tile(pypto, lat_mx, start, rows, valid, wt, N_TILE, k, partial,
                                 nt * N_TILE)

    return o_proj


def _latent_out(pypto, lat, dst, start, col, rows, valid, lora, *, skip_quant):
    """``dst[start:, col : col + lora] = MX(bf16(lat))`` (``lat_pre`` in the kernel: the
    join reads it in the same root function) for one group's FP32 ``[rows,
    lora]`` latent, in column pieces of ``LAT_ROWS * lora / rows`` columns, at least
    ``LAT_MIN_W`` and at most ``lora / 2`` (a multiple of 32 dividing ``lora``, so the MX
    groups are the same): each piece's casts, MXFP8 activation and copy out as one
    subgraph on one tile.  Column pieces, not row pieces: pypto 0.2.0 tracks the dynamic
    ``tokens`` rows as one cell per static column block, so a reader would wait for the
    last row piece of a column block only, while each column piece is a cell of its own
    (FLASH TP4 T=4 / 192: 94.0 / 134.9 -> 95.9 / 175.3 us)."""
    w = mx_linear.k_chunk(lora, min(max(LAT_MIN_W, LAT_ROWS * lora // rows), lora // 2))
    for c0 in range(0, lora, w):  # unrolled at trace time
        with one_subgraph(pypto):
            pypto.set_vec_tile_shapes(rows, w)
            piece = pypto.view(lat, [rows, w], [0, c0], valid_shape=[valid, w])
            lat32 = pypto.cast(pypto.cast(piece, pypto.DT_BF16), pypto.DT_FP32)
            xq = mx_linear.mx_activation_bf16(pypto, lat32, rows, valid, w,
                                              skip_quant=skip_quant,
                                              group_tile_rows=rows * w // 32, vec_rows=rows)
            mx_linear.assemble_rows(pypto, xq, dst, start, col + c0, rows, valid, w)


def _join(pypto, src, dst, start, rows, valid, k):
    """``dst[start : start + valid] = src[start : start + valid] * 1.0`` (exact) as ONE task
    that waits for every piece of the row tile.  ``dst`` (``lat_mx``) has static rows (the
    case's tokens), tracked per written tile, so each ``wo_b`` product, in a later root
    function, waits for its own row tile's join (``harness.order_audit`` at TINY T=384,
    FLASH TP4 T=192 / 384 / 1024)."""
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(rows, JOIN_W)
        v = pypto.mul(pypto.view(src, [rows, k], [start, 0], valid_shape=[valid, k]), 1.0)
        pypto.assemble(v, [start, 0], dst)


def _rows_times_tile(pypto, a, start, rows, valid, w_tile, n, k, out, col):
    """``out[start:, col : col + n] = a[start:] @ w_tile^T`` in FP32: ONE cube product over
    all of K (the cube accumulates its L1 K tiles in K order) written by the product
    itself."""
    pypto.set_vec_tile_shapes(min(rows, 16), mx_linear.k_chunk(k))
    av = pypto.view(a, [rows, k], [start, 0], valid_shape=[valid, k])
    mm = pypto.matmul(av, w_tile, pypto.DT_FP32, b_trans=True)
    pypto.set_vec_tile_shapes(min(rows, OUT_ROWS), n)
    pypto.assemble(mm, [start, col], out)  # mm keeps av's valid rows
