"""Q / KV projection with RoPE, one TP rank's heads (golden: ``goldens.qkv.qkv_proj_rope``).

Per token (brackets mark a BF16 cast, as in the golden):

* ``x`` is quantized once to MXFP8 (activation rule, :mod:`v41.mx_linear`); the
  ``wq_a`` and ``wkv`` products share it (the golden quantizes the same ``x`` twice);
* ``qr = [RMSNorm([MX(x) @ wq_a^T], q_norm)]`` ``[rows, q_lora_rank]``, written to ``qr``;
* ``kv = [RoPE([RMSNorm([MX(x) @ wkv^T], kv_norm)])]`` ``[rows, head_dim]``;
* ``q_h = [RoPE([MX(qr) @ wq_b_h^T])]`` for each of the rank's heads.

Schedule: ONE ``pypto.loop`` ``QKV_ROWS`` over row tiles of up to ``ROW_TILE`` tokens (one
iteration for a decode launch), each iteration in the order of its data:

* ``MX(x)`` of the tile by the nested loop ``QKV_XQ`` over column blocks, each ONE task,
  into the scratch output ``xq`` (:func:`v41.rope_heads.mx_rows`; a kernel built for
  several row tiles unrolls the blocks in the row iteration, here and in ``QKV_QR``);
* nested loops ``QKV_WQA`` / ``QKV_WKV``: one ``N_TILE``-row weight tile decoded per
  iteration (from the iteration's own E4M3 table in a large row tile) and applied to the
  tile's rows of ``xq`` (each K view waits for the writers of its column blocks), the BF16
  product written to the scratch ``qa`` / ``kva`` as one task per column block
  (:func:`project_tile`);
* ``qr = [RMSNorm(qa)]`` and ``MX(qr)`` to the scratch ``qrq``: the rows' norm factor, then
  the nested loop ``QKV_QR`` over column blocks, each ONE task, then one join copy
  (:func:`normalize_q_tile`); ``kv = [RoPE([RMSNorm(kva)])]``;
* nested loop ``QKV_HEADS`` (:func:`v41.rope_heads.project_heads_tile`): each head copies
  the ``MX(qr)`` join tile, builds its own E4M3 table (large row tiles), decodes its
  ``wq_b`` tiles and writes ``q`` (RoPE on the head's last tile, which holds its whole rope
  tail).

Ordering (pypto 0.2.0, :mod:`v41.order`): a root function (loop iteration) reading rows a
previous one wrote gets an edge from the last writer of each static-dim cell only, and
along the dynamic ``tokens`` axis a column block is one cell.  So every hand-over is
either inside one root function (exact edges), from a join copy (one writer per cell of a
static ``[rows, k]`` tile) or from a column block written by one task; no later row tile
reads an earlier one's rows.  The weights are decoded once per row tile (once per launch
up to ``ROW_TILE`` tokens).  The scratch tensors are outputs because an in-kernel
``pypto.tensor`` written by one loop and read by a sibling loop crashes the simulator.

Cost model (A5, FLASH TP4 rank, T=192). The earlier weight-stationary schedule (sibling
loops ``QKV_XQ``, ``QKV_WQA``, ``QKV_WKV``, ``QKV_QR``, ``QKV_NORM``, ``QKV_HEADS``) came
down 575 -> 267 us with the vector and cube pass merges, one-task 4-token MX tiles,
``[160, 32]`` MX group tiles, 64-row K partial sums and per-head copies of the ``MX(qr)``
rows, but its readers waited for the last row tile of ``xq`` / ``qa`` / ``kva`` / ``qrq``
only (racy); with static rows for ``xq`` / ``qrq`` (one edge per 4-token writer) 621.5 us.
This schedule: 390.9 us; each head's copy of the ``MX(qr)`` tile (the join's three tasks
resolved 449 successor edges each, ~390 AICPU cycles apiece; now 81) 343.9; the ``qa`` /
``kva`` column block cast and written as one ``[192, 128]`` tile (12 tasks per block
before) 318.6-334.3 us. ``MX(x)`` / ``MX(qr)`` by column-block loops instead of 4-token
pieces unrolled at trace time (compile CPU T=192 22.8 -> ~4 s, flat in T): ~344 us (T=4
193.9 -> 210.9, T=48 217.7 -> 210.2; T=1024, six row tiles, ~1,290 -> 1,566 us: each row tile
adds its nested loops' root functions to the launch, at most 128 per stitched submission;
with the blocks unrolled when built for several row tiles, T=1024 1,566 -> 1,181 us, T=384
693.2 -> 458.2). In row tiles of more than ``CLONE_ROWS`` rows each ``QKV_WQA`` /
``QKV_WKV`` iteration and each head build their own E4M3 table instead of one table per
row tile with 12 / 33 successor edges (the AICPU resolved them before dispatching the
weight decodes): T=192 344.2 -> 319.6 us (T=384 458.2 -> 464.4; 12 + 16 tasks more); in
smaller row tiles the extra tasks cost more than the edges (T=4 210.9 -> 209.0, T=48 210.2
-> 216.7, TINY T=9 TP4 57.5 -> 59.5), so they keep one table.  The ``MX(qr)`` join copy
on the clones' ``[64, q_lora]`` vector tiles instead of ``[64, 1024]`` + ``[64, 256]`` (each
clone read 8 join tile pairs, a successor edge each; :func:`normalize_q_tile`): T=4 / 48 /
192 210.9 / 210.2 / 319.6 -> 205.5 / 205.9 / 314.1 us, T=1024 1,182.4 -> 1,180.9 (the same
fix took ``index_query`` 132.1 -> 102.3 us).  The cost model's ready queue is FIFO and
only the AICPUs of idle cores dispatch; in row tiles over ``CLONE_ROWS`` rows: each weight
tile (``wq_a``, ``wkv``, each head's ``wq_b``) decoded by ONE task that builds its own E4M3
table and gathers its scale rows (:func:`v41.rope_heads.decode_rows`), ready when the
launch starts, so the ``wq_a`` / ``wkv`` decodes leave with the ``MX(x)`` blocks instead of
44 k cycles later behind the heads' 48 table / scale-row tasks (309.3 us alone); the rope
factors one task without predecessors (its edges resolved while the decodes run, not while
the products are dispatched); the q norm's row factor on 16-row tiles (each ``MX(qr)``
block and each ``qa`` writer get one successor entry per row tile: 240 + 240 -> 120 + 120,
resolved serially, the blocks had waited 51 k cycles); ``MX(qr)`` groups in ``[256, 32]``
tiles (65 k instead of 70 k cycles a block): T=192 314.1 -> 282.3 us, T=4 / 48 unchanged
(their tiles keep the old tasks).  In a launch of ONE row tile over ``CLONE_ROWS`` rows
(h24): ``MX(qr)`` as 20 row-half tasks unrolled in the row iteration (the norm's factor
and the join copy in the same root function: exact edges; ~10 k cycles less from the
factor to the blocks) and no vector pair merge (``PASS_OPTIONS_BIG``: the halves stay 20
tasks of 37 k cycles instead of 10 pairs of 66 k, the heads' decodes one task each):
T=192 282.3 -> 262.7 us (3.20x -> 2.98x; 481 -> 626 tasks; compile CPU 5.7 -> 8.1 s, the
unrolled blocks), T=4 / 48 / 1024 unchanged (their builds are not touched).  Each alone:
halves 273.7 (pairs of halves merged), no merge 270.4.  With 256-row head tiles as well
(each head's two 128-row decodes and one product of 256 columns: 32 products of 27 k
cycles instead of 64 of 22 k) 247.1 us, but with 256-column cube tiles the interpreter's
FP32 sums move 12 of 2.6 M ``q`` values by one BF16 ulp (FLASH T=80 TP4; not taken).  Tried: the
blocks unrolled whole (merged in pairs: 300.5); 64-row ``wq_a`` / ``wkv`` tiles (the
products are copy-in bound: 301.0); the row factor copied by a task of its own (merged
into one 81 k task: 303.3); wide heads reading the join tile without clones (257 entries
on the join: 298.1); 256-row head tiles concatenated from 128-row decodes (961 tasks:
319.9); wide heads alone 284.2, with the halves but the merge 273.3.  Tried before: the row factor
copied by one join task (the partitioner made the factor one 73.6 k-cycle task: 320.3
us); 64-channel ``MX(qr)`` blocks (20 tasks of 38 k cycles, but 41 entries a factor
task: 287.7 us); 96-row K partial sums for ``wq_a`` / ``wkv`` (294.3 us).  Still bound
by the stages in sequence: decodes
(122 k cycles, copy-in bound), the products (cube cores saturated by copy-in-bound tasks,
~40 k cycles waiting), ``MX(qr)`` (65 k), the heads' products (~50 k on 28 cube cores).
Earlier: 96-row tiles at T=192 (two row tiles, every weight decoded twice) 365.1 us; 64-row
``wq_a`` / ``wkv`` weight tiles with 32-channel ``MX(qr)`` blocks 394.6 us (no core busy
for 129 k cycles while the 32 blocks' edges resolved).  Tried on the earlier schedule:
merging 4 subgraphs (456 us); the sum and cast of each head tile's K-chunk products as one
task (331 us); stitching 256 or 512 functions (the simulator crashes); ``[320, 32]`` MX
tiles (simulation error).

MXFP8 weights arrive as uint8 E4M3 codes with uint8 E8M0 32x32 block scales and are
decoded inside the kernel one ``[N_TILE, K]`` tile at a time (:mod:`v41.mx_linear`);
nothing is dequantized on the host.  RMSNorm: ``x * rsqrt(sum(x^2) / n + eps) * w`` in
FP32 (``goldens.norm``; the golden's FP64 mean differs by FP32 reassociation only).
RoPE: forward adjacent-pair rotation of each head's tail from the prepared rope rows
(``rope_rows`` output), :mod:`v41.rope_tail`.

ABI (one rank; ``heads = num_heads / tp``)
---
============  ==================================  ========  =====
name          shape                               dtype     role
============  ==================================  ========  =====
x             (tokens, hidden)                    bfloat16  in
rope_cos      (tokens, rope_dim / 2)              float32   in
rope_sin      (tokens, rope_dim / 2)              float32   in
wq_a          (q_lora_rank, hidden)               uint8     in   (E4M3 codes)
wq_a_scale    (q_lora_rank / 32, hidden / 32)     uint8     in   (E8M0 codes)
q_norm        (q_lora_rank,)                      float32   in
wq_b          (heads * head_dim, q_lora_rank)     uint8     in   (the rank's rows)
wq_b_scale    (heads * head_dim / 32, q_lora_rank / 32)  uint8  in
wkv           (head_dim, hidden)                  uint8     in
wkv_scale     (head_dim / 32, hidden / 32)        uint8     in
kv_norm       (head_dim,)                         float32   in
q             (tokens, heads * head_dim)          bfloat16  out  ([T, heads, head_dim])
kv            (tokens, head_dim)                  bfloat16  out
qr            (tokens, q_lora_rank)               bfloat16  out
xq            (tokens, hidden)                    bfloat16  out  (scratch: MX(x))
qa            (tokens, q_lora_rank)               bfloat16  out  (scratch: [MX(x) @ wq_a^T])
kva           (tokens, head_dim)                  bfloat16  out  (scratch: [MX(x) @ wkv^T])
qrq           (tokens, q_lora_rank)               bfloat16  out  (scratch: MX(qr))
============  ==================================  ========  =====

``tokens`` (>= 1) is a dynamic axis; ``tp`` from ``case["tp"]`` (default 1).
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41 import mx_decode, mx_linear, rope_tail
from v41.abi import Arg, case_int, jit_options, resolve
from v41.cube_tiles import cube_tiles, row_tile
from v41.rope_heads import (CLONE_ROWS, GROUP_TILE, column_block, column_blocks, decode_rows,
                             mx_rows, project_heads_tile, store_rope_head, tile_product)
from v41.subgraph import one_subgraph

# Same-structure vector and cube subgraph pairs of a loop iteration merge into one task each
# (partition only, same bits): cube pairs FLASH T=4 187.8 -> 179.2 us, T=192 298.4 -> 294.7.
PASS_OPTIONS = {"vec_nbuffer_setting": {-2: 1, -1: 2}, "cube_nbuffer_setting": {-1: 2}}
# One row tile over CLONE_ROWS rows: no vector pair merge (the MX(qr) row halves and the
# heads' decodes stay one task each instead of pairs: FLASH T=192 273.7 -> 262.7 us with
# the halves; alone, on the schedule before, 282.3 -> 270.4)
PASS_OPTIONS_BIG = {"vec_nbuffer_setting": {-2: 1, -1: 1}, "cube_nbuffer_setting": {-1: 2}}

ROW_TILE = 192  # most tokens per row tile (the weights are decoded once per row tile)
N_TILE = 128  # weight output rows decoded per tile
# MX(x) / MX(qr) column blocks (rope_heads.column_block): ~MX_ELEMS elements, >= MX_COLS
MX_ELEMS = 192 * 128
MX_COLS = 128
# MX(qr) group tiles in row tiles over CLONE_ROWS rows (GROUP_TILE below)
QR_GROUP_TILE = 256
# Rows of the vector tiles that add the products' K partials (and, in the head loop, cast,
# rotate and store): 64 instead of 16 / 8, each tile paying ~1.5 k cycles of DDR copy-in
# (the 16-row sums made each head tile a 76 k-cycle task at FLASH T=192).
SUM_TILE_ROWS = 64
# Rows of the vector tiles of the q norm's row factor (row_rstd): every MX(qr) column block
# gets a successor edge per row tile, every qa column block's writer one per row tile
# (8-row tiles: 240 + 240 edges at 192 rows); the column split (1,024) keeps the sums' bits
# ([32, 1024] FP32 tiles exceed the UB in the sum).
RSTD_ROWS = 16

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "inverse_rope": "de-rotates the rope tails (inverse RoPE) instead of rotating them",
    "no_q_norm": "skips the q RMSNorm (qr and q get the raw wq_a product)",
    "wq_b_scale_up": "decodes wq_b with every E8M0 block scale one binade too large",
}

ABI = (
    Arg("x", ("tokens", "hidden"), "bfloat16", "in"),
    Arg("rope_cos", ("tokens", "half"), "float32", "in"),
    Arg("rope_sin", ("tokens", "half"), "float32", "in"),
    Arg("wq_a", ("q_lora", "hidden"), "uint8", "in"),
    Arg("wq_a_scale", ("q_lora_blocks", "hidden_blocks"), "uint8", "in"),
    Arg("q_norm", ("q_lora",), "float32", "in"),
    Arg("wq_b", ("q_width", "q_lora"), "uint8", "in"),
    Arg("wq_b_scale", ("q_width_blocks", "q_lora_blocks"), "uint8", "in"),
    Arg("wkv", ("head_dim", "hidden"), "uint8", "in"),
    Arg("wkv_scale", ("head_dim_blocks", "hidden_blocks"), "uint8", "in"),
    Arg("kv_norm", ("head_dim",), "float32", "in"),
    Arg("q", ("tokens", "q_width"), "bfloat16", "out"),
    Arg("kv", ("tokens", "head_dim"), "bfloat16", "out"),
    Arg("qr", ("tokens", "q_lora"), "bfloat16", "out"),
    Arg("xq", ("tokens", "hidden"), "bfloat16", "out"),
    Arg("qa", ("tokens", "q_lora"), "bfloat16", "out"),
    Arg("kva", ("tokens", "head_dim"), "bfloat16", "out"),
    Arg("qrq", ("tokens", "q_lora"), "bfloat16", "out"),
)


def dims(config, case: dict) -> dict[str, int]:
    tp = case_int(case, "tp", default=1, minimum=1)
    if config.num_heads % tp:
        raise ValueError(f"case['tp']: {tp} must divide num_heads {config.num_heads}")
    ql, hd, d = config.q_lora_rank, config.head_dim, config.hidden_size
    qw = config.num_heads // tp * hd
    return {"tokens": case_int(case, "tokens", minimum=1), "hidden": d,
            "half": config.rope_dim // 2, "q_lora": ql, "q_width": qw, "head_dim": hd,
            "hidden_blocks": d // 32, "q_lora_blocks": ql // 32, "q_width_blocks": qw // 32,
            "head_dim_blocks": hd // 32}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def rms_norm_rows(pypto, y32, weight, rows, n, eps, *, apply=True):
    """FP32 ``[rows, n]``: ``y * rsqrt(sum(y^2) / n + eps) * w`` of FP32 rows ``y32`` with
    FP32 ``weight [1, n]`` (``apply=False`` returns ``y32`` unchanged: a wrong variant)."""
    if not apply:
        return y32
    return pypto.mul(pypto.mul(y32, _rstd(pypto, y32, rows, n, eps)), weight)


def _rstd(pypto, y32, rows, n, eps, tile_rows=8):
    """FP32 ``[rows, 1]``: ``rsqrt(sum(y^2) / n + eps)`` of FP32 rows ``y32 [rows, n]`` (the
    vector tile is left at ``[min(rows, tile_rows), min(n, 1024)]``; the row tiling leaves
    each row's sum, so its bits, as it is)."""
    pypto.set_vec_tile_shapes(min(rows, tile_rows), min(n, 1024))
    ms = pypto.mul(pypto.sum(pypto.mul(y32, y32), -1, keepdim=True), 1.0 / n)
    return pypto.rsqrt(pypto.add(ms, eps))


def _norm_mx_columns(pypto, qa, q_norm, qr, qrq, rstd, start, col, rows, valid, width,
                     group_tile=GROUP_TILE, r0=0):
    """``qr = [RMSNorm(qa)]`` and ``qrq = MX(qr)`` for columns ``col .. col + width`` of one
    row tile as ONE task on one ``[rows, width]`` vector tile, from the rows' FP32
    ``rsqrt(mean(qa^2) + eps)`` ``rstd [rows, 1]`` (None: no norm, a wrong variant); the
    same element operations as :func:`rms_norm_rows` (``y * rstd`` then ``* w``)."""
    ql = qa.shape[1]
    fp32, bf16 = pypto.DT_FP32, pypto.DT_BF16
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(1, ql)
        qn = pypto.view(pypto.reshape(q_norm, [1, ql]), [1, width], [0, col])
        pypto.set_vec_tile_shapes(rows, width)
        y = pypto.cast(pypto.view(qa, [rows, width], [start, col], valid_shape=[valid, width]),
                       fp32)
        if rstd is not None:
            r = pypto.view(rstd, [rows, 1], [r0, 0], valid_shape=[valid, 1])
            y = pypto.mul(pypto.mul(y, r), qn)
        qr_t = pypto.cast(y, bf16)
        pypto.assemble(pypto.mul(qr_t, 1.0), [start, col], qr)
        qrm = mx_linear.mx_activation_bf16(pypto, pypto.cast(qr_t, fp32), rows, valid, width,
                                           group_tile_rows=group_tile, vec_rows=rows)
        pypto.set_vec_tile_shapes(rows, width)
        pypto.assemble(pypto.mul(qrm, 1.0), [start, col], qrq)


def row_rstd(pypto, qa, start, rows, valid, eps, tile_rows=8):
    """FP32 ``[rows, 1]``: ``rsqrt(sum(y^2) / n + eps)`` of the rows ``start .. start +
    valid - 1`` of ``qa [*, n]`` (:func:`_rstd`'s operations, :func:`rms_norm_rows`'s row
    factor) in one subgraph on ``[tile_rows, min(n, 1024)]`` vector tiles."""
    n = qa.shape[1]
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(min(rows, tile_rows), min(n, 1024))
        y32 = pypto.cast(pypto.view(qa, [rows, n], [start, 0], valid_shape=[valid, n]),
                         pypto.DT_FP32)
        return _rstd(pypto, y32, rows, n, eps, tile_rows)


def rope_factors_task(pypto, rope_dim, inverse):
    """:func:`v41.rope_tail.rope_factors` as ONE task without predecessors: ready when the
    launch starts, so its successor edges are resolved while the first tasks run (as
    several tasks, the later ones waited behind the loops' tasks in the ready queue and
    resolved their ~35 edges each while the products were being dispatched)."""
    with one_subgraph(pypto):
        return rope_tail.rope_factors(pypto, rope_dim, inverse=inverse)


def normalize_q_tile(pypto, qa, q_norm, qr, qrq, start, rows, valid, eps, apply, name):
    """``qr = [RMSNorm(qa)]`` and ``qrq = MX(qr)`` for rows ``start .. start + valid - 1``:
    the rows' norm factor (:func:`row_rstd`, one task), then a nested loop ``name`` over
    column blocks (None: unrolled, as :func:`v41.rope_heads.mx_rows` does for launches of
    several row tiles; a row tile over ``CLONE_ROWS`` rows with a ``name``: each block
    unrolled as two row halves), each ONE task writing its block of ``qr`` and ``qrq``
    (:func:`_norm_mx_columns`; MX groups and the norm's element operations are per column,
    so a block equals the whole row's); returns the row tile's ``MX(qr)`` rows as a
    ``[rows, q_lora]`` tile (one join copy after the loop, waiting for every block)."""
    ql = qa.shape[1]
    big = rows > CLONE_ROWS
    width = column_block(ql, rows, MX_ELEMS, MX_COLS)
    rstd = (row_rstd(pypto, qa, start, rows, valid, eps, RSTD_ROWS if big else 8) if apply
            else None)
    if big and name is not None:
        # one row tile over CLONE_ROWS rows: each column block as two row halves unrolled
        # here, the join copy below in the same root function (exact edges), 20 tasks of
        # 37 k cycles at FLASH T=192 instead of 10 of 65 k; in a loop only the last half of
        # a block would get an edge.  A half without valid rows is a zero-row view (writes
        # nothing).
        h0 = -(-(rows // 2) // 16) * 16
        halves = ((0, h0, valid.min(h0)), (h0, rows - h0, (valid - h0).max(0)))
        for c in range(ql // width):
            for r0, hr, hv in halves:
                _norm_mx_columns(pypto, qa, q_norm, qr, qrq, rstd, start + r0, c * width,
                                 hr, hv, width, QR_GROUP_TILE, r0)
    else:
        for c in column_blocks(pypto, ql // width, name):
            _norm_mx_columns(pypto, qa, q_norm, qr, qrq, rstd, start, c * width, rows, valid,
                             width, QR_GROUP_TILE if big else GROUP_TILE)
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(min(rows, CLONE_ROWS), ql)
        return pypto.mul(pypto.view(qrq, [rows, ql], [start, 0], valid_shape=[valid, ql]), 1.0)


def project_tile(pypto, a, w, ws, out, start, rows, valid, n, k, table, name):
    """``out[start : start + valid] = [a @ W^T]`` (BF16) for one row tile ``a [rows, k]`` of
    MX activations: a ``pypto.loop`` over ``N_TILE``-row weight tiles, each decoded in its
    iteration (``table`` None: with the iteration's own E4M3 table, one small task with one
    successor) and applied to the tile, its BF16 columns written by ONE task (a reader after
    the loop gets an edge from each column block's writer; row pieces would leave all but
    the last piece unordered)."""
    width = mx_linear.tile_width(n, N_TILE)
    for nt in pypto.loop(n // width, name=name, idx_name="nt"):
        if table is None:
            wt = decode_rows(pypto, w, ws, nt * width, width, k)
        else:
            wt = mx_linear.mx_weight_tile_bf16(pypto, w, ws, nt * width, 0, width, k,
                                               table=table)
        y = tile_product(pypto, a, start, rows, valid, wt, width, k, SUM_TILE_ROWS)
        store_columns(pypto, y, out, start, nt * width, rows, valid, width)


def store_columns(pypto, y, out, start, col, rows, valid, width):
    """``out[start : start + valid, col : col + width] = [y]`` (BF16) for FP32 ``y [rows,
    width]``, as one task on one vector tile (``[192, 128]``: 144 KB of the UB).
    Module-level: the jit parser refuses a ``with`` in a loop."""
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(rows, width)
        yb = pypto.view(pypto.cast(y, pypto.DT_BF16), [rows, width], [0, 0],
                        valid_shape=[valid, width])
        pypto.assemble(yb, [start, col], out)


def build(config, case: dict | None = None, *, variant: str = "reference",
          rows_per_tile: int | None = None,
          runtime_options: dict | None = None):
    """The jit kernel ``qkv_proj_rope(x, rope_cos, rope_sin, wq_a, wq_a_scale, q_norm, wq_b,
    wq_b_scale, wkv, wkv_scale, kv_norm, q, kv, qr, xq, qa, kva, qrq)`` for one rank's
    heads (the last four are scratch)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    d = dims(config, case or {"tokens": 1})
    hidden, half, ql, qw, hd = d["hidden"], d["half"], d["q_lora"], d["q_width"], d["head_dim"]
    rd = config.rope_dim
    heads = qw // hd
    eps = float(config.rms_norm_eps)
    rows = row_tile(d["tokens"], ROW_TILE, rows_per_tile)
    mx_cols = column_block(hidden, rows, MX_ELEMS, MX_COLS)
    multi = d["tokens"] > rows  # several row tiles: the MX column blocks unrolled
    own_tables = rows > CLONE_ROWS  # each weight loop iteration builds its E4M3 table
    cube = cube_tiles(rows, mx_linear.k_chunk(hidden), N_TILE, 2)  # BF16 operands
    inverse = variant == "inverse_rope"
    q_norm_on = variant != "no_q_norm"
    scale_up = variant == "wq_b_scale_up"
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")
    bf16, fp32 = pypto.DT_BF16, pypto.DT_FP32

    passes = PASS_OPTIONS_BIG if own_tables and not multi else PASS_OPTIONS

    @pypto.frontend.jit(runtime_options=options, pass_options=passes)
    def qkv_proj_rope(
        x: pypto.Tensor([tokens_dim, hidden], pypto.DT_BF16),
        rope_cos: pypto.Tensor([tokens_dim, half], pypto.DT_FP32),
        rope_sin: pypto.Tensor([tokens_dim, half], pypto.DT_FP32),
        wq_a: pypto.Tensor([ql, hidden], pypto.DT_UINT8),
        wq_a_scale: pypto.Tensor([ql // 32, hidden // 32], pypto.DT_UINT8),
        q_norm: pypto.Tensor([ql], pypto.DT_FP32),
        wq_b: pypto.Tensor([qw, ql], pypto.DT_UINT8),
        wq_b_scale: pypto.Tensor([qw // 32, ql // 32], pypto.DT_UINT8),
        wkv: pypto.Tensor([hd, hidden], pypto.DT_UINT8),
        wkv_scale: pypto.Tensor([hd // 32, hidden // 32], pypto.DT_UINT8),
        kv_norm: pypto.Tensor([hd], pypto.DT_FP32),
        q: pypto.Tensor([tokens_dim, qw], pypto.DT_BF16),
        kv: pypto.Tensor([tokens_dim, hd], pypto.DT_BF16),
        qr: pypto.Tensor([tokens_dim, ql], pypto.DT_BF16),
        xq: pypto.Tensor([tokens_dim, hidden], pypto.DT_BF16),
        qa: pypto.Tensor([tokens_dim, ql], pypto.DT_BF16),
        kva: pypto.Tensor([tokens_dim, hd], pypto.DT_BF16),
        qrq: pypto.Tensor([tokens_dim, ql], pypto.DT_BF16),
    ):
        tokens = x.shape[0]
        pypto.set_cube_tile_shapes(*cube)
        factors = (rope_factors_task(pypto, rd, inverse) if own_tables
                   else rope_tail.rope_factors(pypto, rd, inverse=inverse))
        for i in pypto.loop((tokens + rows - 1) // rows, name="QKV_ROWS", idx_name="r"):
            start = i * rows
            valid = (tokens - start).min(rows)
            # MX(x) of the row tile (also to the scratch xq), then [MX(x) @ wq_a^T] and
            # [MX(x) @ wkv^T] into the scratch qa / kva
            mx_rows(pypto, x, xq, start, rows, valid, mx_cols, None if multi else "QKV_XQ")
            table = None if own_tables else mx_decode.e4m3_table(pypto)
            project_tile(pypto, xq, wq_a, wq_a_scale, qa, start, rows, valid, ql, hidden,
                         table, "QKV_WQA")
            project_tile(pypto, xq, wkv, wkv_scale, kva, start, rows, valid, hd, hidden,
                         table, "QKV_WKV")
            # qr = [RMSNorm(qa)], then MX(qr) for the wq_b products
            qra = normalize_q_tile(pypto, qa, q_norm, qr, qrq, start, rows, valid, eps,
                                   q_norm_on, None if multi else "QKV_QR")
            # kv = [RoPE([RMSNorm(kva)])]
            cos_t, sin_t = rope_tail.row_views(pypto, rope_cos, rope_sin, start, rows, valid)
            pypto.set_vec_tile_shapes(1, hd)
            kn = pypto.reshape(kv_norm, [1, hd])
            pypto.set_vec_tile_shapes(min(rows, 8), hd)
            kv32 = pypto.cast(pypto.view(kva, [rows, hd], [start, 0], valid_shape=[valid, hd]),
                              fp32)
            kv_t = pypto.cast(rms_norm_rows(pypto, kv32, kn, rows, hd, eps), bf16)
            store_rope_head(pypto, kv_t, kv, start, 0, rows, valid, cos_t, sin_t, factors,
                            hd, rd)
            # q_h = [RoPE([MX(qr) @ wq_b_h^T])]: each head's tiles decoded in its iteration
            project_heads_tile(pypto, qra, wq_b, wq_b_scale, q, start, rows, valid, heads, hd,
                               ql, rope_cos, rope_sin, factors, rd, N_TILE, "QKV_HEADS",
                               tile_rows=SUM_TILE_ROWS, scale_up=scale_up, clone_rows=True,
                               head_table=own_tables, own_decode=own_tables)

    return qkv_proj_rope
