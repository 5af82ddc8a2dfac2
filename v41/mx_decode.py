"""Arithmetic of the MX formats inside a pypto kernel (trace-time helpers): code values,
the byte tables the gathers read, and an arithmetic MXFP8 row decoder.

pypto 0.2.0 has no usable FP4 dtype, misdecodes FP8 exponent 15 and reads uint8 as signed
when casting, so caches and weights are carried as uint8 codes and decoded with FP32 floor
arithmetic (exact: every intermediate is a small integer or a dyadic fraction) or by a
gather from a table built that way (:func:`table_bytes`, :func:`e4m3_table`):

* E4M3 codes (:func:`e4m3_parts`, :func:`e4m3_values`), E2M1 nibbles (:func:`e2m1_values`),
  E8M0 powers of two (:func:`e8m0_pow2`);
* :func:`window_rows`: MXFP8 rows (E4M3 codes x E8M0 scale per group) from ``[rows, d]``
  tiles, for the column-block weight tiles of :mod:`v41.mx_linear` (whole rows of a cache
  or a weight go through :mod:`v41.kv_decode` / ``mx_linear.whole_row_steps``).

The powers of two are ``exp(x*ln2)`` (the cost model has no ``exp2`` pipe); a decoded
product has at most 6 significant bits, so the caller's BF16 cast rounds the ``exp`` error
away and the values equal the golden's FP32 dequantization.

Golden: ``goldens.quant.dequantize_window_kv`` / ``dequantize_fp8_weight``.
"""

import math

LN2 = math.log(2.0)
TABLE_SPAN = 384  # entries of a byte table: a code read as signed or unsigned, plus 128
SCALE_TILE = 2048  # 1-D tile of the per-group scale codes at most (8 KB FP32)
GROUP_TILE_ELEMS = 16384  # [rows, group] tile of the per-group scale step (64 KB FP32)


def _scale_tiles(pypto, n):
    """Vector tiles for the ``[n]`` scale codes of a key tile: at least two pieces.  One
    piece the size of the scale-byte gather fuses with it, and pypto 0.2.0's
    TuneSyncForVF pass then fails (``Cannot find GATHER in PIPE_MTE2``) at TINY."""
    pypto.set_vec_tile_shapes(max(min(n // 2, SCALE_TILE), 16))


def _group_tiles(pypto, n, group, pieces=1):
    """Vector tiles for a ``[n, group]`` per-group step: as many groups per tile as fit
    :data:`GROUP_TILE_ELEMS`, split in at least ``pieces`` tiles (a row tile's ``[16, d]``
    shape would cut it into ``[16, group]`` pieces, thousands of tiny vector tasks per key
    tile at FLASH)."""
    pypto.set_vec_tile_shapes(min(GROUP_TILE_ELEMS // group, max(n // pieces, 16)), group)


def byte_mod(pypto, v):
    """``v mod 256`` of FP32 integers ``v`` (exact floor arithmetic)."""
    return pypto.sub(v, pypto.mul(pypto.floor(pypto.mul(v, 1.0 / 256.0)), 256.0))


def unsigned_codes(pypto, codes):
    """FP32 0..255 of uint8 ``codes`` (the interpreter casts uint8 as signed)."""
    return byte_mod(pypto, pypto.cast(codes, pypto.DT_FP32))


def table_bytes(pypto, span):
    """FP32 ``[span]``: entry ``k`` holds the byte ``(k - 128) mod 256``.  A decode table
    built over it is indexed at ``code + 128`` whether a uint8 code is read as signed
    (-128..127, as the interpreter casts uint8) or unsigned (0..255, as a card does)."""
    pypto.set_vec_tile_shapes(span)
    return byte_mod(pypto, pypto.sub(pypto.arange(0.0, float(span), 1.0), 128.0))


def e8m0_pow2(pypto, codes):
    """FP32 ``2^(s - 127)`` of uint8 E8M0 ``codes`` read signed or unsigned, in the
    caller's vector tiles.  The wrap to 0..255 adds ``-256 * floor(c / 256)`` (the cost
    model charges a tensor SUB about 4x an ADD).  The ``exp`` estimate of the power is
    rounded away by the caller's BF16 cast of an exact product."""
    c = pypto.cast(codes, pypto.DT_FP32)
    c = pypto.add(c, pypto.mul(pypto.floor(pypto.mul(c, 1.0 / 256.0)), -256.0))
    return pypto.exp(pypto.mul(pypto.sub(c, 127.0), LN2))


def e4m3_parts(pypto, v):
    """``(frac, expo)`` of FP32 E4M3 codes 0..255: value = ``frac * 2^(max(expo,1) - 7)``
    with ``frac = (1-2s) * (min(e,1) + m/8)`` (NaN codes are never published)."""
    sign = pypto.floor(pypto.mul(v, 1.0 / 128.0))
    rest = pypto.sub(v, pypto.mul(sign, 128.0))
    expo = pypto.floor(pypto.mul(rest, 1.0 / 8.0))
    mant = pypto.sub(rest, pypto.mul(expo, 8.0))
    frac = pypto.mul(pypto.add(pypto.minimum(expo, 1.0), pypto.mul(mant, 0.125)),
                     pypto.add(pypto.mul(sign, -2.0), 1.0))
    return frac, expo


def e4m3_values(pypto, v):
    """FP32 E4M3 values of FP32 codes ``v`` (0..255): ``frac * 2^(max(expo, 1) - 7)``, the
    power by ``exp`` (rounded away by the caller's BF16 cast of an exact product)."""
    frac, expo = e4m3_parts(pypto, v)
    return pypto.mul(frac, pypto.exp(pypto.mul(pypto.sub(pypto.maximum(expo, 1.0), 7.0), LN2)))


def e4m3_table(pypto):
    """FP32 ``[384]``: entry ``k`` is the E4M3 value of code ``(k - 128) mod 256`` (a code
    read as signed or unsigned indexes its entry at ``code + 128``; the NaN codes, never
    published, get a finite value).  Build it once, before the loops."""
    return e4m3_values(pypto, table_bytes(pypto, TABLE_SPAN))


def e2m1_values(pypto, c):
    """FP32 E2M1 values of FP32 nibble codes ``c`` (0..15; bit 3 = sign): the magnitude
    code ``r`` gives 0, .5, 1, 1.5, 2, 3, 4, 6 = ``r/2 + max(r-4,0)/2 + max(r-6,0)``."""
    sign = pypto.floor(pypto.mul(c, 0.125))
    r = pypto.sub(c, pypto.mul(sign, 8.0))
    mag = pypto.add(pypto.add(pypto.mul(r, 0.5),
                              pypto.mul(pypto.maximum(pypto.sub(r, 4.0), 0.0), 0.5)),
                    pypto.maximum(pypto.sub(r, 6.0), 0.0))
    return pypto.mul(mag, pypto.add(pypto.mul(sign, -2.0), 1.0))


def window_rows(pypto, codes, scale_codes, tile, d, group, row_tile, pieces=1):
    """BF16 ``[tile, d]`` rows from uint8 E4M3 codes ``[tile, d]`` and uint8 E8M0 codes
    ``[tile * d / group]`` (flat, row-major).  The row steps run in the caller's vector tile
    ``row_tile`` (``(rows, cols)``, set again before the cast); the per-group scale steps
    run in large tiles (at least ``pieces`` of them)."""
    frac, expo = e4m3_parts(pypto, unsigned_codes(pypto, codes))
    e_lo = pypto.maximum(expo, 1.0)
    n = tile * d // group
    _scale_tiles(pypto, n)
    c = unsigned_codes(pypto, scale_codes)  # [n]
    # 2^(max(e,1) - 7) * 2^(c - 127) as one exp over [n, group], c broadcast per group
    _group_tiles(pypto, n, group, pieces)
    e_g = pypto.reshape(e_lo, [n, group])
    c_g = pypto.reshape(c, [n, 1])
    pw = pypto.exp(pypto.mul(pypto.add(e_g, pypto.sub(c_g, 134.0)), LN2))
    val = pypto.mul(pypto.reshape(frac, [n, group]), pw)
    pypto.set_vec_tile_shapes(*row_tile)
    return pypto.cast(pypto.reshape(val, [tile, d]), pypto.DT_BF16)
