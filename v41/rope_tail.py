"""Adjacent-pair RoPE of a head's rope tail inside a pypto kernel (trace-time helpers;
golden ``goldens.rope.apply_rope_tail`` / ``rotate_pairs``).

Each head's last ``rope_dim`` channels are pairs ``(re, im)`` rotated with the token's
``(cos, sin)`` row: forward ``(re c - im s, im c + re s)``, inverse with ``-s``; FP32
math, one BF16 cast.  The kernel form is ``x c' + x_swap s'`` with ``c'`` each pair's cos
repeated (``cos @ expand``), ``x_swap`` the pair-exchanged tail (``x @ swap``) and ``s'``
the signed sin -- the same two products and one add per channel as the golden, and the
0/1 matmuls are exact.  (Column gathers with ``index_select`` on dim 1 failed pypto
0.2.0's TuneSyncForVF pass in these kernels, hence the permutation matmuls.)
"""


def row_views(pypto, rope_cos, rope_sin, start, rows, valid):
    """``(cos_t, sin_t)``: the FP32 ``[rows, rope_dim / 2]`` prepared rope rows of the row
    tile at ``start`` (first ``valid`` rows real)."""
    half = rope_cos.shape[1]
    pypto.set_vec_tile_shapes(min(rows, 8), half)
    return (pypto.view(rope_cos, [rows, half], [start, 0], valid_shape=[valid, half]),
            pypto.view(rope_sin, [rows, half], [start, 0], valid_shape=[valid, half]))


def pair_columns(pypto, rope_dim):
    """FP32 ``(j, pair, odd)`` ``[rope_dim]``: each column's index, its pair ``j // 2`` and
    ``j % 2`` (1 on a pair's ``im``), from an iota with exact small-integer arithmetic."""
    pypto.set_vec_tile_shapes(rope_dim)
    j = pypto.arange(0.0, float(rope_dim), 1.0)
    pair = pypto.floor(pypto.mul(j, 0.5))
    return j, pair, pypto.sub(j, pypto.mul(pair, 2.0))


def pair_expansion(pypto, pair, rope_dim, tile_rows):
    """FP32 ``expand [half, rope_dim]``: 1 where ``pair[j] == i``, else 0 (``cos @ expand``
    repeats each pair's cos, exactly), on vector tiles of ``tile_rows`` rows."""
    half = rope_dim // 2
    pypto.set_vec_tile_shapes(half)
    i = pypto.arange(0.0, float(half), 1.0)
    pypto.set_vec_tile_shapes(tile_rows, rope_dim)
    return pypto.where(pypto.eq(pypto.expand_clone(pypto.reshape(i, [half, 1]), [half, rope_dim]),
                                pypto.expand_clone(pypto.reshape(pair, [1, rope_dim]),
                                                   [half, rope_dim])), 1.0, 0.0)


def rope_factors(pypto, rope_dim, *, inverse=True):
    """Constants of the adjacent-pair rotation of one head's rope tail (``rope_dim``
    channels, ``half`` pairs): ``(expand FP32 [half, rope_dim], swap BF16 [rope_dim,
    rope_dim], sign FP32 [1, rope_dim])``.  ``expand[i, j] = 1`` where ``j // 2 == i`` (so
    ``cos @ expand`` repeats each pair's cos, exactly); ``x @ swap`` exchanges each pair
    (``re <-> im``, exact); ``sign`` is the factor of ``sin`` on the swapped partner
    (inverse: +1 on ``re``, -1 on ``im``; forward the opposite).  Built in-kernel from an
    iota with exact small-integer FP32 arithmetic (column gathers fail pypto 0.2.0's
    TuneSyncForVF pass here)."""
    j, pair, odd = pair_columns(pypto, rope_dim)
    sgn = pypto.add(pypto.mul(odd, -2.0), 1.0)  # +1 re, -1 im
    partner = pypto.add(j, sgn)
    sign = sgn if inverse else pypto.mul(sgn, -1.0)
    expand = pair_expansion(pypto, pair, rope_dim, min(rope_dim // 2, 16))
    pypto.set_vec_tile_shapes(min(rope_dim, 16), rope_dim)
    rows = pypto.expand_clone(pypto.reshape(partner, [rope_dim, 1]), [rope_dim, rope_dim])
    cols = pypto.expand_clone(pypto.reshape(j, [1, rope_dim]), [rope_dim, rope_dim])
    swap = pypto.cast(pypto.where(pypto.eq(rows, cols), 1.0, 0.0), pypto.DT_BF16)
    return expand, swap, pypto.reshape(sign, [1, rope_dim])


def rotate_tail(pypto, tail, cos_t, sin_t, factors, rows, valid, rope_dim, tile_rows=16):
    """BF16 ``[rows, rope_dim]``: one head's rope tail ``tail`` BF16 rotated with the rows'
    ``cos_t``/``sin_t`` FP32 ``[rows, half]`` (see :func:`rope_factors`): ``x c + x_swap
    (+-s)`` in FP32, one BF16 cast -- the golden's ``re c - im s`` / ``im c + re s``
    operation for operation (the sign flip and the 0/1 matmuls are exact).  Vector tiles
    of ``tile_rows`` rows."""
    expand, swap, sign = factors
    cw, sw = expanded_rows(pypto, cos_t, sin_t, expand, rows, valid, tile_rows)
    xs = pypto.matmul(tail, swap, pypto.DT_FP32)
    pypto.set_vec_tile_shapes(min(rows, tile_rows), rope_dim)
    return rotate(pypto, pypto.cast(tail, pypto.DT_FP32), xs, cw, sw, sign)


def expanded_rows(pypto, cos_t, sin_t, expand, rows, valid, tile_rows=16, expand_sin=None):
    """FP32 ``(c', s')`` ``[rows, rope_dim]``: each pair's cos / sin of the rows repeated
    (``@ expand``, exact), from ``cos_t`` / ``sin_t`` FP32 ``[rows, half]``; with
    ``expand_sin`` (``expand`` times the rotation's sign, exact) ``s'`` carries the sign."""
    half = expand.shape[0]
    # re-view: a tensor entering a nested loop's function loses its valid shape
    pypto.set_vec_tile_shapes(min(rows, tile_rows), half)
    cos_v = pypto.view(cos_t, [rows, half], [0, 0], valid_shape=[valid, half])
    sin_v = pypto.view(sin_t, [rows, half], [0, 0], valid_shape=[valid, half])
    return (pypto.matmul(cos_v, expand, pypto.DT_FP32),
            pypto.matmul(sin_v, expand if expand_sin is None else expand_sin, pypto.DT_FP32))


def rotate(pypto, x32, xs, cw, sw, sign=None):
    """BF16 ``x c' + x_swap (s' sign)`` of the FP32 tail ``x32``, its pair-exchanged
    ``xs`` and :func:`expanded_rows`' ``(c', s')``: FP32 math, one BF16 cast (``sign``
    None: ``s'`` already carries it)."""
    ss = sw if sign is None else pypto.mul(sw, sign)
    return pypto.cast(pypto.add(pypto.mul(x32, cw), pypto.mul(xs, ss)), pypto.DT_BF16)
