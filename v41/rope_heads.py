"""Per-head query projections with their rope tails rotated, inside a pypto kernel
(trace-time helpers shared by the query kernels: :mod:`v41.qkv_proj_rope`,
:mod:`v41.index_query`)."""

from v41 import mx_decode, mx_linear, rope_tail
from v41.subgraph import one_subgraph

MX_ROWS = 4  # tokens per MX activation tile, one task ([4, 5120] FP32 tiles compile)
GROUP_TILE = 160  # 32-element groups per vector tile of the MX steps (20 KB FP32)
CLONE_ROWS = 64  # rows per vector tile of a row tile's join copy and of its clones


def mx_activation_rows(pypto, x32, rows, valid, k):
    """:func:`v41.mx_linear.mx_activation_bf16` in ``[GROUP_TILE, 32]`` group tiles instead
    of ``[64, 32]`` (a one-task ``[4, 5120]`` tile: 4 tile steps per operation instead of
    10; FLASH TP4 qkv_proj_rope T=192 349 -> 320 us; ``[320, 32]`` tiles failed the
    simulation)."""
    return mx_linear.mx_activation_bf16(pypto, x32, rows, valid, k, group_tile_rows=GROUP_TILE)


def _mx_piece(pypto, x, xq, row, valid, k):
    """``xq[row : row + valid] = MX(x[row : row + valid])`` for one ``MX_ROWS``-token piece
    of the BF16 DDR tensor ``x [*, k]`` (:func:`mx_activation_rows`; the caller makes it
    one task)."""
    pypto.set_vec_tile_shapes(MX_ROWS, mx_linear.cols(k))
    x32 = pypto.cast(pypto.view(x, [MX_ROWS, k], [row, 0], valid_shape=[valid, k]),
                     pypto.DT_FP32)
    xr = mx_activation_rows(pypto, x32, MX_ROWS, valid, k)
    pypto.set_vec_tile_shapes(MX_ROWS, mx_linear.cols(k))
    pypto.assemble(pypto.view(xr, [MX_ROWS, k], [0, 0], valid_shape=[valid, k]), [row, 0], xq)


def mx_row_tile(pypto, x, xq, start, rows, valid):
    """``xq[start : start + valid] = MX(x[start : start + valid])`` for one row tile of
    ``rows`` tokens (``valid`` real) of the BF16 DDR tensors ``x``, ``xq [*, k]``; returns
    the same BF16 rows as a ``[rows, k]`` tile for the row tile's products
    (:func:`row_tile_pieces` of :func:`_mx_piece`)."""
    k = x.shape[1]
    return row_tile_pieces(pypto, xq, start, rows, valid,
                           lambda row, v: _mx_piece(pypto, x, xq, row, v, k))


def row_tile_pieces(pypto, out, start, rows, valid, piece):
    """Call ``piece(row, valid)`` for ``MX_ROWS``-token pieces covering rows ``start ..
    start + valid - 1`` of one row tile, unrolled at trace time, each ONE task that writes
    its rows of the BF16 DDR tensor ``out [*, k]``; then ONE task in the same root function
    (the compiler's exact edges: it waits for every piece) copies the tile's rows of ``out``
    (times 1.0, exact) into the returned ``[rows, k]`` tile, which a product in a nested
    loop waits for through one edge (reading ``out`` itself, whose rows are a dynamic axis,
    a later root function gets an edge from one piece's writer only).  A piece's start is
    clamped to ``valid - MX_ROWS`` (0 when fewer): pieces past the real rows rewrite the
    last piece's rows with the same bytes."""
    k = out.shape[1]
    for u in range(rows // MX_ROWS):  # unrolled at trace time
        with one_subgraph(pypto):
            lo = (valid - MX_ROWS).max(0).min(u * MX_ROWS)
            piece(start + lo, (valid - lo).min(MX_ROWS))
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(min(rows, CLONE_ROWS), mx_linear.cols(k))
        return pypto.mul(pypto.view(out, [rows, k], [start, 0], valid_shape=[valid, k]), 1.0)


def store_rope_head(pypto, y_bf16, out, start, col, rows, valid, cos_t, sin_t, factors,
                    head_dim, rope_dim, tile_rows=16):
    """Write one head ``y_bf16 [rows, head_dim]`` (first ``valid`` rows real) to ``out`` at
    ``[start, col]``: the NoPE channels as they are, the rope tail (the last ``rope_dim``
    channels) rotated with :func:`v41.rope_tail.rotate_tail`, on vector tiles of
    ``tile_rows`` rows.  A head that is all rope (``head_dim == rope_dim``) has no NoPE
    write."""
    nope = head_dim - rope_dim
    if nope < 0:
        raise ValueError(f"head_dim: {head_dim} is narrower than rope_dim {rope_dim}")
    if nope:
        pypto.set_vec_tile_shapes(min(rows, tile_rows), head_dim)
        pypto.assemble(pypto.view(y_bf16, [rows, nope], [0, 0], valid_shape=[valid, nope]),
                       [start, col], out)
    pypto.set_vec_tile_shapes(min(rows, tile_rows), head_dim)
    tail = pypto.view(y_bf16, [rows, rope_dim], [0, nope], valid_shape=[valid, rope_dim])
    rot = rope_tail.rotate_tail(pypto, tail, cos_t, sin_t, factors, rows, valid, rope_dim,
                                tile_rows=tile_rows)
    pypto.set_vec_tile_shapes(min(rows, tile_rows), rope_dim)
    pypto.assemble(pypto.view(rot, [rows, rope_dim], [0, 0], valid_shape=[valid, rope_dim]),
                   [start, col + nope], out)


def tile_product(pypto, a, start, rows, valid, w_tile, n, k, tile_rows):
    """FP32 ``[rows, n]``: :func:`v41.mx_linear.rows_times_tile` (the K partials added in
    K order, the same operations) with the adds on ``tile_rows``-row vector tiles instead
    of 16: each tile costs its operands' ~1.5 k-cycle DDR copy-ins, and the 16-row adds
    made each qkv_proj_rope head tile a 76 k-cycle task at FLASH T=192."""
    acc = None
    for mm in mx_linear.k_partials(pypto, a, start, rows, valid, w_tile, n, k):
        pypto.set_vec_tile_shapes(min(rows, tile_rows), n)
        acc = mm if acc is None else pypto.add(acc, mm)
    return acc


def head_rows(pypto, a, wts, out, start, rows, valid, h, head_dim, k, rope_cos, rope_sin,
              factors, rope_dim, tile_rows):
    """``out[start : start + valid, h * head_dim ...] = [RoPE([a @ W_h^T])]`` from head
    ``h``'s decoded tiles ``wts`` and the BF16 MX activation tile ``a [rows, k]``
    (:func:`project_heads_tile`'s per-head body; the last tile holds the rope tail)."""
    width = head_dim // len(wts)
    for c, wt in enumerate(wts):
        y = tile_product(pypto, a, 0, rows, valid, wt, width, k, tile_rows or 16)
        pypto.set_vec_tile_shapes(min(rows, tile_rows or 8), width)
        yb = pypto.cast(y, pypto.DT_BF16)
        col = h * head_dim + c * width
        if c == len(wts) - 1:
            cos_t, sin_t = rope_tail.row_views(pypto, rope_cos, rope_sin, start, rows, valid)
            store_rope_head(pypto, yb, out, start, col, rows, valid, cos_t, sin_t, factors,
                            width, rope_dim, tile_rows=tile_rows or 16)
        else:
            pypto.assemble(pypto.view(yb, [rows, width], [0, 0], valid_shape=[valid, width]),
                           [start, col], out)


def project_heads_tile(pypto, a, w, w_scale, out, start, rows, valid, heads, head_dim, k,
                       rope_cos, rope_sin, factors, rope_dim, n_tile, name, *, tile_rows=None,
                       scale_up=False, clone_rows=False):
    """``out[start : start + valid, h * head_dim ...] = [RoPE([a @ W_h^T])]`` for each head
    ``h`` of the FP8 weight ``W`` (``head_dim`` rows per head, uint8 E4M3 codes, E8M0 32x32
    scales; ``scale_up``: every block scale one binade too large, a wrong variant) over ONE
    row tile ``a [rows, k]`` of BF16 MX activations (first ``valid`` rows real; a tile, e.g.
    :func:`mx_row_tile`'s, written before this loop in the caller's row iteration): a
    ``pypto.loop`` over heads, each head's ``n_tile``-row tiles decoded in its iteration and
    applied to the tile, so every product is in the same root function as its decode and
    waits for ``a``'s one writer; the head's last tile holds its whole rope tail
    (``rope_dim <= n_tile``).  A launch of several row tiles decodes every head once per
    row tile.  ``tile_rows``: rows of the vector tiles after the product (the K partial
    sums, the BF16 cast, the rope tail, the stores); None keeps 16-row sums, 8-row casts
    and 16-row rope tiles.  ``clone_rows``: each head first copies ``a`` (times 1.0, exact)
    and its products read the copy, so ``a``'s writers resolve one successor edge per head
    and copy tile instead of one per product task (each ~390 AICPU cycles, serial)."""
    width = mx_linear.tile_width(head_dim, n_tile)
    if rope_dim > width:
        raise ValueError(f"rope_dim: {rope_dim} exceeds the head tile {width} (the rope tail "
                         f"must lie in a head's last tile)")
    table = mx_decode.e4m3_table(pypto)
    for h in pypto.loop(heads, name=name, idx_name="h"):
        wts = [mx_linear.mx_weight_tile_bf16(pypto, w, w_scale, h * head_dim + c * width, 0,
                                             width, k, scale_up=scale_up, table=table)
               for c in range(head_dim // width)]
        src = a
        if clone_rows:
            pypto.set_vec_tile_shapes(min(rows, CLONE_ROWS), k)
            src = pypto.mul(a, 1.0)
        head_rows(pypto, src, wts, out, start, rows, valid, h, head_dim, k, rope_cos, rope_sin,
                  factors, rope_dim, tile_rows)
