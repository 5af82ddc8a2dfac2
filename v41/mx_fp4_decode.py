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

Schedule (A5 cost model, one FLASH expert, 3 rows): each byte's two values come from two
256-entry tables (:func:`byte_tables`, one gather each) instead of ~30 floor/multiply steps,
the work runs in ``[1024, 16]`` tiles (one scale per tile row, so no reshape between a
row layout and a group layout), and the whole decode of one weight tile is forced into one
subgraph (:mod:`v41.subgraph`): left to the partitioner it was cut into many small
subgraphs whose intermediates went through global memory (60 % of the estimate).
"""

import math

from v41.mx_decode import e2m1_values, unsigned_codes
from v41.subgraph import one_subgraph

LN2 = math.log(2.0)
PACKED_PER_SCALE = 16  # packed bytes (32 logical columns) per E8M0 scale
VEC_COLS = 1024  # vector tile columns at most (A5 unified buffer)
GROUP_ROWS = 1024  # [GROUP_ROWS, 16] FP32 tiles (64 KB): 2048 overflows the UB, 512 is slower


def even_odd_ids(pypto, k):
    """``(even, odd)`` INT32 ``[k/2]``: logical column ids ``2i`` and ``2i+1`` (index
    vectors for an ``index_select`` of an activation's columns)."""
    half = k // 2
    pypto.set_vec_tile_shapes(min(half, VEC_COLS))
    even = pypto.cast(pypto.mul(pypto.arange(0.0, float(half), 1.0), 2.0), pypto.DT_INT32)
    return even, pypto.add(even, 1)


def byte_tables(pypto, *, swap_nibbles=False):
    """``(lo, hi)`` FP32 ``[256]``: entry ``b`` is the E2M1 value of the low (``lo``) and the
    high (``hi``) nibble of byte ``b``.  Build them once, before the loops.
    ``swap_nibbles`` swaps the two (a deliberately wrong reading: logical column ``2i`` from
    the HIGH nibble, for the harness's wrong-kernel tests)."""
    pypto.set_vec_tile_shapes(256)
    b = pypto.arange(0.0, 256.0, 1.0)
    high = pypto.floor(pypto.mul(b, 1.0 / 16.0))
    low = pypto.sub(b, pypto.mul(high, 16.0))
    lo, hi = e2m1_values(pypto, low), e2m1_values(pypto, high)
    return (hi, lo) if swap_nibbles else (lo, hi)


def fp4_pair_tile(pypto, packed, scales, tables, expert, n0, c0, n_tile, kh):
    """``(lo, hi)`` BF16 ``[n_tile, kh]``: rows ``n0 .. n0+n_tile`` and packed columns
    ``c0 .. c0+kh`` of local expert ``expert`` of the stacked packed weight ``packed
    [L, N, K/2]`` (scales ``[L, N, K/32]``), decoded exactly; ``lo`` holds logical columns
    ``2(c0+i)``, ``hi`` ``2(c0+i)+1``.  ``tables`` from :func:`byte_tables`; ``c0`` and
    ``kh`` are multiples of 16.

    Rounding boundary: none until the BF16 cast of ``value * 2^(s-127)``, which is exact
    (golden ``goldens.quant.dequantize_fp4_expert_weight``)."""
    with one_subgraph(pypto):
        return _pair_tile(pypto, packed, scales, tables, expert, n0, c0, n_tile, kh)


def _pair_tile(pypto, packed, scales, tables, expert, n0, c0, n_tile, kh):
    groups = kh // PACKED_PER_SCALE  # one E8M0 scale per 16 packed bytes
    n = n_tile * groups
    rt = min(n_tile, 16)
    t = min(n, GROUP_ROWS)
    # uint8 tiles: a whole 32-byte block in the last dim, even over narrower tensors
    pypto.set_vec_tile_shapes(1, rt, min(max(kh, 32), VEC_COLS))
    codes = pypto.reshape(pypto.view(packed, [1, n_tile, kh], [expert, n0, c0]), [n_tile, kh])
    pypto.set_vec_tile_shapes(t, PACKED_PER_SCALE)
    b = unsigned_codes(pypto, pypto.reshape(codes, [n, PACKED_PER_SCALE]))  # FP32 0..255
    idx = pypto.cast(b, pypto.DT_INT32)
    pypto.set_vec_tile_shapes(t * PACKED_PER_SCALE)
    idx = pypto.reshape(idx, [n * PACKED_PER_SCALE])
    pypto.set_vec_tile_shapes(1, rt, -(-groups // 32) * 32)
    sc = pypto.reshape(pypto.view(scales, [1, n_tile, groups],
                                  [expert, n0, c0 // PACKED_PER_SCALE]), [n_tile, groups])
    pypto.set_vec_tile_shapes(rt, -(-groups // 32) * 32)
    c = unsigned_codes(pypto, sc)
    pypto.set_vec_tile_shapes(t)
    c = pypto.reshape(c, [n])
    pw = pypto.reshape(pypto.exp(pypto.mul(pypto.sub(c, 127.0), LN2)), [n, 1])
    out = []
    for table in tables:  # unrolled at trace time: lo, then hi
        pypto.set_vec_tile_shapes(t * PACKED_PER_SCALE)
        val = pypto.index_select(table, 0, idx)
        pypto.set_vec_tile_shapes(t, PACKED_PER_SCALE)
        val = pypto.mul(pypto.reshape(val, [n, PACKED_PER_SCALE]), pw)
        val = pypto.cast(val, pypto.DT_BF16)
        pypto.set_vec_tile_shapes(rt, min(kh, VEC_COLS))
        out.append(pypto.reshape(val, [n_tile, kh]))
    return out[0], out[1]
