"""Per-head query projections with their rope tails rotated, inside a pypto kernel
(trace-time helpers shared by the query kernels: :mod:`v41.qkv_proj_rope`,
:mod:`v41.index_query`)."""

from v41 import mx_decode, mx_linear, rope_tail
from v41.subgraph import one_subgraph

MX_ROWS = 4  # tokens per MX activation tile, one task ([4, 5120] FP32 tiles compile)
MX_TILES = 8  # such tiles per loop iteration, unrolled (fewer stitched loop iterations)
GROUP_TILE = 160  # 32-element groups per vector tile of the MX steps (20 KB FP32)
CLONE_ROWS = 64  # rows per vector tile of project_heads' activation copy (one edge each)


def mx_activation_rows(pypto, x32, rows, valid, k):
    """:func:`v41.mx_linear.mx_activation_bf16` in ``[GROUP_TILE, 32]`` group tiles instead
    of ``[64, 32]`` (a one-task ``[4, 5120]`` tile: 4 tile steps per operation instead of
    10; FLASH TP4 qkv_proj_rope T=192 349 -> 320 us; ``[320, 32]`` tiles failed the
    simulation)."""
    return mx_linear.mx_activation_bf16(pypto, x32, rows, valid, k, group_tile_rows=GROUP_TILE)


def mx_tiles(tokens: int) -> int:
    """One-task row tiles per loop iteration for a launch of ``tokens`` (trace time): up to
    :data:`MX_TILES`, no more than the launch's tokens need."""
    return max(1, min(MX_TILES, -(-tokens // MX_ROWS)))


def row_tile_tasks(pypto, tokens, tiles, name, body):
    """Call ``body(start, valid)`` for ``MX_ROWS``-token tiles covering rows ``0 ..
    tokens - 1``, each tile ONE task (:func:`v41.subgraph.one_subgraph`): a ``pypto.loop``
    of ``tiles`` tiles per iteration, unrolled at trace time, so the tiles run side by side
    on the vector cores while the loop stays short (the ctrl-flow AICPU stitches at most 128
    loop iterations into one submission, v41.abi).  A tile's start is clamped to ``tokens -
    MX_ROWS`` (0 when fewer), so every tile has at least one real row; the clamped tiles of
    a launch's last iteration recompute and rewrite rows of their neighbours with the same
    bytes.  Module-level: the jit parser refuses a ``with`` in the kernel body."""
    span = MX_ROWS * tiles
    for i in pypto.loop((tokens + span - 1) // span, name=name, idx_name="r"):
        for u in range(tiles):  # unrolled at trace time
            with one_subgraph(pypto):
                start = (i * span + u * MX_ROWS).min((tokens - MX_ROWS).max(0))
                valid = (tokens - start).min(MX_ROWS)
                body(start, valid)


def quantize_rows(pypto, x, xq, tokens, tiles, name):
    """``xq[:tokens] = MX(x[:tokens])`` (BF16, exact; :func:`v41.mx_linear.mx_activation_bf16`)
    for a BF16 DDR tensor ``x [*, k]`` in :func:`row_tile_tasks` tiles (rows at or past
    ``tokens`` neither read nor written)."""
    k = x.shape[1]
    row_tile_tasks(pypto, tokens, tiles, name,
                   lambda start, valid: _mx_piece(pypto, x, xq, start, valid, k))


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
    the same BF16 rows as a ``[rows, k]`` tile for the row tile's products.
    ``MX_ROWS``-token pieces (:func:`_mx_piece`) unrolled at trace time, each ONE task, then
    ONE task in the same root function (the compiler's exact edges: it waits for every
    piece) copies the rows (times 1.0, exact) into the returned tile, which a product in a
    nested loop waits for through one edge (reading ``xq`` itself, whose rows are a dynamic
    axis, a later root function gets an edge from one piece's writer only).  A piece's
    start is clamped to ``valid - MX_ROWS`` (0 when fewer): pieces past the real rows
    rewrite the last piece's rows with the same bytes."""
    k = x.shape[1]
    for u in range(rows // MX_ROWS):  # unrolled at trace time
        with one_subgraph(pypto):
            lo = (valid - MX_ROWS).max(0).min(u * MX_ROWS)
            _mx_piece(pypto, x, xq, start + lo, (valid - lo).min(MX_ROWS), k)
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(min(rows, CLONE_ROWS), mx_linear.cols(k))
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


def gated(pypto, values, gate):
    """FP32 ``values [n]`` unchanged (times exactly 1.0), as a task that waits for the last
    writer of the BF16 DDR tensor ``gate`` (finite values; its first 16 entries read): a
    scheduling edge.  Weight decodes that take a gated table are not dispatched at launch
    start, where they would take vector cores from the decodes the launch's critical path
    waits on."""
    n = values.shape[0]
    pypto.set_vec_tile_shapes(1, 16)
    g = pypto.cast(pypto.view(gate, [1, 16], [0, 0]), pypto.DT_FP32)
    one = pypto.mul(pypto.sum(pypto.add(pypto.mul(g, 0.0), 1.0), -1, keepdim=True), 1.0 / 16)
    pypto.set_vec_tile_shapes(1, n)
    return pypto.reshape(pypto.mul(pypto.reshape(values, [1, n]), one), [n])


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


def project_heads(pypto, a, w, w_scale, out, active, heads, head_dim, k, rope_cos, rope_sin,
                  factors, rope_dim, rows, n_tile, name, *, scale_up=False, tile_rows=None,
                  clone_rows=False, gate=None):
    """``out[:active, h * head_dim ...] = [RoPE([a @ W_h^T])]`` for each head ``h`` of the
    FP8 weight ``W`` (``head_dim`` rows per head, uint8 E4M3 codes, E8M0 32x32 scales) over
    the BF16 MX activations ``a [*, k]`` (a DDR tensor): weight-stationary, each
    ``n_tile``-row tile of a head decoded once and applied to every row tile; the head's
    last tile holds its whole rope tail (``rope_dim <= n_tile``).  ``tile_rows``: rows of
    the vector tiles after the product (the K partial sums, the BF16 cast, the rope tail,
    the stores); None keeps 16-row sums, 8-row casts and 16-row rope tiles.

    Task graph (each successor edge costs the AICPU ~390 cycles of serial resolve when its
    task ends): ``clone_rows`` first copies each head's rows of ``a`` (exact) and the
    products read the copy, so ``a``'s last writer resolves one edge per head and copy tile
    instead of one per product task and K chunk; ``gate``: the weight decodes wait for its
    last writer (:func:`gated`)."""
    width = mx_linear.tile_width(head_dim, n_tile)
    if rope_dim > width:
        raise ValueError(f"rope_dim: {rope_dim} exceeds the head tile {width} (the rope tail "
                         f"must lie in a head's last tile)")
    row_tiles = (active + rows - 1) // rows
    table = mx_decode.e4m3_table(pypto)
    if gate is not None:
        table = gated(pypto, table, gate)
    tiles = head_dim // width
    for h in pypto.loop(heads, name=name, idx_name="h"):
        # the head's tiles decoded once (unrolled at trace time; the last holds the tail)
        wts = [mx_linear.mx_weight_tile_bf16(pypto, w, w_scale, h * head_dim + c * width, 0,
                                             width, k, scale_up=scale_up, table=table)
               for c in range(tiles)]
        # one row loop per head (not per tile): fewer stitched loop iterations
        for i in pypto.loop(row_tiles, name=name + "_ROWS", idx_name="r"):
            start = i * rows
            valid = (active - start).min(rows)
            src, src_start = a, start
            if clone_rows:  # times 1.0: exact (pypto.clone crashed the TINY tp4 interpreter)
                pypto.set_vec_tile_shapes(min(rows, CLONE_ROWS), k)
                src = pypto.mul(pypto.view(a, [rows, k], [start, 0], valid_shape=[valid, k]), 1.0)
                src_start = 0
            head_rows(pypto, src, src_start, wts, out, start, rows, valid, h, head_dim, k,
                      rope_cos, rope_sin, factors, rope_dim, tile_rows)


def head_rows(pypto, a, a_start, wts, out, start, rows, valid, h, head_dim, k, rope_cos,
              rope_sin, factors, rope_dim, tile_rows):
    """``out[start : start + valid, h * head_dim ...] = [RoPE([a @ W_h^T])]`` from head
    ``h``'s decoded tiles ``wts`` and rows ``a_start ..`` of the BF16 MX activations ``a``
    (:func:`project_heads`' per-head body; the last tile holds the rope tail)."""
    width = head_dim // len(wts)
    for c, wt in enumerate(wts):
        y = tile_product(pypto, a, a_start, rows, valid, wt, width, k, tile_rows or 16)
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
                       rope_cos, rope_sin, factors, rope_dim, n_tile, name, *, tile_rows=None):
    """:func:`project_heads` for ONE row tile ``a [rows, k]`` (first ``valid`` rows real; a
    tile, e.g. :func:`mx_row_tile`'s, written before this loop in the caller's row
    iteration): a ``pypto.loop`` over heads, each head's tiles decoded in its iteration and
    applied to the tile, so every product is in the same root function as its decode and
    waits for ``a``'s one writer.  A launch of several row tiles decodes every head once per
    row tile."""
    width = mx_linear.tile_width(head_dim, n_tile)
    if rope_dim > width:
        raise ValueError(f"rope_dim: {rope_dim} exceeds the head tile {width} (the rope tail "
                         f"must lie in a head's last tile)")
    table = mx_decode.e4m3_table(pypto)
    for h in pypto.loop(heads, name=name, idx_name="h"):
        wts = [mx_linear.mx_weight_tile_bf16(pypto, w, w_scale, h * head_dim + c * width, 0,
                                             width, k, table=table)
               for c in range(head_dim // width)]
        head_rows(pypto, a, 0, wts, out, start, rows, valid, h, head_dim, k, rope_cos,
                  rope_sin, factors, rope_dim, tile_rows)
