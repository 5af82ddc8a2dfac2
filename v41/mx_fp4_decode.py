"""In-kernel decode of packed MXFP4 expert weights (trace-time helpers; golden
``goldens.moe.dequantize_fp4_fast`` / ``goldens.quant.dequantize_fp4_expert_weight``).

A routed expert matrix is output-major ``[N, K]`` stored packed: uint8 ``[N, K/2]`` whose
byte ``i`` holds logical column ``2i`` in its LOW nibble and ``2i+1`` in its high nibble
(E2M1 codes, bit 3 = sign), and one uint8 E8M0 code per 32 logical columns ``[N, K/32]``
(so packed column ``i`` uses scale column ``i // 16``).  The weights of ``L`` local experts
are stacked ``[L, N, K/2]`` / ``[L, N, K/32]``.

Instead of interleaving the nibbles back into ``[N, K]`` (a 1-wide column scatter is not an
aligned tile), :func:`fp4_pair_tile` returns the two nibble planes separately: ``lo`` =
logical columns ``0, 2, 4, ...`` and ``hi`` = ``1, 3, 5, ...``, each ``[n_tile, kh]``; a
caller contracts ``x[:, even] @ lo^T + x[:, odd] @ hi^T``.  Values are exact in BF16: an
E2M1 value has at most two significant bits and ``2^(s-127)`` is a power of two (the
``exp`` estimate of the power is rounded away by the BF16 cast, as in
:mod:`v41.mx_decode`).

Schedule (A5 cost model): each byte's two values come from two 384-entry tables
(:func:`byte_tables`, one gather each) instead of ~30 floor/multiply steps, and the decode
of one weight tile is forced into one subgraph (:mod:`v41.subgraph`): left to the
partitioner it was cut into many small subgraphs whose intermediates went through global
memory.  A tile is whole rows, which are contiguous, so the packed weight and its scales are
read through ``[rows * K/32, 16]`` and ``[rows * K/32, 1]`` reshapes of the GM tensors:
every step runs in the same ``[1024, 16]`` tiles (one scale per tile row) from the load to
the BF16 result.  The earlier schedule loaded ``[16, K/2]`` rows and reshaped them on chip
into the group layout, and wrapped each signed byte read to 0..255 with four vector steps;
each of its reshapes went through global memory and back, and one FLASH W2 tile
``[128, 1152]`` took 113.6 k cycles against 51.9 k now.
"""

from v41.mx_decode import e2m1_values, e8m0_pow2, table_bytes
from v41.subgraph import one_subgraph

PACKED_PER_SCALE = 16  # packed bytes (32 logical columns) per E8M0 scale
VEC_COLS = 1024  # vector tile columns at most (A5 unified buffer)
TABLE_SPAN = 384  # byte table entries: a code read as signed or unsigned, plus 128
GROUP_ROWS = 1024  # [GROUP_ROWS, 16] FP32 tiles (64 KB): 2048 overflows the UB, 512 is slower


def even_odd_ids(pypto, k):
    """``(even, odd)`` INT32 ``[k/2]``: logical column ids ``2i`` and ``2i+1`` (index
    vectors for an ``index_select`` of an activation's columns)."""
    half = k // 2
    pypto.set_vec_tile_shapes(min(half, VEC_COLS))
    even = pypto.cast(pypto.mul(pypto.arange(0.0, float(half), 1.0), 2.0), pypto.DT_INT32)
    return even, pypto.add(even, 1)


def byte_tables(pypto, *, swap_nibbles=False):
    """``(lo, hi)`` FP32 ``[384]``: entry ``k`` is the E2M1 value of the low (``lo``) and the
    high (``hi``) nibble of byte ``(k - 128) mod 256``, so a packed byte read as signed
    (-128..127, as the interpreter casts uint8) or as unsigned (0..255) indexes its entry at
    ``code + 128`` with no wrap-around arithmetic.  Build them once, before the loops.
    ``swap_nibbles`` swaps the two (a deliberately wrong reading: logical column ``2i`` from
    the HIGH nibble, for the harness's wrong-kernel tests)."""
    b = table_bytes(pypto, TABLE_SPAN)
    high = pypto.floor(pypto.mul(b, 1.0 / 16.0))
    low = pypto.sub(b, pypto.mul(high, 16.0))
    lo, hi = e2m1_values(pypto, low), e2m1_values(pypto, high)
    return (hi, lo) if swap_nibbles else (lo, hi)


def fp4_pair_tile(pypto, packed, scales, tables, expert, n0, n_tile):
    """``(lo, hi)`` BF16 ``[n_tile, K/2]``: whole rows ``n0 .. n0+n_tile`` of local expert
    ``expert`` of the stacked packed weight ``packed [L, N, K/2]`` (scales ``[L, N, K/32]``),
    decoded exactly; ``lo`` holds logical columns ``2i``, ``hi`` ``2i+1``.  ``tables`` from
    :func:`byte_tables`.

    Rounding boundary: none until the BF16 cast of ``value * 2^(s-127)``, which is exact
    (golden ``goldens.quant.dequantize_fp4_expert_weight``)."""
    with one_subgraph(pypto):
        return _pair_tile(pypto, packed, scales, tables, expert, n0, n_tile)


def _pair_tile(pypto, packed, scales, tables, expert, n0, n_tile):
    experts, rows_n, kh = packed.shape
    groups = kh // PACKED_PER_SCALE  # one E8M0 scale per 16 packed bytes
    n = n_tile * groups
    t = min(n, GROUP_ROWS)
    # whole rows are contiguous: the tile is rows of 16 packed bytes and their one scale
    # (GM reshapes, no copy), so no step changes the tile layout until the result
    row0 = (expert * rows_n + n0) * groups
    pypto.set_vec_tile_shapes(t, PACKED_PER_SCALE)
    codes = pypto.view(pypto.reshape(packed, [experts * rows_n * groups, PACKED_PER_SCALE]),
                       [n, PACKED_PER_SCALE], [row0, 0])
    idx = pypto.cast(pypto.add(pypto.cast(codes, pypto.DT_FP32), 128.0), pypto.DT_INT32)
    pypto.set_vec_tile_shapes(t, 1)
    sc = pypto.view(pypto.reshape(scales, [experts * rows_n * groups, 1]), [n, 1], [row0, 0])
    pw = e8m0_pow2(pypto, sc)
    pypto.set_vec_tile_shapes(t * PACKED_PER_SCALE)
    idx = pypto.reshape(idx, [n * PACKED_PER_SCALE])
    out = []
    for table in tables:  # unrolled at trace time: lo, then hi
        pypto.set_vec_tile_shapes(t * PACKED_PER_SCALE)
        val = pypto.index_select(table, 0, idx)
        pypto.set_vec_tile_shapes(t, PACKED_PER_SCALE)
        val = pypto.mul(pypto.reshape(val, [n, PACKED_PER_SCALE]), pw)
        val = pypto.cast(val, pypto.DT_BF16)
        pypto.set_vec_tile_shapes(min(n_tile, 16), min(kh, VEC_COLS))
        out.append(pypto.reshape(val, [n_tile, kh]))
    return out[0], out[1]
