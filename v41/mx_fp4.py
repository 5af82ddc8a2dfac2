"""Trace-time MXFP4 encoders for the compressor's publication: packed E2M1 payloads with
E4M3 group scales (compressed KV, ``goldens.quant.quantize_compressed_kv``) or E8M0
group scales (index keys, ``goldens.quant.quantize_index_key``), computed with FP32
floor / min / max arithmetic (pypto 0.2.0 has no FP4 dtype and misdecodes FP8 exponent 15).

The rule, per group of ``group`` channels with FP32 ``amax``:

* E4M3 scale: ``raw = min(max(amax / 6, 2^-9), 448)`` (FP32 division), stored as its E4M3
  code with round-to-nearest-even (:func:`v41.mx_encode.e4m3_codes`); the payload is
  divided by the DECODED scale value (FP32 division, like the golden).
* E8M0 scale: ``e = clamp(ceil(log2(amax / 6)), -9, 127)`` exact (a ``log`` estimate with
  the exact test ``3 < amax * 2^-e <= 6``); code ``e + 127``; payload ``x * 2^-e`` (exact).
* E2M1 code of ``v = clamp(x / scale, +-6)``: binade ``b = [a >= 2] + [a >= 4]`` of
  ``a = |v|``, magnitude code ``2b + rne(a * 2^(1-b))`` (the code steps inside a binade are
  ``2^(b-1)`` and every binade starts at an even code, so ties to the even integer are
  ties to the even code; a carry moves to the next binade by the same formula), capped at
  7; the sign bit from ``1 / v < 0`` (-0.0 and small negatives that round to zero give 8).
* Packing: element ``2i`` in the low nibble of byte ``i`` (``lo + 16 * hi``), the even
  and odd columns gathered with ``index_select`` (a 1-wide slice is not an aligned tile).

Every function takes the ``pypto`` module first and runs at trace time.
"""

import math

from v41.mx_decode import e4m3_parts
from v41.mx_encode import E4M3_MAX, E8M0_BIAS, e4m3_codes, pow2, rsub, step01

FP4_MAX = 6.0
RAW_FLOOR = 2.0 ** -9  # min(amax / 6): the E4M3 min subnormal
MIN_EXP = -9
INV_LN2 = 1.0 / math.log(2.0)
LOG2_FP4_MAX = math.log2(FP4_MAX)


def _rne(pypto, y):
    """Round FP32 ``y >= 0`` (a dyadic value below 2^22) to the nearest integer, ties to
    even, by floor arithmetic (exact)."""
    f = pypto.floor(y)
    frac = pypto.sub(y, f)
    ge_half = pypto.floor(pypto.mul(frac, 2.0))
    below = pypto.floor(rsub(pypto, 2.0, pypto.mul(frac, 2.0)))  # 2 - 2 frac
    gt_half = rsub(pypto, 1.0, pypto.minimum(below, 1.0))
    odd = pypto.sub(f, pypto.mul(pypto.floor(pypto.mul(f, 0.5)), 2.0))
    return pypto.add(pypto.add(f, gt_half), pypto.mul(pypto.sub(ge_half, gt_half), odd))


def e2m1_codes(pypto, v, *, toward_zero=False):
    """FP32 E2M1 codes (0..15) of FP32 ``v``: ``|v|`` clamped to 6, round to nearest with
    ties to the even code (``toward_zero``: truncation, a deliberately wrong variant)."""
    neg = step01(pypto, pypto.mul(pypto.reciprocal(v), -1.0), 64.0)  # 1/v < 0, -0.0 too
    a = pypto.minimum(pypto.abs(v), FP4_MAX)
    ge2 = pypto.minimum(pypto.floor(pypto.mul(a, 0.5)), 1.0)
    ge4 = pypto.minimum(pypto.floor(pypto.mul(a, 0.25)), 1.0)
    m = pypto.sub(rsub(pypto, 2.0, ge2), pypto.mul(ge4, 0.5))  # 2, 1, 0.5
    y = pypto.mul(a, m)  # exact, [0, 4)
    r = pypto.floor(y) if toward_zero else _rne(pypto, y)
    mag = pypto.minimum(pypto.add(pypto.mul(pypto.add(ge2, ge4), 2.0), r), 7.0)
    return pypto.add(mag, pypto.mul(neg, 8.0))


def e8m0_exponent(pypto, amax):
    """FP32 ``clamp(ceil(log2(amax / 6)), -9, 127)`` of FP32 ``amax >= 0`` (exact)."""
    est = pypto.ceil(pypto.sub(pypto.mul(pypto.log(amax), INV_LN2), LOG2_FP4_MAX))
    est = pypto.minimum(pypto.maximum(est, -127.0), 127.0)  # log(0) = -inf -> -127
    t = pypto.mul(amax, pow2(pypto, pypto.mul(est, -1.0)))  # exact
    # t > 6 -> one up; t <= 3 -> one down (FP32 ulps at 6 / 3 are 2^-21 / 2^-22)
    up = step01(pypto, pypto.sub(t, FP4_MAX), 2.0 ** 21)
    down = rsub(pypto, 1.0, step01(pypto, pypto.sub(t, FP4_MAX / 2), 2.0 ** 22))
    e = pypto.add(est, pypto.sub(up, down))
    return pypto.minimum(pypto.maximum(e, float(MIN_EXP)), 127.0)


def e4m3_scale(pypto, amax):
    """``(codes, values)`` FP32 of the E4M3 scale ``RNE(min(max(amax / 6, 2^-9), 448))``."""
    six = pypto.add(pypto.mul(amax, 0.0), FP4_MAX)
    raw = pypto.minimum(pypto.maximum(pypto.div(amax, six), RAW_FLOOR), E4M3_MAX)
    codes = e4m3_codes(pypto, raw, False)
    frac, expo = e4m3_parts(pypto, codes)
    values = pypto.mul(frac, pow2(pypto, pypto.sub(pypto.maximum(expo, 1.0), 7.0)))
    return codes, values


def pack_pairs(pypto, codes, rows, d, *, as_uint8=True):
    """uint8 ``[rows, d/2]`` bytes ``lo + 16 * hi`` of FP32 nibble codes ``[rows, d]``
    (their FP32 values when not ``as_uint8``)."""
    half = d // 2
    pypto.set_vec_tile_shapes(half)
    even = pypto.cast(pypto.mul(pypto.arange(0.0, float(half), 1.0), 2.0), pypto.DT_INT32)
    odd = pypto.add(even, 1)
    pypto.set_vec_tile_shapes(min(rows, 8), d)
    lo = pypto.index_select(codes, 1, even)
    hi = pypto.index_select(codes, 1, odd)
    pypto.set_vec_tile_shapes(min(rows, 8), half)
    packed = pypto.add(lo, pypto.mul(hi, 16.0))
    return pypto.cast(packed, pypto.DT_UINT8) if as_uint8 else packed


def quantize_tile(pypto, x, rows, valid, d, group, scale_format, *, toward_zero=False,
                  group_rows=64, rows4d=False):
    """``(packed uint8 [rows, d/2], scale codes uint8 [rows, d/group])`` of a BF16 (or FP32)
    tile whose first ``valid`` rows are real; ``scale_format`` ``"e4m3"`` or ``"e8m0"``.
    ``group_rows``: groups per vector tile of the per-group steps.  ``rows4d``: the byte
    values and scale codes left in FP32 as ``[rows, 1, 1, d/2]`` / ``[rows, 1, 1, d/group]``
    (a 4-D cache's row layout: each row leaves by one uint8 cast and one copy-out)."""
    if scale_format not in ("e4m3", "e8m0"):
        raise ValueError(f"scale_format: {scale_format!r} is not 'e4m3' or 'e8m0'")
    n = rows * d // group
    gpr = d // group
    pypto.set_vec_tile_shapes(min(rows, 8), d)
    xf = x if x.dtype == pypto.DT_FP32 else pypto.cast(x, pypto.DT_FP32)
    pypto.set_vec_tile_shapes(min(n, group_rows), group)
    xg = pypto.reshape(xf, [n, group], valid_shape=[valid * gpr, group])
    amax = pypto.amax(pypto.abs(xg), -1, keepdim=True)  # [n, 1]
    pypto.set_vec_tile_shapes(min(n, group_rows), 8)
    if scale_format == "e8m0":
        e = e8m0_exponent(pypto, amax)
        scode = pypto.add(e, float(E8M0_BIAS))
        pypto.set_vec_tile_shapes(min(n, group_rows), group)
        v = pypto.mul(xg, pow2(pypto, pypto.mul(e, -1.0)))  # exact: x / 2^e
    else:
        scode, scale = e4m3_scale(pypto, amax)
        pypto.set_vec_tile_shapes(min(n, group_rows), group)
        v = pypto.div(xg, pypto.expand_clone(scale, [n, group], valid_shape=[valid * gpr, group]))
    codes = e2m1_codes(pypto, v, toward_zero=toward_zero)
    pypto.set_vec_tile_shapes(min(rows, 8), d)
    codes = pypto.reshape(codes, [rows, d], valid_shape=[valid, d])
    packed = pack_pairs(pypto, codes, rows, d, as_uint8=not rows4d)
    if rows4d:
        half = d // 2
        pypto.set_vec_tile_shapes(min(rows, 8), 1, 1, half)
        packed = pypto.reshape(packed, [rows, 1, 1, half], valid_shape=[valid, 1, 1, half])
        pypto.set_vec_tile_shapes(min(rows, 8), 1, 1, max(gpr, 32))
        return packed, pypto.reshape(scode, [rows, 1, 1, gpr], valid_shape=[valid, 1, 1, gpr])
    pypto.set_vec_tile_shapes(min(rows, 8), gpr)
    scodes = pypto.cast(pypto.reshape(scode, [rows, gpr], valid_shape=[valid, gpr]), pypto.DT_UINT8)
    return packed, scodes
