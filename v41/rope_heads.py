"""Per-head query projections with their rope tails rotated, and a row tile's MXFP8
activation by column blocks, inside a pypto kernel (trace-time helpers shared by
:mod:`v41.qkv_proj_rope`, :mod:`v41.index_query` and, for the activation,
:mod:`v41.shared_expert`)."""

from v41 import mx_decode, mx_linear, rope_tail
from v41.subgraph import one_subgraph

# 32-element groups per vector tile of the MX steps (20 KB FP32; [64, 32] tiles took 2.5x
# the tile steps, [320, 32] tiles failed the simulation)
GROUP_TILE = 160
CLONE_ROWS = 64  # rows per vector tile of a row tile's join copy and of its clones


def _mx_columns(pypto, x, xq, start, col, rows, valid, width):
    """``xq[start : start + valid, col : col + width] = MX(x[...])`` for one column block of
    one row tile as ONE task on one ``[rows, width]`` vector tile (MX groups are 32
    channels of one row, so a column block quantizes exactly as the whole row does)."""
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(rows, width)
        x32 = pypto.cast(pypto.view(x, [rows, width], [start, col],
                                    valid_shape=[valid, width]), pypto.DT_FP32)
        xr = mx_linear.mx_activation_bf16(pypto, x32, rows, valid, width,
                                          group_tile_rows=GROUP_TILE, vec_rows=rows)
        pypto.set_vec_tile_shapes(rows, width)
        # times 1.0 (exact): the write stays in this task instead of a copy task of its own
        pypto.assemble(pypto.mul(xr, 1.0), [start, col], xq)


def column_block(k, rows, elems, least):
    """Channels per column block of a row tile's MX activation (:func:`mx_rows`): about
    ``elems`` elements (``rows`` x channels), at least ``least``, at most one K view of the
    products (:func:`v41.mx_linear.k_chunk`), a multiple of 32 dividing ``k``.  Narrow
    blocks spread a wide row tile over more tasks; wide ones give a short tile fewer tasks
    and its readers fewer edges."""
    return mx_linear.k_chunk(k, max(least, elems // rows))


def column_blocks(pypto, n, name):
    """The column block indices ``0 .. n - 1``: a ``pypto.loop`` named ``name`` (one root
    function per block), or, ``name`` None, a range unrolled at trace time in the caller's
    root function."""
    return range(n) if name is None else pypto.loop(n, name=name, idx_name="c")


def mx_rows(pypto, x, xq, start, rows, valid, width, name):
    """``xq[start : start + valid] = MX(x[start : start + valid])`` for one row tile of
    ``rows`` tokens (``valid`` real) of the BF16 DDR tensors ``x``, ``xq [*, k]``: a nested
    ``pypto.loop`` ``name`` over ``width``-channel column blocks, each block written by
    ONE task (:func:`_mx_columns`).  Columns are a static dim, one cell per block, so code
    after the loop in the same row iteration gets an edge from the writer of every block it
    reads.  ``name`` None: the same blocks unrolled at trace time in the caller's root
    function (exact edges there, one writer per cell after it), for launches of several
    row tiles, where each row tile's nested iterations add root functions to a stitched
    submission (at most 128 loop functions each).  Neither traces more for more
    ``rows`` (the loop traces one block, unrolled ``k / width``)."""
    for c in column_blocks(pypto, x.shape[1] // width, name):
        _mx_columns(pypto, x, xq, start, c * width, rows, valid, width)


def mx_row_tile(pypto, x, xq, start, rows, valid, width, name):
    """``xq[start : start + valid] = MX(x[start : start + valid])`` for one row tile of
    ``rows`` tokens (``valid`` real) of the BF16 DDR tensors ``x``, ``xq [*, k]``; returns
    the same BF16 rows as a ``[rows, k]`` tile for the row tile's products: :func:`mx_rows`
    (``name``: its column loop, None unrolled), then ONE task (waiting for every column
    block's writer) copies the rows (times 1.0, exact) into the returned tile, which a
    product in a later nested loop waits for through one edge.  The copy's vector tiles are
    the clones' (``[CLONE_ROWS, k]``, :func:`project_heads_tile`): a reader in another root
    function gets one successor edge per overlapping tile pair, and ``[64, 1024]`` +
    ``[64, 256]`` tiles gave each FLASH ``index_query`` clone 8 (257 on one join task)."""
    k = x.shape[1]
    mx_rows(pypto, x, xq, start, rows, valid, width, name)
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(min(rows, CLONE_ROWS), k)
        return pypto.mul(pypto.view(xq, [rows, k], [start, 0], valid_shape=[valid, k]), 1.0)


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


def decode_rows(pypto, w, w_scale, n0, n_tile, k, *, scale_up=False):
    """BF16 ``[n_tile, k]``: whole rows ``n0 .. n0 + n_tile`` of the FP8 weight ``w`` (all
    of its ``k`` columns) decoded as ONE task that builds its own E4M3 table and gathers
    its scale rows (:func:`v41.mx_linear.mx_weight_tile_bf16` with ``one_task``; the same
    exact values): the task has no predecessor, so it is in the ready queue when the
    launch starts instead of behind a table task and a scale-row task."""
    with one_subgraph(pypto):
        table = mx_decode.e4m3_table(pypto)
        return mx_linear.mx_weight_tile_bf16(pypto, w, w_scale, n0, 0, n_tile, k,
                                             scale_up=scale_up, table=table, one_task=True)


def project_heads_tile(pypto, a, w, w_scale, out, start, rows, valid, heads, head_dim, k,
                       rope_cos, rope_sin, factors, rope_dim, n_tile, name, *, tile_rows=None,
                       scale_up=False, clone_rows=False, head_table=False, own_decode=False):
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
    and copy tile instead of one per product task (each ~390 AICPU cycles, serial).
    ``head_table``: each head builds its own E4M3 table (:func:`v41.mx_decode.e4m3_table`,
    one small task whose successors are that head's decodes) instead of one table before
    the loop with every head's decodes as successors.  ``own_decode``: each tile decoded by
    ONE task with its own table and scale rows (:func:`decode_rows`), ready at the launch's
    start (``head_table`` then unused)."""
    width = mx_linear.tile_width(head_dim, n_tile)
    if rope_dim > width:
        raise ValueError(f"rope_dim: {rope_dim} exceeds the head tile {width} (the rope tail "
                         f"must lie in a head's last tile)")
    table = None if head_table or own_decode else mx_decode.e4m3_table(pypto)
    for h in pypto.loop(heads, name=name, idx_name="h"):
        if own_decode:
            wts = [decode_rows(pypto, w, w_scale, h * head_dim + c * width, width, k,
                               scale_up=scale_up) for c in range(head_dim // width)]
        else:
            if head_table:
                table = mx_decode.e4m3_table(pypto)
            wts = [mx_linear.mx_weight_tile_bf16(pypto, w, w_scale, h * head_dim + c * width,
                                                 0, width, k, scale_up=scale_up, table=table)
                   for c in range(head_dim // width)]
        src = a
        if clone_rows:
            pypto.set_vec_tile_shapes(min(rows, CLONE_ROWS), k)
            src = pypto.mul(a, 1.0)
        head_rows(pypto, src, wts, out, start, rows, valid, h, head_dim, k, rope_cos, rope_sin,
                  factors, rope_dim, tile_rows)
