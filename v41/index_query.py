"""Index query and head weights of the lightning indexer (golden:
``goldens.indexer.index_query``).

Per active token (brackets mark a BF16 cast, as in the golden):

* ``q_h = [RoPE_tail([MX(qr) @ wq_b_h^T])]`` for each of the ``H = index.n_heads`` heads,
  ``wq_b_h`` the head's ``Dh = index.head_dim`` output rows: ``qr`` is quantized once to
  MXFP8 (activation rule) into the scratch output ``qrq`` one row tile of up to
  ``ROW_TILE`` tokens at a time (the launch's tokens rounded up to 16), by a nested loop
  over column blocks and one join copy (:func:`_join_tile`), then, in the
  same row iteration, every head's FP8 weight tiles are decoded in-kernel (once per row
  tile: once per launch up to ``ROW_TILE`` tokens) and applied to it (cube tiles from
  :mod:`v41.cube_tiles`; :func:`_fused_heads`); the last ``rope_dim``
  channels of each head are rotated with the token's prepared rope row;
* ``weights = [[x @ weights_proj] * (Dh^-0.5 * H^-0.5)]``: one BF16 cube matmul with FP32
  accumulation, a BF16 cast, the FP32 scale, a BF16 cast.  (The golden accumulates in FP64
  and rounds to FP32 first: the two differ by FP32 reassociation before the BF16 cast.)

Active rows.  ``num_tokens`` (INT32 ``[1]``, read in-kernel) counts the active rows; the
projection loop covers only the row tiles below it (the last tile's ``valid_shape`` stops at
row ``num_tokens - 1``, so no padding row of ``qr``, ``x`` or the rope rows is read) and a
loop before it writes zeros to rows ``num_tokens .. tokens - 1`` of ``q`` and ``weights``.  The
caller validates ``num_tokens`` to ``[0, tokens]`` before launch
(``harness.entries.index_query.validate_launch``).

RoPE rows.  ``rope_cos``/``rope_sin`` are the ``rope_rows`` kernel's output for the
COMPRESSED profile's tables (``goldens.rope.materialize_rope_rows``): a negative position
arrives as cos 1 / sin 0 (identity), and rows at or past ``num_tokens`` hold whatever the
caller left there (never read here).

Cost model (A5): FLASH T=192 ~3.36 ms and T=512 ~9.0 ms (51x the vector roofline) when
``wq_b`` (``H * Dh x q_lora`` elements) was decoded once per 64-row tile; it is now
decoded once per launch.  ``MX(qr)`` in 4-token tiles that are one task each
and one row loop per head: T=192 (190 active) 194.5 -> 165.6 us.  That schedule's head
products waited for one ``MX(qr)`` writer task only (pypto 0.2.0 tracks the dynamic rows
of ``qrq`` as one cell): ordered after every piece of their row tile (one join task,
:func:`v41.rope_heads.mx_row_tile`), FLASH T=192 101.1 -> 211.6 us, T=48 ~94 -> 110.7 us;
``MX(qr)`` by a column-block loop instead of 4-token pieces unrolled at trace time: T=4 /
48 / 192 105.3 / 110.7 / 211.6 -> 84.4 / 85.9 / 136.5 us, compile CPU at T=192 3.9 -> 0.9 s.
With the zero-padding loop after the row loop, the launches with padding rows idled: T=192
(190 active) 221.0 us (170 k cycles with no core busy before the head products); with it
first, 144.0 us (134.8 with the 4-token pieces).  Launches of several row tiles were slower
than with the pieces (each row tile's ``IQ_QRQ`` iterations are root functions of the
launch, at most 128 per stitched submission): T=512 (500 active) 303.5 -> 403.7 us, T=512
312.9 -> 420.6 us; built for more tokens than one row tile, the kernel unrolls the column
blocks in the row iteration instead: 403.7 -> 283.3 us, 420.6 -> 259.8, T=384 272.9 ->
260.9 (unrolled in a one-tile launch: T=192 (190 active) 144.0 -> 164.0 us, the vector
merge pairing the unrolled blocks, 432 -> 422 tasks).  A one-tile launch of more than
``CLONE_ROWS`` rows (now any launch) has each head copy the ``MX(qr)`` join tile first
(:func:`v41.rope_heads.project_heads_tile`'s ``clone_rows``; the join's three tasks had
321 / 225 / 129 successor edges, the head products waiting for their serial resolve):
T=192 136.5 -> 132.1 us (383 -> 447 tasks), (190 active) 144.0 -> 137.2.  Copies in every
launch: T=4 / 48 84.4 / 85.9 -> 86.9 / 88.4 us, T=512 (500 active) 291.7 -> 326.1, T=384
260.9 -> 205.6 (not taken: the 500-row launch).  Tried: each head its own E4M3 table 143.0
us; each head its own rope constants 189.6 us.  The join copy on the clones' ``[64, q_lora]``
vector tiles instead of ``[64, 1024]`` + ``[64, 256]`` (:func:`v41.rope_heads.mx_row_tile`):
every head's clone read 8 join tile pairs, 257 successor edges on one join task (~100 k
serial AICPU cycles, the last head's clone started 92 k cycles after the join), now 65 + 33
on its two tasks: FLASH T=4 / 48 / 192 84.4 / 85.9 / 132.1 -> 80.3 / 81.1 / 102.3 us, (190
active) 137.2 -> 105.5; with it the clones pay off in launches of several row tiles too
(T=512 (500 active) 303.5 -> 279.2 without them, 262.5 with; T=512 269.9 -> 229.7, T=384
201.7 -> 166.4).  Tried after it: join and clones on 96-row tiles (one task each, 2 edges
a head) 103.3 us; HEAD_TILE_ROWS 96 104.8; MX_COLS 32 107.6; the rope rows' ``cos @
expand`` / ``(sin @ expand) * sign`` built once per row tile for every head 114.2; two heads
per IQ_HEADS iteration sharing one clone 121.9 (the merge paired their stages).
Each head's chain after the clone was 8 dependent tasks (product, K-partial add + cast,
``x @ swap`` on the cube, rotation, store ...; ~5-12 k cycles per hop): now
:func:`_fused_heads` decodes the head's rope rows a second time pair-swapped into the same
tile (``hd + rd`` rows), so one product yields the swapped tail too, and every vector stage
after it is one subgraph: FLASH T=4 / 48 / 192 80.3 / 81.1 / 102.3 -> 66.9 / 71.1 / 87.8 us
(446 -> 284 tasks), (190 active) 105.5 -> 96.6, T=512 (500 active) 258.6 -> 212.0, TINY
gate 32.4 -> 22.8.  Now the 32 products (25 k cycles each, 28 cube cores: two waves) wait
for the clones, which start one by one as the join's 65 successor edges resolve (60 k ->
~90 k).  Tried: the weight swap as ``swap @ W_tail`` on the cube with a second product
124.4 us; gather + concat of the decoded BF16 rows 142.6; the ``x @ swap`` matmul kept
between two fused vector subgraphs 98.0; the two products split (128 + 64 columns) 104.3
(the cube cost is mostly the shared ``[192, q_lora]`` operand); the id constants built
once before the head loop 89.9; MX_COLS 32 95.2; fused vector tiles of 96 / 48 / 32 rows
89.0 / 87.8 / 111.2 (192 exceeds the UB).
Then (h25) the AICPU's serial resolves and the vector cores' copy-ins were the bound: the
rope constants before the loop (sign 65 and expand 64 successors, 25 k cycles each) and
the E4M3 table (33) held their AICPUs while the join's 65 + 33 edges waited; the decodes
(58 k cycles, 30 copy-ins of ~1.4 k) started one by one behind the table.  Now each head
builds its constants (the sign folded into a second expansion) and its table and row ids
inside its decode task (no predecessors; 12 ``[640, 32]`` decode tiles: 45 k cycles), the
join writes ``[rows, 320]`` column tiles that the products read directly (no clones: 4
edges a head, ~33 on each join task), the row iteration merges no vector subgraphs (the
join tiles resolve on four AICPUs, a head's two 96-row vector tiles run in parallel) and
each product is one matmul over the whole K in 640-wide L1 pieces (4 copy-ins instead of
8; :data:`WHOLE_K_PIECES`, FP32 bits change).  FLASH T=4 / 48 / 192 66.9 / 71.1 / 87.8 ->
52.3 / 53.3 / 67.7 us (3.8x -> 2.95x; 75.7 keeping the K pieces), (190 active) 96.6 ->
76.0, T=512 (500 active) 209.6 -> 176.3, TINY gate 22.8 -> 19.2.  Left at T=192: the
decodes and the join's resolves end at ~60-76 k cycles, 32 products of 22.5 k on 28 cube
cores (two waves, 62 -> 115 k), a vector tile of 6.5 k after a 3-5 k hop (end ~125 k).
Tried: join tiles of 256 / 160 columns 73.6 / 74.8 us; decode tiles of 768 groups 91.1
(960 exceeds the UB); 64-row vector tiles 69.8; the head loop's vector tiles merged in
pairs 71.5; the product's K partials as two cube tasks (no cube merge) 94.3 before the rest.

ABI
---
==============  ==================================  ========  =====
name            shape                               dtype     role
==============  ==================================  ========  =====
qr              (tokens, q_lora_rank)               bfloat16  in   (qkv_proj_rope's qr)
rope_cos        (tokens, rope_dim / 2)              float32   in   (rope_rows, compressed)
rope_sin        (tokens, rope_dim / 2)              float32   in
wq_b            (H * Dh, q_lora_rank)               uint8     in   (E4M3 codes)
wq_b_scale      (H * Dh / 32, q_lora_rank / 32)     uint8     in   (E8M0 codes)
x               (tokens, hidden)                    bfloat16  in
weights_proj    (hidden, H)                         bfloat16  in
num_tokens      (1,)                                int32     in   (active rows)
q               (tokens, H * Dh)                    bfloat16  out  ([T, H, Dh])
weights         (tokens, H)                         bfloat16  out
qrq             (tokens, q_lora)                    bfloat16  out  (scratch: MX(qr))
==============  ==================================  ========  =====

``tokens`` from ``case["tokens"]`` (>= 1) is a dynamic axis; ``num_tokens`` is a runtime
value in ``[0, tokens]``.  The index query is replicated (every TP rank computes all ``H``
heads), so there is no ``tp`` dimension.
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
import struct

from v41 import mx_decode, mx_linear, rope_tail
from v41.abi import Arg, case_int, jit_options, resolve
from v41.cube_tiles import L1_BYTES, cube_tiles, row_tile
from v41.rope_heads import CLONE_ROWS, column_block, mx_row_tile, mx_rows, project_heads_tile
from v41.subgraph import one_subgraph

# Merge pairs of same-structure vector subgraphs of a loop iteration into one task: fewer
# tasks and dependency edges for the AICPU to resolve (the partition only; outputs unchanged).
# FLASH T=192 (190 active) 255 -> 195 us, T=512 846 -> 641 us; TINY 51.0 -> 49.7 us (merging
# 4: 193 us at T=192 and 53.2 us at TINY).  Cube pairs too (``cube_nbuffer_setting``: a
# head's two K-half products, its cos / sin expansions): 472 -> 408 tasks, FLASH T=192 (192
# active) 126.6 -> 114.7 us, T=4 76.9 -> 79.5 us.  The merge keeps every dependency edge (a
# merged task lists each member's), so the AICPU's serial resolves stay: the last MX(qr)
# tile's 129 successors (50 k cycles, the head products wait on it) and the rope constants'
# 65-67 each (expand, swap, sign: ~25 k cycles each, one thread).  Tried: no vector merge on
# the MX(qr) loop (per-loop ``set_pass_options``) 118.5 us; the head loop's vector stages
# unmerged 115.8 us, merged by 4 129.9 us; HEAD_TILE_ROWS 96 / 32 with the cube merge 127.6
# / 120.1 us.
PASS_OPTIONS = {"vec_nbuffer_setting": {-2: 1, -1: 2}, "cube_nbuffer_setting": {-1: 2}}

ROW_TILE = 192  # most tokens per row tile (wq_b is decoded once per launch)
N_TILE = 128  # weight output rows decoded per tile
# MX(qr) column blocks (rope_heads.column_block): ~MX_ELEMS elements, >= MX_COLS channels
# (FLASH T=4 / 48 / 192: 84.4 / 85.9 / 136.5 us; 128 / 4096: 103.9 / 83.2 / 137.7;
# 32 / 1024: 85.0 / 100.2 / 128.7)
MX_ELEMS = 16 * 128
MX_COLS = 64
# Rows of the vector tiles after each head's product (BF16 cast, rope tail, stores; also
# :func:`_fused_heads`' one vector subgraph): FLASH
# T=192 (190 active) 165.0 -> 126.6 us, tasks 773 -> 472, with 64 instead of 8 / 16 rows
# (32: 127.7 us, 96: 136.3 us); the K partial sums follow (rope_heads.tile_product).
HEAD_TILE_ROWS = 64
# :func:`_fused_heads`: rows of its vector tiles (two tasks a head at 192 rows; 64 rows:
# three tasks, FLASH T=192 69.8 us against 67.7), groups per tile of its weight decode
# (``[640, 32]``: 12 tiles of two copy-ins each instead of 15, T=192 71.1 -> 67.7 us;
# ``[768, 32]`` 91.1, ``[960, 32]`` exceeds the UB), and the columns of the MX(qr) join's
# ``[rows, 320]`` tiles (:func:`_join_tile`; 256 / 160: 73.6 / 74.8 us)
FUSED_TILE_ROWS = 96
DECODE_GROUP_ROWS = 640
JOIN_COLS = 320
# True: each head's product is ONE matmul over the whole K with L1 K tiles of a whole
# :func:`v41.mx_linear.k_chunk` view (640 at FLASH: 4 copy-ins a head instead of 8, one
# FP32 result for the vector task to read): FLASH T=192 75.7 -> 67.7 us.  It changes the
# FP32 sums' association (K pieces 640 + 640 instead of 512 + 128 + 512 + 128: 2 of 196,608
# BF16 q values one ulp apart at FLASH T=48, the harness passes); False keeps the K partial
# products of :func:`v41.mx_linear.k_partials` and their bits.  TINY (q_lora 64) is one
# piece either way.
WHOLE_K_PIECES = True


def _join_tile(pypto, qr, qrq, start, rows, valid, mx_cols, mx_loop):
    """``MX(qr)`` of one row tile into ``qrq`` (:func:`v41.rope_heads.mx_rows`), then the
    rows copied (times 1.0, exact) into the returned ``[rows, q_lora]`` BF16 tile in
    ``[rows, JOIN_COLS]`` column tiles, each one task (the row loop does not merge vector
    subgraphs): every ``MX(qr)`` block has one successor, and each head's product reads
    the join directly (no clone), one edge per join tile and L1 K piece it overlaps --
    4 at FLASH, so each join task resolves ~33 edges (13 k cycles) on its own AICPU."""
    ql = qr.shape[1]
    mx_rows(pypto, qr, qrq, start, rows, valid, mx_cols, mx_loop)
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(rows, mx_linear.k_chunk(ql, JOIN_COLS))
        return pypto.mul(pypto.view(qrq, [rows, ql], [start, 0], valid_shape=[valid, ql]), 1.0)


def _head_rope_consts(pypto, rd, inverse):
    """FP32 ``(expand, expand_s)`` ``[rd / 2, rd]``, one task without predecessors in the
    head's iteration (a constant before the loop had all 32 heads' expansions as
    successors: 64 edges, 25 k serial AICPU cycles that held back other tasks' resolves):
    ``expand[i, j] = 1`` where ``j // 2 == i`` (``cos @ expand`` repeats each pair's cos,
    exactly) and ``expand_s`` the same times the rotation's sign of column ``j``
    (:func:`v41.rope_tail.rope_factors`), so ``sin @ expand_s`` is ``(sin @ expand) *
    sign`` exactly (one nonzero term a column) and the vector task needs no sign row."""
    half = rd // 2
    with one_subgraph(pypto):
        _, pair, odd = rope_tail.pair_columns(pypto, rd)
        # sign + 1: 2 on re, 0 on im (inverse); forward the opposite
        sp1 = pypto.add(pypto.mul(odd, -2.0), 2.0) if inverse else pypto.mul(odd, 2.0)
        expand = rope_tail.pair_expansion(pypto, pair, rd, half)
        # expand * (sign + 1) - expand: the sign on the pair's entries, +0 elsewhere
        expand_s = pypto.sub(pypto.mul(expand, pypto.expand_clone(pypto.reshape(sp1, [1, rd]),
                                                                  [half, rd])), expand)
    return expand, expand_s


def _factors(pypto, rd, inverse, fused):
    """:func:`v41.rope_tail.rope_factors` for rope_heads' path; None for the fused heads
    (their constants are built in each head, :func:`_head_rope_consts`)."""
    return None if fused else rope_tail.rope_factors(pypto, rd, inverse=inverse)


def _row_pass_options(pypto, fused):
    """In the row iteration of the fused heads (and its nested loops), no merging of
    same-structure vector subgraphs: the join's column tiles and the heads' vector tiles
    each run as their own task, so their successor edges resolve on several AICPUs and the
    vector tiles run in parallel (FLASH T=192 84.3 -> 67.7 us)."""
    if fused:
        pypto.set_pass_options(vec_nbuffer_setting={-2: 1, -1: 1})


def _fused_heads(pypto, a, w, w_scale, out, start, rows, valid, heads, hd, k, rope_cos,
                 rope_sin, rd, cube, inverse):
    """``out[start : start + valid, h * hd ...] = [RoPE([a @ W_h^T])]`` for every head ``h``
    (``hd <= N_TILE``) from the join tile ``a`` (:func:`_join_tile`, read directly).  Each
    head's iteration holds three chains that start with the launch: the rope constants
    (:func:`_head_rope_consts`) and the rope rows' expansions on the cube; ONE decode task
    (its own E4M3 table, row ids and scale rows: no predecessor) of ``hd + rd`` weight rows
    -- its own ``hd`` rows, then its rope rows with each (re, im) pair exchanged (exact row
    gathers of the E4M3 codes and their E8M0 scale rows); then one product, and one vector
    subgraph per ``FUSED_TILE_ROWS`` rows (BF16 cast, NoPE store, rotation, rope store):
    the pair-swapped tail is the product's last ``rd`` columns (column ``j`` of a product
    depends only on weight row ``j``: the same bits as ``[y_tail] @ swap``)."""
    nope = hd - rd
    kg = k // 32
    n = hd + rd
    tr = min(rows, FUSED_TILE_ROWS)
    kc = mx_linear.k_chunk(k)
    ct = cube_tiles(rows, kc, n, 2)
    whole_k = (WHOLE_K_PIECES and (ct[0][1] + ct[2][1]) * kc * 2 <= L1_BYTES
               and kc % ct[1][0] == 0)
    if whole_k:  # L1 K tiles of a whole k_chunk view
        ct = (ct[0], [ct[1][0], kc], ct[2])
    for h in pypto.loop(heads, name="IQ_HEADS", idx_name="h"):
        expand, expand_s = _head_rope_consts(pypto, rd, inverse)
        with one_subgraph(pypto):
            table = mx_decode.e4m3_table(pypto)
            # row ids of the decoded tile: the head's rows, then its rope rows with each
            # pair exchanged, and their scale rows
            pypto.set_vec_tile_shapes(n)
            jj = pypto.arange(0.0, float(n), 1.0)
            odd = pypto.sub(jj, pypto.mul(pypto.floor(pypto.mul(jj, 0.5)), 2.0))
            m = pypto.floor(pypto.mul(pypto.add(jj, 0.5), 1.0 / hd))  # 0: own rows, 1: swapped
            shift = pypto.mul(m, pypto.add(pypto.mul(odd, -2.0), float(1 - rd)))
            idf = pypto.add(jj, shift)
            ids = pypto.cast(idf, pypto.DT_INT32)
            sids = pypto.cast(pypto.floor(pypto.mul(pypto.add(idf, 0.5), 1.0 / 32)),
                              pypto.DT_INT32)
            pypto.set_vec_tile_shapes(16, k)
            codes = pypto.index_select(pypto.view(w, [hd, k], [h * hd, 0]), 0, ids)  # [n, k]
            pypto.set_vec_tile_shapes(hd // 32, kg)
            srows = pypto.view(w_scale, [hd // 32, kg], [h * (hd // 32), 0])
            pypto.set_vec_tile_shapes(16, kg)
            srep = pypto.index_select(srows, 0, sids)  # [n, kg] uint8, exact
            wt = mx_linear.whole_row_steps(pypto, codes, srep, table, 0, n, k, 32,
                                            group_rows=DECODE_GROUP_ROWS)
        pypto.set_cube_tile_shapes(*ct)
        if whole_k:
            pypto.set_vec_tile_shapes(min(rows, 16), kc)
            av = pypto.view(a, [rows, k], [0, 0], valid_shape=[valid, k])
            parts = [pypto.matmul(av, wt, pypto.DT_FP32, b_trans=True)]
        else:
            parts = list(mx_linear.k_partials(pypto, a, 0, rows, valid, wt, n, k))
        pypto.set_cube_tile_shapes(*cube)
        cos_t, sin_t = rope_tail.row_views(pypto, rope_cos, rope_sin, start, rows, valid)
        cw, sw = rope_tail.expanded_rows(pypto, cos_t, sin_t, expand, rows, valid,
                                         FUSED_TILE_ROWS, expand_sin=expand_s)
        col = h * hd
        with one_subgraph(pypto):
            pypto.set_vec_tile_shapes(tr, n)
            y = parts[0]
            for mm in parts[1:]:
                y = pypto.add(y, mm)
            yb = pypto.cast(y, pypto.DT_BF16)
            if nope:
                pypto.set_vec_tile_shapes(tr, nope)
                # times 1.0 (exact): the store stays in this task (a view's store is a
                # copy task of its own)
                pypto.assemble(pypto.mul(pypto.view(yb, [rows, nope], [0, 0],
                                                    valid_shape=[valid, nope]), 1.0),
                               [start, col], out)
            pypto.set_vec_tile_shapes(tr, rd)
            x32 = pypto.cast(pypto.view(yb, [rows, rd], [0, nope], valid_shape=[valid, rd]),
                             pypto.DT_FP32)
            xs = pypto.cast(pypto.view(yb, [rows, rd], [0, hd], valid_shape=[valid, rd]),
                            pypto.DT_FP32)
            pypto.assemble(rope_tail.rotate(pypto, x32, xs, cw, sw), [start, col + nope], out)


VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "inverse_rope": "de-rotates the rope tails (inverse RoPE) instead of rotating them",
    "no_weight_scale": "leaves out the Dh^-0.5 * H^-0.5 factor of the head weights",
    "skip_padding": "leaves rows at or past num_tokens unwritten",
    "compute_padding": "projects every row, also rows at or past num_tokens (padding rows "
                       "get values computed from padding inputs instead of zeros)",
}

ABI = (
    Arg("qr", ("tokens", "q_lora"), "bfloat16", "in"),
    Arg("rope_cos", ("tokens", "half"), "float32", "in"),
    Arg("rope_sin", ("tokens", "half"), "float32", "in"),
    Arg("wq_b", ("q_width", "q_lora"), "uint8", "in"),
    Arg("wq_b_scale", ("q_width_blocks", "q_lora_blocks"), "uint8", "in"),
    Arg("x", ("tokens", "hidden"), "bfloat16", "in"),
    Arg("weights_proj", ("hidden", "heads"), "bfloat16", "in"),
    Arg("num_tokens", (1,), "int32", "in"),
    Arg("q", ("tokens", "q_width"), "bfloat16", "out"),
    Arg("weights", ("tokens", "heads"), "bfloat16", "out"),
    Arg("qrq", ("tokens", "q_lora"), "bfloat16", "out"),
)


def weight_scale(config) -> float:
    """The head-weight factor ``Dh^-0.5 * H^-0.5`` rounded to FP32 (the golden's constant)."""
    ix = config.index
    return struct.unpack("f", struct.pack("f", ix.head_dim ** -0.5 * ix.n_heads ** -0.5))[0]


def dims(config, case: dict) -> dict[str, int]:
    """Named dimensions of one launch; raises ValueError naming the bad field."""
    ix, ql = config.index, config.q_lora_rank
    if ix.head_dim < config.rope_dim:
        raise ValueError(f"config.index.head_dim: {ix.head_dim} is narrower than rope_dim "
                         f"{config.rope_dim}")
    qw = ix.n_heads * ix.head_dim
    return {"tokens": case_int(case, "tokens", minimum=1), "hidden": config.hidden_size,
            "half": config.rope_dim // 2, "q_lora": ql, "q_width": qw, "heads": ix.n_heads,
            "head_dim": ix.head_dim, "q_lora_blocks": ql // 32, "q_width_blocks": qw // 32}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def build(config, case: dict | None = None, *, variant: str = "reference",
          rows_per_tile: int | None = None,
          runtime_options: dict | None = None):
    """The jit kernel ``index_query(qr, rope_cos, rope_sin, wq_b, wq_b_scale, x,
    weights_proj, num_tokens, q, weights, qrq)``: rows below ``num_tokens`` projected, the
    rest zero (``qrq`` is scratch)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    d = dims(config, case or {"tokens": 1})
    hidden, half, ql, qw = d["hidden"], d["half"], d["q_lora"], d["q_width"]
    heads, hd, rd = d["heads"], d["head_dim"], config.rope_dim
    h_tile = max(heads, 16)  # last vector tile axis of the BF16 weights: >= 32 bytes
    scale = 1.0 if variant == "no_weight_scale" else weight_scale(config)
    inverse = variant == "inverse_rope"
    compute_padding = variant == "compute_padding"
    zero_padding = variant not in ("skip_padding", "compute_padding")
    rows = row_tile(d["tokens"], ROW_TILE, rows_per_tile)
    mx_cols = column_block(ql, rows, MX_ELEMS, MX_COLS)
    # several row tiles: the MX(qr) blocks unrolled in the row iteration (fewer root
    # functions per stitched submission); one: the nested loop IQ_QRQ
    mx_loop = None if d["tokens"] > rows else "IQ_QRQ"
    # the fused heads (:func:`_fused_heads`), or rope_heads' tiles for heads over N_TILE
    # rows, where row tiles of several join-copy tiles have each head copy the join first
    fused = hd <= N_TILE
    clone = rows > CLONE_ROWS
    cube = cube_tiles(rows, mx_linear.k_chunk(ql), N_TILE, 2)  # BF16 operands
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")
    bf16, fp32 = pypto.DT_BF16, pypto.DT_FP32

    @pypto.frontend.jit(runtime_options=options, pass_options=PASS_OPTIONS)
    def index_query(
        qr: pypto.Tensor([tokens_dim, ql], pypto.DT_BF16),
        rope_cos: pypto.Tensor([tokens_dim, half], pypto.DT_FP32),
        rope_sin: pypto.Tensor([tokens_dim, half], pypto.DT_FP32),
        wq_b: pypto.Tensor([qw, ql], pypto.DT_UINT8),
        wq_b_scale: pypto.Tensor([qw // 32, ql // 32], pypto.DT_UINT8),
        x: pypto.Tensor([tokens_dim, hidden], pypto.DT_BF16),
        weights_proj: pypto.Tensor([hidden, heads], pypto.DT_BF16),
        num_tokens: pypto.Tensor([1], pypto.DT_INT32),
        q: pypto.Tensor([tokens_dim, qw], pypto.DT_BF16),
        weights: pypto.Tensor([tokens_dim, heads], pypto.DT_BF16),
        qrq: pypto.Tensor([tokens_dim, ql], pypto.DT_BF16),
    ):
        tokens = qr.shape[0]
        if compute_padding:
            active = tokens
        else:
            active = num_tokens[0]
        pypto.set_cube_tile_shapes(*cube)
        factors = _factors(pypto, rd, inverse, fused)
        if zero_padding:  # rows active .. tokens - 1: zeros
            for p in pypto.loop((tokens - active + rows - 1) // rows, name="IQ_PADDING",
                                idx_name="p"):
                start = active + p * rows
                valid = (tokens - start).min(rows)
                pypto.set_vec_tile_shapes(rows, h_tile)
                pypto.assemble(pypto.full([rows, heads], 0.0, bf16, valid_shape=[valid, heads]),
                               [start, 0], weights)
                pypto.set_vec_tile_shapes(min(rows, 8), min(qw, 1024))
                pypto.assemble(pypto.full([rows, qw], 0.0, bf16, valid_shape=[valid, qw]),
                               [start, 0], q)

        for i in pypto.loop((active + rows - 1) // rows, name="IQ_ROWS", idx_name="r"):
            _row_pass_options(pypto, fused)
            start = i * rows
            valid = (active - start).min(rows)
            # weights = [[x @ weights_proj] * scale]
            pypto.set_vec_tile_shapes(min(rows, 8), min(hidden, 1024))
            xv = pypto.view(x, [rows, hidden], [start, 0], valid_shape=[valid, hidden])
            w32 = pypto.matmul(xv, weights_proj, fp32)  # [rows, heads]
            pypto.set_vec_tile_shapes(rows, h_tile)
            w_t = pypto.cast(pypto.mul(pypto.cast(pypto.cast(w32, bf16), fp32), scale), bf16)
            pypto.assemble(pypto.view(w_t, [rows, heads], [0, 0], valid_shape=[valid, heads]),
                           [start, 0], weights)
            # MX(qr) of the row tile (also to the scratch qrq), then q_h = [RoPE([MX(qr) @
            # wq_b_h^T])] for each head
            if fused:
                qa = _join_tile(pypto, qr, qrq, start, rows, valid, mx_cols, mx_loop)
                _fused_heads(pypto, qa, wq_b, wq_b_scale, q, start, rows, valid, heads, hd, ql,
                             rope_cos, rope_sin, rd, cube, inverse)
            else:
                qa = mx_row_tile(pypto, qr, qrq, start, rows, valid, mx_cols, mx_loop)
                project_heads_tile(pypto, qa, wq_b, wq_b_scale, q, start, rows, valid, heads,
                                   hd, ql, rope_cos, rope_sin, factors, rd, N_TILE, "IQ_HEADS",
                                   tile_rows=HEAD_TILE_ROWS, clone_rows=clone)

    return index_query
