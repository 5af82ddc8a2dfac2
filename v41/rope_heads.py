"""Per-head query projections with their rope tails rotated, inside a pypto kernel
(trace-time helpers shared by the query kernels: :mod:`v41.qkv_proj_rope`,
:mod:`v41.index_query`)."""

from v41 import mx_decode, mx_linear, rope_tail


def store_rope_head(pypto, y_bf16, out, start, col, rows, valid, cos_t, sin_t, factors,
                    head_dim, rope_dim):
    """Write one head ``y_bf16 [rows, head_dim]`` (first ``valid`` rows real) to ``out`` at
    ``[start, col]``: the NoPE channels as they are, the rope tail (the last ``rope_dim``
    channels) rotated with :func:`v41.rope_tail.rotate_tail`.  A head that is all rope
    (``head_dim == rope_dim``) has no NoPE write."""
    nope = head_dim - rope_dim
    if nope < 0:
        raise ValueError(f"head_dim: {head_dim} is narrower than rope_dim {rope_dim}")
    if nope:
        pypto.set_vec_tile_shapes(min(rows, 16), head_dim)
        pypto.assemble(pypto.view(y_bf16, [rows, nope], [0, 0], valid_shape=[valid, nope]),
                       [start, col], out)
    pypto.set_vec_tile_shapes(min(rows, 16), head_dim)
    tail = pypto.view(y_bf16, [rows, rope_dim], [0, nope], valid_shape=[valid, rope_dim])
    rot = rope_tail.rotate_tail(pypto, tail, cos_t, sin_t, factors, rows, valid, rope_dim)
    pypto.set_vec_tile_shapes(min(rows, 16), rope_dim)
    pypto.assemble(pypto.view(rot, [rows, rope_dim], [0, 0], valid_shape=[valid, rope_dim]),
                   [start, col + nope], out)


def project_heads(pypto, a, w, w_scale, out, active, heads, head_dim, k, rope_cos, rope_sin,
                  factors, rope_dim, rows, n_tile, name, *, scale_up=False):
    """``out[:active, h * head_dim ...] = [RoPE([a @ W_h^T])]`` for each head ``h`` of the
    FP8 weight ``W`` (``head_dim`` rows per head, uint8 E4M3 codes, E8M0 32x32 scales) over
    the BF16 MX activations ``a [*, k]`` (a DDR tensor): weight-stationary, each
    ``n_tile``-row tile of a head decoded once and applied to every row tile; the head's
    last tile holds its whole rope tail (``rope_dim <= n_tile``)."""
    width = mx_linear.tile_width(head_dim, n_tile)
    if rope_dim > width:
        raise ValueError(f"rope_dim: {rope_dim} exceeds the head tile {width} (the rope tail "
                         f"must lie in a head's last tile)")
    row_tiles = (active + rows - 1) // rows
    table = mx_decode.e4m3_table(pypto)
    for h in pypto.loop(heads, name=name, idx_name="h"):
        for c in range(head_dim // width):  # unrolled at trace time; the last holds the tail
            wt = mx_linear.mx_weight_tile_bf16(pypto, w, w_scale, h * head_dim + c * width, 0,
                                               width, k, scale_up=scale_up, table=table)
            for i in pypto.loop(row_tiles, name=name + "_ROWS", idx_name="r"):
                start = i * rows
                valid = (active - start).min(rows)
                y = mx_linear.rows_times_tile(pypto, a, start, rows, valid, wt, width, k)
                pypto.set_vec_tile_shapes(min(rows, 8), width)
                yb = pypto.cast(y, pypto.DT_BF16)
                col = h * head_dim + c * width
                if c == head_dim // width - 1:
                    cos_t, sin_t = rope_tail.row_views(pypto, rope_cos, rope_sin, start, rows,
                                                       valid)
                    store_rope_head(pypto, yb, out, start, col, rows, valid, cos_t, sin_t,
                                    factors, width, rope_dim)
                else:
                    pypto.assemble(pypto.view(yb, [rows, width], [0, 0],
                                              valid_shape=[valid, width]), [start, col], out)
