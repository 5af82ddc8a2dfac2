"""MXFP8 linear ``y = MX(x) @ W^T`` inside a pypto kernel (trace-time helpers; golden
``goldens.quant.mxfp8_linear``).

* ``x`` rows are quantized with the ACTIVATION rule (``quantize_mxfp8_activation``: group
  32, amax floored at 1e-4, E8M0 ``2^e``, E4M3 round to nearest even) by
  :func:`v41.mx_encode.activation_group_codes`, and handed back DEQUANTIZED as BF16:
  ``code value * 2^e`` is exact in BF16 (4 significant bits, ``e >= -22``).
* ``W`` is the checkpoint FP8 linear, output-major ``[N, K]`` uint8 E4M3 codes with one
  uint8 E8M0 code per 32x32 block ``[N/32, K/32]``; it is decoded one ``[n_tile, K]`` row
  tile at a time to exact BF16 ``code value * 2^s`` (the block scale repeated per row by an
  ``index_select`` of the scale rows): whole rows by a gather from an E4M3 value table in
  one layout (:func:`whole_row_steps`; FLASH T=192 estimates: o_proj 517 -> 303 us,
  qkv_proj_rope 1,242 -> 575 us, index_query 472 -> 235 us, shared_expert T=21 788 -> 267
  us), a column block by arithmetic (:func:`v41.mx_decode.window_rows`); no expanded weight
  ever exists beyond one tile.
* ``y`` tile = BF16 x BF16 cube matmul with FP32 accumulation over all of K.

Why this equals the golden: both operands are the exact dequantized MX values, so every
product is exact; the golden sums each 32-group exactly, rounds it to FP32, scales it by
the two powers of two (exact) and adds the groups in ascending order in FP32, while the
cube accumulates the same exact products in FP32 in its own order.  The two differ only
by FP32 reassociation (~1e-7 relative), far inside the contract's per-row bound.  (The A5
cube's MX FP8 x FP8 path would take the codes and scales directly; on pypto 0.2.0's
interpreter ``scaled_mm`` ignores the scales and the FP8 dtype misdecodes exponent 15.)
"""

import math

from v41 import mx_decode, mx_encode
from v41.subgraph import one_subgraph

MX_GROUP = 32
LN2 = math.log(2.0)
VEC_COLS = 1024  # vector tile columns at most: 16 x 1024 FP32 = 64 KB of the 248 KB UB
GROUP_ROWS = 512  # [GROUP_ROWS, 32] tiles of the whole-row weight decode (64 KB FP32)
UB_COPY_BYTES = 64 << 10  # one staged copy piece at most (a quarter of the UB)


def cols(k: int) -> int:
    """Vector tile columns for a ``k``-wide row: ``k`` up to :data:`VEC_COLS` (a FLASH
    ``[16, 5120]`` FP32 tile, 320 KB, exceeds the A5 unified buffer and fails the pass)."""
    return min(k, VEC_COLS)


def mx_activation_bf16(pypto, x32, rows, valid, k, group=MX_GROUP, *, skip_quant=False,
                       group_tile_rows=64, vec_rows=8):
    """BF16 ``[rows, k]`` (first ``valid`` rows real): ``MX(x)`` of FP32 ``x32 [rows, k]``
    dequantized exactly (see the module doc).  Vector tiles: ``group_tile_rows`` groups of
    32 for the group steps, ``vec_rows`` rows for the row-shaped ones.  ``skip_quant`` is a
    deliberately wrong reading for the harness's wrong-kernel tests (plain BF16 cast, no
    MXFP8 rounding)."""
    if skip_quant:
        pypto.set_vec_tile_shapes(min(rows, vec_rows), cols(k))
        return pypto.cast(x32, pypto.DT_BF16)
    n, gpr = rows * k // group, k // group
    pypto.set_vec_tile_shapes(min(rows, vec_rows), cols(k))
    xg = pypto.reshape(x32, [n, group], valid_shape=[valid * gpr, group])
    codes, e = mx_encode.activation_group_codes(pypto, xg, n, group, group_tile_rows)
    frac, expo = mx_decode.e4m3_parts(pypto, codes)
    # value * 2^e = frac * 2^(max(expo, 1) - 7 + e): one exp, rounded away by the BF16 cast
    pw = pypto.exp(pypto.mul(pypto.add(pypto.maximum(expo, 1.0), pypto.sub(e, 7.0)), LN2))
    val = pypto.mul(frac, pw)
    pypto.set_vec_tile_shapes(min(rows, vec_rows), cols(k))
    xq = pypto.cast(pypto.reshape(val, [rows, k], valid_shape=[valid, k]), pypto.DT_BF16)
    return pypto.view(xq, [rows, k], [0, 0], valid_shape=[valid, k])


def _weight_row_ids(pypto, n_tile, group):
    """INT32 ``[n_tile]``: the scale row ``r // group`` of each weight row of a tile."""
    pypto.set_vec_tile_shapes(n_tile)
    iota = pypto.arange(0.0, float(n_tile), 1.0)
    return pypto.cast(pypto.floor(pypto.mul(pypto.add(iota, 0.5), 1.0 / group)), pypto.DT_INT32)


def mx_weight_tile_bf16(pypto, w_codes, w_scales, n0, c0, n_tile, k, group=MX_GROUP, *,
                        scale_up=False, table=None, one_task=False):
    """BF16 ``[n_tile, k]``: the block ``[n0 : n0 + n_tile, c0 : c0 + k]`` of the FP8 weight
    decoded exactly (``n0``, ``c0``, ``n_tile``, ``k`` multiples of ``group``).
    ``scale_up`` is a deliberately wrong reading (every block scale one binade too large).
    With ``table`` (:func:`v41.mx_decode.e4m3_table`) and whole rows (``c0 = 0``, ``k`` =
    all of K) the tile is decoded by :func:`whole_row_steps` as one subgraph (with ``one_task``
    the scale-row gather too, in one ``[n_tile, K/32]`` tile: fewer tasks and edges); else
    by the arithmetic :func:`v41.mx_decode.window_rows`."""
    kg = k // group
    if table is not None and c0 == 0 and k == w_codes.shape[1] and one_task:
        with one_subgraph(pypto):
            srep = _scale_rows(pypto, w_scales, n0, c0, n_tile, kg, group, n_tile)
            wt = whole_row_steps(pypto, w_codes, srep, table, n0, n_tile, k, group)
    else:
        srep = _scale_rows(pypto, w_scales, n0, c0, n_tile, kg, group, 16)
        if table is not None and c0 == 0 and k == w_codes.shape[1]:
            with one_subgraph(pypto):
                wt = whole_row_steps(pypto, w_codes, srep, table, n0, n_tile, k, group)
        else:
            pypto.set_vec_tile_shapes(min(n_tile, 16), cols(k))
            codes = pypto.view(w_codes, [n_tile, k], [n0, c0])
            wt = mx_decode.window_rows(pypto, codes, pypto.reshape(srep, [n_tile * kg]),
                                       n_tile, k, group, row_tile=(min(n_tile, 16), cols(k)),
                                       pieces=4)
    if scale_up:
        wt = pypto.cast(pypto.mul(pypto.cast(wt, pypto.DT_FP32), 2.0), pypto.DT_BF16)
    return wt


def _scale_rows(pypto, w_scales, n0, c0, n_tile, kg, group, tile_rows):
    """uint8 ``[n_tile, K/32]``: each weight row's block scales (the block row repeated per
    row by an exact ``index_select``), in vector tiles of ``tile_rows`` rows."""
    row_ids = _weight_row_ids(pypto, n_tile, group)
    pypto.set_vec_tile_shapes(min(n_tile // group, tile_rows), kg)
    srows = pypto.view(w_scales, [n_tile // group, kg], [n0 // group, c0 // group])
    pypto.set_vec_tile_shapes(min(n_tile, tile_rows), kg)
    return pypto.index_select(srows, 0, row_ids)  # [n_tile, kg] uint8, exact


def whole_row_steps(pypto, w_codes, srep, table, n0, n_tile, k, group, group_rows=GROUP_ROWS):
    """The decode of :func:`mx_weight_tile_bf16` for whole rows (the caller scopes it as one
    subgraph): they are contiguous, so the codes are read through a ``[N * K/32, 32]`` GM
    reshape and every step runs in the same ``[GROUP_ROWS, 32]`` tiles (one block scale per
    tile row) up to the BF16 result: one gather from the code table, one multiply by the
    power of two.  The arithmetic path reshapes on chip, and each reshape goes through
    global memory and back.  ``group_rows``: rows of those tiles (each costs two copy-ins,
    its codes and its scale column, ~1.4 k cycles whatever the size)."""
    kg = k // group
    n = n_tile * kg
    t = min(n, group_rows)
    pypto.set_vec_tile_shapes(t)
    pw = mx_decode.e8m0_pow2(pypto, pypto.reshape(srep, [n]))
    pypto.set_vec_tile_shapes(t, 1)
    pw = pypto.reshape(pw, [n, 1])
    pypto.set_vec_tile_shapes(t, group)
    rows_all = w_codes.shape[0] * kg
    codes = pypto.view(pypto.reshape(w_codes, [rows_all, group]), [n, group], [n0 * kg, 0])
    idx = pypto.cast(pypto.add(pypto.cast(codes, pypto.DT_FP32), 128.0), pypto.DT_INT32)
    pypto.set_vec_tile_shapes(t * group)
    val = pypto.index_select(table, 0, pypto.reshape(idx, [n * group]))
    pypto.set_vec_tile_shapes(t, group)
    val = pypto.cast(pypto.mul(pypto.reshape(val, [n, group]), pw), pypto.DT_BF16)
    pypto.set_vec_tile_shapes(min(n_tile, 16), cols(k))
    return pypto.reshape(val, [n_tile, k])


def mx_linear_tile(pypto, parts, w_codes, w_scales, n0, n_tile, rows, valid, *,
                   scale_up=False):
    """FP32 ``[rows, n_tile]`` (first ``valid`` rows real): output columns ``n0 .. n0 +
    n_tile`` of ``x @ W^T`` for one row tile whose MX activation is given as ``parts``:
    ``(BF16 [rows, k_p], k_p)`` column blocks of ``x`` in order (each from
    :func:`mx_activation_bf16`; ``k_p`` a multiple of 32).  Each part's weight block is
    decoded by :func:`mx_weight_tile_bf16`, multiplied on the cube, and the parts' FP32
    products are added in order."""
    c0 = 0
    y = None
    for xq, kp in parts:  # unrolled at trace time
        wt = mx_weight_tile_bf16(pypto, w_codes, w_scales, n0, c0, n_tile, kp, scale_up=scale_up)
        # re-view: a tensor entering a nested loop's function loses its valid shape
        pypto.set_vec_tile_shapes(min(rows, 16), cols(kp))
        xv = pypto.view(xq, [rows, kp], [0, 0], valid_shape=[valid, kp])
        mm = pypto.matmul(xv, wt, pypto.DT_FP32, b_trans=True)  # [rows, n_tile]
        pypto.set_vec_tile_shapes(min(rows, 16), n_tile)
        y = mm if y is None else pypto.add(y, mm)
        c0 += kp
    return y


def tile_width(n, n_tile):
    """The weight row tile for ``n`` output rows: ``n_tile``, or ``n`` when smaller."""
    width = min(n, n_tile)
    if n % width or width % MX_GROUP:
        raise ValueError(f"n: {n} output rows must be a multiple of the tile {width} "
                         f"(itself a multiple of {MX_GROUP})")
    return width


def mx_linear_cols(pypto, parts, w_codes, w_scales, n0, n, n_tile, rows, valid, *,
                   scale_up=False):
    """FP32 ``[rows, n]`` (first ``valid`` rows real): output columns ``n0 .. n0 + n`` of
    ``x @ W^T`` as :func:`mx_linear_tile` tiles of ``tile_width(n, n_tile)`` unrolled at
    trace time and concatenated (for a row that must be whole in-kernel, e.g. before a
    norm)."""
    width = tile_width(n, n_tile)
    tiles = []
    for j in range(n // width):
        tiles.append(mx_linear_tile(pypto, parts, w_codes, w_scales, n0 + j * width, width,
                                    rows, valid, scale_up=scale_up))
    if len(tiles) == 1:
        return tiles[0]
    pypto.set_vec_tile_shapes(min(rows, 16), min(n, 1024))
    return pypto.view(pypto.concat(tiles, -1), [rows, n], [0, 0], valid_shape=[valid, n])


def mx_linear_rows(pypto, parts, w_codes, w_scales, out, start, rows, valid, n, n_tile, *,
                   name, scale_up=False):
    """``out[start : start + valid, :n] = x @ W^T`` in FP32 for one row tile (``parts`` as
    in :func:`mx_linear_tile`), a ``pypto.loop`` over ``n / n_tile`` weight row tiles."""
    width = tile_width(n, n_tile)
    for j in pypto.loop(n // width, name=name, idx_name="nt"):
        y = mx_linear_tile(pypto, parts, w_codes, w_scales, j * width, width, rows, valid,
                           scale_up=scale_up)
        pypto.assemble(y, [start, j * width], out)


def k_chunk(k: int, most: int = 1024) -> int:
    """The K columns one cube operand view takes: the largest multiple of 32 up to
    ``most`` that divides ``k`` (a ``[32, 5120]`` BF16 view exceeds the 248 KB UB)."""
    return max(c for c in range(32, min(k, most) + 1, 32) if k % c == 0)


def k_partials(pypto, a, start, rows, valid, w_tile, n, k):
    """Yield the FP32 ``[rows, n]`` partial products in K order (traced as they are
    consumed): rows ``start .. start + valid`` of the BF16 DDR tensor ``a`` ``[*, k]`` times
    the BF16 tile ``w_tile [n, k]`` transposed, K split into :func:`k_chunk` views."""
    kc = k_chunk(k)
    for q in range(k // kc):  # unrolled at trace time (FLASH: 5 for hidden, 3 for inter)
        pypto.set_vec_tile_shapes(min(rows, 16), kc)
        av = pypto.view(a, [rows, kc], [start, q * kc], valid_shape=[valid, kc])
        wv = pypto.view(w_tile, [n, kc], [0, q * kc])
        yield pypto.matmul(av, wv, pypto.DT_FP32, b_trans=True)


def rows_times_tile(pypto, a, start, rows, valid, w_tile, n, k):
    """FP32 ``[rows, n]``: the :func:`k_partials` added in K order."""
    acc = None
    for mm in k_partials(pypto, a, start, rows, valid, w_tile, n, k):
        pypto.set_vec_tile_shapes(min(rows, 16), n)
        acc = mm if acc is None else pypto.add(acc, mm)
    return acc


def assemble_rows(pypto, tile, out, start, col, rows, valid, width):
    """``out[start : start + valid, col : col + width] = tile`` for a BF16 ``[rows, width]``
    row tile, in :func:`k_chunk` column pieces of at most :data:`UB_COPY_BYTES` (the copy
    stages a whole piece in the UB: ``[192, 1024]`` BF16 exceeds its 248 KB)."""
    kc = k_chunk(width, max(32, UB_COPY_BYTES // (2 * rows)))
    for q in range(width // kc):  # unrolled at trace time
        pypto.set_vec_tile_shapes(min(rows, 8), kc)
        pypto.assemble(pypto.view(tile, [rows, kc], [0, q * kc], valid_shape=[valid, kc]),
                       [start, col + q * kc], out)
