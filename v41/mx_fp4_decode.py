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
"""

import math

from v41.mx_decode import e2m1_values, unsigned_codes

LN2 = math.log(2.0)
PACKED_PER_SCALE = 16  # packed bytes (32 logical columns) per E8M0 scale
VEC_COLS = 1024  # vector tile columns at most (A5 unified buffer)


def even_odd_ids(pypto, k):
    """``(even, odd)`` INT32 ``[k/2]``: logical column ids ``2i`` and ``2i+1`` (index
    vectors for an ``index_select`` of an activation's columns)."""
    half = k // 2
    pypto.set_vec_tile_shapes(min(half, VEC_COLS))
    even = pypto.cast(pypto.mul(pypto.arange(0.0, float(half), 1.0), 2.0), pypto.DT_INT32)
    return even, pypto.add(even, 1)


def fp4_pair_tile(pypto, packed, scales, expert, n0, c0, n_tile, kh, *, swap_nibbles=False):
    """``(lo, hi)`` BF16 ``[n_tile, kh]``: rows ``n0 .. n0+n_tile`` and packed columns
    ``c0 .. c0+kh`` of local expert ``expert`` of the stacked packed weight ``packed
    [L, N, K/2]`` (scales ``[L, N, K/32]``), decoded exactly; ``lo`` holds logical columns
    ``2(c0+i)``, ``hi`` ``2(c0+i)+1``.  ``c0`` and ``kh`` are multiples of 16.

    ``swap_nibbles`` (even columns from the HIGH nibble) is a deliberately wrong reading
    for the harness's wrong-kernel tests."""
    groups = kh // PACKED_PER_SCALE  # scale tiles: whole 32-byte blocks (72 -> 96)
    rt = min(n_tile, 16)
    # uint8 tiles: a whole 32-byte block in the last dim, even over narrower tensors
    pypto.set_vec_tile_shapes(1, rt, min(max(kh, 32), VEC_COLS))
    codes = pypto.reshape(pypto.view(packed, [1, n_tile, kh], [expert, n0, c0]), [n_tile, kh])
    pypto.set_vec_tile_shapes(rt, min(max(kh, 32), VEC_COLS))
    b = unsigned_codes(pypto, codes)  # FP32 0..255
    high = pypto.floor(pypto.mul(b, 1.0 / 16.0))
    low = pypto.sub(b, pypto.mul(high, 16.0))
    if swap_nibbles:
        low, high = high, low
    pypto.set_vec_tile_shapes(1, rt, -(-groups // 32) * 32)
    sc = pypto.view(scales, [1, n_tile, groups], [expert, n0, c0 // PACKED_PER_SCALE])
    n = n_tile * groups
    per = PACKED_PER_SCALE
    pypto.set_vec_tile_shapes(rt, -(-groups // 32) * 32)
    c = unsigned_codes(pypto, pypto.reshape(sc, [n_tile, groups]))
    pypto.set_vec_tile_shapes(min(n, VEC_COLS))
    c = pypto.reshape(c, [n])
    pw = pypto.reshape(pypto.exp(pypto.mul(pypto.sub(c, 127.0), LN2)), [n, 1])
    out = []
    # the per-group scale step in [1024, 16] tiles: [64, 16] ones made it 1.7x slower at FLASH
    for nib in (low, high):  # unrolled at trace time
        pypto.set_vec_tile_shapes(rt, min(kh, VEC_COLS))
        val = e2m1_values(pypto, nib)
        pypto.set_vec_tile_shapes(min(n, 1024), per)  # [1024, 16] FP32: 64 KB
        val = pypto.mul(pypto.reshape(val, [n, per]), pw)
        pypto.set_vec_tile_shapes(rt, min(kh, VEC_COLS))
        out.append(pypto.cast(pypto.reshape(val, [n_tile, kh]), pypto.DT_BF16))
    return out[0], out[1]
