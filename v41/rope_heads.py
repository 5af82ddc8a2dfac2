"""Write one head's projection with its rope tail rotated, inside a pypto kernel (trace-time
helper shared by the query kernels: :mod:`v41.qkv_proj_rope`, :mod:`v41.index_query`)."""

from v41 import rope_tail


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
