"""Trace-time MX encoders shared by the v41 kernels that publish or consume quantized
values: the E8M0 group scale and E4M3 codes of the golden's MXFP8 rule, computed with FP32
floor / min / max arithmetic (pypto 0.2.0's FP32->E4M3 cast disagrees with
round-to-nearest-even on this interpreter and it misdecodes exponent 15).  The rule
(``goldens.quant.quantize_window_kv``):

* E8M0 exponent ``e = clamp(ceil(log2(amax / 448)), -127, 127)``, exact: an estimate from
  ``log`` corrected by the exact test ``224 < amax * 2^-e <= 448``; ``amax = 0`` gives
  -127.  Scale code ``e + 127``.
* powers of two ``2^k`` are ``exp(k ln2)`` cast to BF16 and back (exact; the cost model
  has no pipe for ``exp2``);
* ``v = x * 2^-e`` (``|v| <= 448``), ``a = |v|``; the E4M3 binade ``k = max(floor(log2
  a), -6)`` (a ``log`` estimate with an exact correction), ``y = a * 2^(3-k)`` in [0, 16)
  rounded to an integer with ties to even (``(y + 2^23) - 2^23`` in FP32), magnitude code
  ``min(8 (k + 6) + round(y), 126)`` (saturation at 448; a rounding carry to 16 moves to
  the next binade by the same formula; subnormals are ``k = -6``);
* the sign bit from ``1 / v < 0``, so -0.0 and small negatives that round to zero give
  0x80 like the torch cast.

Every function takes the ``pypto`` module first and runs at trace time (module-level
helpers may return tensors; a ``def`` nested in a jit body may not).  Decoders are in
:mod:`v41.mx_decode`.
"""

import math

E4M3_MAX = 448.0
E4M3_MAX_CODE = 126  # 0x7E = 448; 0x7F is NaN
E8M0_BIAS = 127
LN2 = math.log(2.0)
INV_LN2 = 1.0 / LN2
LOG2_E4M3_MAX = math.log2(E4M3_MAX)


def pow2(pypto, k):
    """Exact FP32 ``2^k`` of an FP32 integer tensor ``k`` in [-127, 127] (module-level:
    runs at trace time)."""
    p = pypto.exp(pypto.mul(k, LN2))
    return pypto.cast(pypto.cast(p, pypto.DT_BF16), pypto.DT_FP32)


def pow2_neg(pypto, k):
    """``pow2(pypto, k * -1)`` in one op fewer: ``exp(k * -ln2)`` is ``exp(-k * ln2)`` bit
    for bit (FP32 negation is exact and rounding is symmetric)."""
    p = pypto.exp(pypto.mul(k, -LN2))
    return pypto.cast(pypto.cast(p, pypto.DT_BF16), pypto.DT_FP32)


def rsub(pypto, c, x):
    """``c - x`` for a Python float ``c`` (``pypto.sub`` takes the tensor first)."""
    return pypto.add(pypto.mul(x, -1.0), c)


def step01(pypto, x, ulp_inv):
    """``1.0`` where ``x > 0`` else ``0.0``, for ``x`` that is 0 or at least ``1/ulp_inv``
    in magnitude (exact)."""
    return pypto.clip(pypto.floor(pypto.mul(x, ulp_inv)), 0.0, 1.0)


def scale_exponent(pypto, amax):
    """FP32 ``clamp(ceil(log2(amax / 448)), -127, 127)`` of FP32 ``amax >= 0`` (exact)."""
    est = pypto.ceil(pypto.sub(pypto.mul(pypto.log(amax), INV_LN2), LOG2_E4M3_MAX))
    est = pypto.minimum(pypto.maximum(est, -127.0), 127.0)  # log(0) = -inf -> -127
    t = pypto.mul(amax, pow2_neg(pypto, est))  # exact
    # t > 448 -> one up; t <= 224 -> one down (FP32 ulps at 448 / 224 are 2^-15 / 2^-16)
    up = step01(pypto, pypto.sub(t, E4M3_MAX), 32768.0)
    not_down = step01(pypto, pypto.sub(t, E4M3_MAX / 2), 65536.0)  # 1 - down
    # est + up - down = est + up + not_down - 1: small integers, exact in any order (no
    # tensor-tensor SUB: the cost model charges it ~4x a MUL)
    e = pypto.add(pypto.add(est, up), pypto.add(not_down, -1.0))
    return pypto.minimum(pypto.maximum(e, -127.0), 127.0)


def e4m3_codes(pypto, v, truncate):
    """FP32 E4M3 codes (0..255) of FP32 ``v`` with ``|v| <= 448`` expected: round to
    nearest even (or truncation for the wrong variant), saturation at 448.

    The floor arithmetic of the module doc in fewer and cheaper vector ops, with the same
    bits (the cost model charges a tensor-tensor SUB ~4x a MUL; none is used): the binade
    correction ``min(floor(r / 2), 1) + min(floor(r), 1)`` is ``floor(min(r, 2))`` for any
    ``r >= 0``, integers are summed in any order (exact), ``2^-k`` is :func:`pow2_neg`, and
    ``y`` in [0, 16) is rounded to nearest even by ``(y + 2^23) - 2^23`` (FP32 addition at
    unit spacing, exact)."""
    a = pypto.abs(v)
    # 128 where 1/v < 0 (-0.0 too), else 0: |448 / v| >= 1 for |v| <= 448 (checked for every
    # FP32 v in [-448, -447]), so 128 * 448 / v is 0 or 128 after the clip
    neg128 = pypto.clip(pypto.mul(pypto.reciprocal(v), -E4M3_MAX * 128.0), 0.0, 128.0)
    a_eff = pypto.maximum(a, 2.0 ** -6)  # the subnormal binade shares k = -6
    k0 = pypto.floor(pypto.mul(pypto.log(a_eff), INV_LN2))
    r = pypto.mul(a_eff, pow2_neg(pypto, k0))  # [0.5, 4) when k0 is +-1 off
    k1 = pypto.add(k0, pypto.floor(pypto.minimum(r, 2.0)))  # the binade k, plus 1
    y = pypto.mul(a, pow2_neg(pypto, pypto.add(k1, -4.0)))  # a * 2^(3 - k), exact, [0, 16)
    if truncate:
        rounded = pypto.floor(y)
    else:
        rounded = pypto.sub(pypto.add(y, 8388608.0), 8388608.0)  # RNE to an integer
    # magnitude 8 (k + 6) + rounded = 8 k1 + 40 + rounded
    mag = pypto.minimum(pypto.add(pypto.add(pypto.mul(k1, 8.0), 40.0), rounded),
                        float(E4M3_MAX_CODE))
    return pypto.add(mag, neg128)


ACTIVATION_AMAX_FLOOR = 1e-4  # goldens.quant.quantize_mxfp8_activation: amax >= 1e-4


def activation_group_codes(pypto, xg, n, group, tile_rows=64):
    """``(codes, e)`` of FP32 groups ``xg [n, group]`` under the ACTIVATION rule
    (``goldens.quant.quantize_mxfp8_activation``): as :func:`quantize_tile` but with the
    group ``amax`` floored at 1e-4 (FP32) before the scale exponent.  ``codes`` FP32 E4M3
    codes 0..255 ``[n, group]`` (round to nearest even), ``e`` FP32 ``[n, 1]`` (scale
    ``2^e``).  Vector tiles are ``tile_rows`` groups; leaves the vector tile shapes at
    ``(min(n, tile_rows), group)``."""
    t = min(n, tile_rows)
    pypto.set_vec_tile_shapes(t, group)
    amax = pypto.amax(pypto.abs(xg), -1, keepdim=True)  # [n, 1]
    pypto.set_vec_tile_shapes(t, 8)
    e = scale_exponent(pypto, pypto.maximum(amax, ACTIVATION_AMAX_FLOOR))
    inv_scale = pow2_neg(pypto, e)
    pypto.set_vec_tile_shapes(t, group)
    return e4m3_codes(pypto, pypto.mul(xg, inv_scale), False), e


def group_codes(pypto, x, rows, valid, d, group, *, truncate=False, scale_shift=0.0):
    """FP32 ``(codes [rows * d / group, group], scale codes [rows * d / group, 1])`` of a BF16
    tile ``[rows, d]`` whose first ``valid`` rows are real: E4M3 codes 0..255 of ``x / 2^e``
    and E8M0 codes ``e + 127`` per group (module-level: runs at trace time)."""
    n = rows * d // group
    gpr = d // group  # groups per row
    pypto.set_vec_tile_shapes(min(rows, 8), d)
    xf = pypto.cast(x, pypto.DT_FP32)
    pypto.set_vec_tile_shapes(min(n, 128), group)
    xg = pypto.reshape(xf, [n, group], valid_shape=[valid * gpr, group])
    amax = pypto.amax(pypto.abs(xg), -1, keepdim=True)  # [n, 1]
    # the [n, 1] scale steps in few tall tiles (per-op cost, not lanes, dominates there);
    # FLASH window_publish T=4096 (592 groups a task): 64-row scale / group tiles 66.0 us,
    # 1,024 / 64 59.9 us, 1,024 / 128 57.5 us
    pypto.set_vec_tile_shapes(min(n, 1024), 8)
    e = scale_exponent(pypto, amax)
    inv_scale = pow2_neg(pypto, e)
    scode = pypto.add(e, float(E8M0_BIAS) + scale_shift)
    pypto.set_vec_tile_shapes(min(n, 128), group)
    v = pypto.mul(xg, inv_scale)  # exact: x / 2^e
    return e4m3_codes(pypto, v, truncate), scode


def quantize_tile(pypto, x, rows, valid, d, group, *, truncate=False, scale_shift=0.0):
    """``(codes uint8 [rows, d], scale codes uint8 [rows, d / group])`` of a BF16 tile whose
    first ``valid`` rows are real (:func:`group_codes`, cast; module-level: runs at trace
    time)."""
    gpr = d // group  # groups per row
    codes, scode = group_codes(pypto, x, rows, valid, d, group, truncate=truncate,
                               scale_shift=scale_shift)
    pypto.set_vec_tile_shapes(min(rows, 8), d)
    codes = pypto.cast(pypto.reshape(codes, [rows, d], valid_shape=[valid, d]), pypto.DT_UINT8)
    pypto.set_vec_tile_shapes(min(rows, 8), gpr)
    scodes = pypto.cast(pypto.reshape(scode, [rows, gpr], valid_shape=[valid, gpr]), pypto.DT_UINT8)
    return codes, scodes
