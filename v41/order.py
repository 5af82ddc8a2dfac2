"""Ordering a later loop after EVERY iteration of an earlier loop that wrote rows it reads.

pypto 0.2.0's runtime tracks a tensor written in one root function (a loop iteration) and
read in a later one in cells of its static dims (``device_slot_context.cpp``,
``UpdateSlotsForStitch``; ``dev_encode.cpp``, ``InitPartialUpdateCellMatch`` and
``EncodeAnalysisOpUseOutCasts``): a partial write records its task as the cell's last
writer.  Along the dynamic ``tokens`` axis every write of a column block lands in one
cell, so a later reader gets an edge from one writer only: the last iteration's, and in
it the last piece's (``harness.order_audit`` finds both in kept task graphs).

The kernels restore the order in one of four ways:

* the reader in the writer's root function (``routed_experts``' MX(x) in its row tile);
* in a nested loop of the writer's iteration one writer task per column block (columns
  are a static dim: one cell each), which code after it or a later nested loop of the same
  iteration reads (``rope_heads.mx_rows``: MX(x) of ``qkv_proj_rope`` and
  ``shared_expert``; ``qkv_proj_rope``'s ``qa`` / ``kva`` and normalized ``qr``,
  ``shared_expert``'s ``h_mx``), optionally followed by one join task that reads every
  block (the compiler's exact edges) and hands the readers a copy
  (``rope_heads.mx_row_tile``: ``index_query``; ``qkv_proj_rope.normalize_q_tile`` for
  its MX(qr));
* static rows for the hand-over tensor (the case's tokens: a build is per case), tracked
  per written tile (``o_proj``'s ``lat_mx``, with pieces that split columns rather than
  rows inside one iteration).  Not a general fix: ``shared_expert``'s static ``xq`` was
  tracked per tile at TINY but not at FLASH T=192 (and that launch's cost model failed),
  so a kernel using it is audited at FLASH too (``harness.bench --order-audit``);
* where the reader is a vector task: :func:`mark` in every iteration (one small task
  reading a row the iteration wrote, writing row ``i`` of the static :func:`marks`
  tensor, whose rows are tracked one cell each), then :func:`gated`, a value times
  exactly 1.0 computed from ``marks[:n]`` that the readers multiply their read by
  (``compressor_ratio2``).  Gating a weight decode's code table instead delays the decode
  to the end of the writing loop (``o_proj`` at FLASH TP4 T=192: 210.3 us).

Nothing is rounded: marks hold exactly 1.0 whatever the data (non-finite values
included) and gated values are multiplied by exactly 1.0.
"""

MAX_MARKS = 1024  # loop iterations one mark tensor orders at most
MARK_WIDTH = 8  # FP32 lanes per mark row (32 bytes)
JOIN_ROWS = 256  # mark rows per vector tile of the join


def check_iterations(iterations: int, field: str, rows: int) -> None:
    """Raise ``ValueError`` naming ``field`` when a launch would run more than
    ``MAX_MARKS`` iterations of a joined loop (``rows`` rows each)."""
    if iterations > MAX_MARKS:
        raise ValueError(f"{field}: {iterations} row tiles of {rows} rows exceed the "
                         f"{MAX_MARKS} a launch orders (at most {MAX_MARKS * rows} rows)")


def marks(pypto, iterations: int):
    """The kernel-local mark tensor ``[iterations, MARK_WIDTH]`` FP32 for a loop of at most
    ``iterations`` (trace time, checked with :func:`check_iterations`); a row is read only
    after :func:`mark` wrote it.  Sized to the launch: the join reads every row."""
    return pypto.Tensor([max(1, iterations), MARK_WIDTH], pypto.DT_FP32)


def mark(pypto, tokens_marks, i, data, row, width):
    """``marks[i] = 1.0`` as one task that reads ``data[row, :width]`` (a row the current
    iteration wrote, every column cell of it): it waits for the iteration's writers of
    that row, so it orders the iteration only where every writer task covers the row
    (``harness.order_audit``'s stranded-writer check tells).  Exactly 1.0 whatever the
    data: ``x * 0`` is 0 where ``x`` is finite, and the NaNs it gives elsewhere are
    replaced by 0 (``pypto.isfinite`` fails the lowered verification)."""
    from v41.subgraph import one_subgraph  # noqa: PLC0415
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(1, width)
        x = pypto.view(data, [1, width], [row, 0])
        x32 = x if x.dtype == pypto.DT_FP32 else pypto.cast(x, pypto.DT_FP32)
        z = pypto.mul(x32, 0.0)  # 0 where finite, NaN elsewhere
        z = pypto.where(pypto.eq(z, 0.0), z, 0.0)  # 0 everywhere
        one = pypto.add(pypto.amax(z, -1, keepdim=True), 1.0)
        pypto.set_vec_tile_shapes(1, MARK_WIDTH)
        pypto.assemble(pypto.expand_clone(one, [1, MARK_WIDTH]), [i, 0], tokens_marks)


def gated(pypto, tokens_marks, n, values):
    """FP32 ``values [m]`` times exactly 1.0, as a task that reads ``marks[:n]``: it waits
    for the ``n`` iterations that ran :func:`mark`, and so does every task that reads its
    result (a weight decode reading a gated code table)."""
    m_len = values.shape[0]
    rows = tokens_marks.shape[0]
    pypto.set_vec_tile_shapes(min(rows, JOIN_ROWS), MARK_WIDTH)
    m = pypto.view(tokens_marks, [rows, MARK_WIDTH], [0, 0], valid_shape=[n, MARK_WIDTH])
    one = pypto.amin(pypto.amin(m, -1, keepdim=True), 0, keepdim=True)  # [1, 1] = 1.0
    pypto.set_vec_tile_shapes(1, m_len)
    return pypto.reshape(pypto.mul(pypto.reshape(values, [1, m_len]), one), [m_len])
