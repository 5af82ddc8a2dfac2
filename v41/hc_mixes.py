"""mHC mixes kernel: a site's ``(pre, post, comb)`` from its input lanes
(golden: ``goldens.mhc.hc_mixes``, which returns ``HcMixes(pre, post, comb)``).

``flat = x_hc.reshape(T, hc*D)`` (FP32); ``mixes = (flat @ fn^T) * rsqrt(mean(flat^2) +
rms_norm_eps)`` [FP32 accumulation; one unweighted RMS statistic over the whole ``hc*D``
row]; with ``s = scale``, ``b = base``, ``hc_eps = config.hc.eps``:

* ``pre  = sigmoid(mixes[:hc]*s0 + b[:hc]) + hc_eps``                      ``[T, hc]``
* ``post = 2*sigmoid(mixes[hc:2hc]*s1 + b[hc:2hc])``                       ``[T, hc]``
* ``comb = sinkhorn(reshape(mixes[2hc:]*s2 + b[2hc:], hc, hc))``           ``[T, hc, hc]``

Sinkhorn: EXACTLY ``config.hc.sinkhorn_iters`` passes (the pass count is part of the math):
pass 1 ``M = softmax_row(logits) + eps; M /= colsum(M) + eps``; passes 2..n
``M /= rowsum(M) + eps; M /= colsum(M) + eps`` (``comb[t, in, out]``, rows = in lanes).
The passes are unrolled at trace time on ``[rows, hc, hc]`` tiles (launches of more than
SPLIT_K_MAX_ROW_TILES row tiles: on one transposed 2-D tile, :func:`_comb_tile`).

Schedule (FLASH, estimate / roofline): T = 4 / 48 / 192 / 384: 35.7 / 77.0 / 80.3 / 94.6 ->
31.7 / 65.8 / 49.9 / 77.0 -> 31.7 / 65.8 / 45.2 / 64.7 -> 31.7 / 65.8 / 33.8 / 52.5 us
(T=192: 6.5x -> 4.0x -> 3.7x -> 2.7x).  The bound is the AICPU task graph: constants built
per row iteration (not once with an edge to every iteration), 20 cube tasks an iteration,
then ONE fused task a 96 rows (:func:`_fused_tile`: K-tile adds, RMS factor, pre / post and
Sinkhorn; see the constants below).  At T=192 the products end at 46.3 k cycles, the last
fused task runs 49.4 -> 70.3 k (4.9 k copy-ins, 11 k Sinkhorn, 3.1 k writing comb).

The mean of squares is summed lane by lane (``sum_h sum_d x[h, d]^2``) so that each
reduction stays inside one ``[rows, D]`` vector tile.

ABI
---
======  ======================  ========  =====
name    shape                   dtype     role
======  ======================  ========  =====
x_hc    (tokens, hc, hidden)    float32   in
fn      (mix_hc, hc_dim)        float32   in
scale   (3,)                    float32   in
base    (mix_hc,)               float32   in
pre     (tokens, hc)            float32   out
post    (tokens, hc)            float32   out
comb    (tokens, hc, hc)        float32   out
======  ======================  ========  =====

``mix_hc = (2 + hc) * hc``, ``hc_dim = hc * hidden``; ``tokens`` from ``case["tokens"]``
(>= 1) is a dynamic axis.
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41.abi import Arg, case_int, jit_options, resolve
from v41.subgraph import one_subgraph

ROW_TILE = 8  # rows per loop iteration up to SPLIT_K_MAX_ROW_TILES row tiles
# FP32 elements per vector tile of the sum of squares (80 KiB): [4, 5120] at FLASH; the old
# 8,192 gave one-row tiles, 16 small vector tasks a loop iteration.
VEC_TILE_FP32_ELEMS = 20480
# FLASH T=192 122.4 -> 114.0 us.  (A matmul K tile of 2,048 instead of 1,024 gave 108.3 us
# and T=7 62.7 us, but it changes the FP32 accumulation order of the matmul's output.)
MATMUL_K_TILE = 1024
# Launches of at most this many ROW_TILE tiles take the product as one cube task per K tile
# (:func:`_split_k_product`): at FLASH T=7 the one product task was 98.9 k of the launch's
# 153 k cycles (20 K tiles on one cube core).  T = 4 / 7 / 16 / 48: 78.7 / 78.7 / 79.0 /
# 85.5 -> 50.1 / 50.1 / 54.0 / 77.0 us.
SPLIT_K_MAX_ROW_TILES = 6
# Larger launches: BIG_ROW_TILE rows per loop iteration, also split by K tile.  With 8-row
# tiles the product was one cube task per row tile (FLASH T=192: 24 tasks of 98.9 k cycles,
# 97 k of them on MTE_IN copying fn's [24, 1024] K tiles again for every row tile; 114.0
# us; 20 K-tile tasks per 8-row tile: 184.2 us); now 80.3 us.  The products are [96, 1024]
# per K tile: the CPU interpreter's FP32 matmul may sum them in another order than 8-row
# products, so these launches' bits differ from the 8-row schedule's (inside the bounds:
# TINY T=192 post row RMS 0.0018 -> 0.0064 % of its bound).
BIG_ROW_TILE = 96
# Past 2 * BIG_ROW_TILE tokens, HUGE_ROW_TILE rows: with 96 the runtime ran the iterations two
# at a time (FLASH T=512 228.9 us, T=1024 481.9, against 211.1 / 426.7 with 8-row tiles);
# with 192: 188.2 / 321.5 (compile 1.8-2.5 s CPU against 0.6-0.9 at T <= 192).  Each such
# row tile takes two fused SINKHORN_ROWS tasks (with 96-row tiles and fused tasks FLASH
# T=384 was 68.1 us against 52.5).
HUGE_ROW_TILE = 192
# Cube M tile of those products, with an L0 K step of BIG_CUBE_K: [96, 128] FP32 operands
# fill 48 KiB of L0A.  With 16 the [96, 1024] products were 6x as many traced cube tiles
# (compile 1.03 -> 0.62 s CPU at FLASH T=192); M 48 / K step 256 was 40 cube tasks an
# iteration instead of 20 (FLASH T=192 69.6 -> 61.3 us, same bits).
BIG_CUBE_M = 96
BIG_CUBE_K = 128
# The K-tile partials of a one-tile or big launch go to one scratch row block and come back
# in one copy per GATHER_ROWS-row vector tile (one a SINKHORN_ROWS chunk in big launches; 20
# copies of 1.4 k cycles of GM latency each, one after the other, were 30 k of the adding
# task's 44 k; FLASH T=7 50.1 -> 35.7 us, same bits).  The copy is ``+ -0.0`` (exact for
# every value, -0.0 too): an ADDS, charged 606 cycles on [96, 480], not the 1,449 of a MULS
# by 1.0.  Between 2 and SPLIT_K_MAX_ROW_TILES tiles the scratch cost more (T=48 77.0 ->
# 130.9 us): those add the products straight from the cube's outputs.
GATHER_ROWS = 32
# Big launches (over SPLIT_K_MAX_ROW_TILES row tiles) take ONE task a SINKHORN_ROWS chunk
# of the row tile after its products (:func:`_fused_tile`): the partials read back and
# added, the RMS factor, ``z = mm * scale + base``, pre / post and Sinkhorn, each hop between
# tasks having cost ~3-6 k cycles of AICPU polling / resolving (FLASH T=192 separate add,
# pre / post and Sinkhorn tasks: 45.2 us; fused: 33.8).  Its copy-ins (1.4 k cycles of GM
# latency each, one after another) are the partials and ONE [96, 8 + 2 * mw] block of the
# kernel-local ``aux``: column 0 the sums of squares (written by their tasks: read straight
# from them, their last adds joined the fused task as 24 [4, 1] copy-ins), and in each
# chunk's first row the scale and base rows (built in every row iteration, one subgraph,
# :func:`_scale_base_rows`).  Sinkhorn runs on the logits transposed (``pypto.transpose``
# costs 1 cycle) and viewed as ``[hc, hc * rows]``, lane i a row, column ``j * rows + t``
# (:func:`_sinkhorn_w`): the column sums are one ``sum(-2)``, the row sums three adds of
# column blocks (the j order of ``sum(-1)``).  The cost model charges a vector op ~40-60
# cycles of latency and little per byte (and a 3-D op per 2-D slice), so a pass is ~11 ops,
# ~530 cycles, whatever the rows: 96 rows in 11 k cycles (stacked [4 * 96, 4] lanes, padded
# to 8 columns: 14.5 k; [hc * hc, 96] with per-lane sums: 13.7 k).  pre / post are
# transposed too ([2hc, rows] row views; a [rows, hc] column view at column hc went through
# extra tasks), comb goes back as [rows, hc, hc] through GM (3.1 k).  FLASH T=192 45.2 ->
# 33.8 us, T=384 64.7 -> 52.5, same bits; TINY T=64 / 150 / 200 now pass the lowered
# verification (the old big path's pass calculator could not execute ExpandFunction).
# Tried: Sinkhorn on [4, 4 * rows] built by concatenating views along columns (split into
# 13 tasks, 56.7 us), comb written by two 3-D transposes (a task of its own, 36.9 us),
# 96-row fused tiles past 192 tokens (T=384 68.1 us against 52.5), pre / post read from
# the fused task's product in tasks of their own (they wait for the whole task: 40.7 us).
# Before (stacked lanes in Sinkhorn tasks of their own): 48- / 24-row tasks 44.4 / 43.7 us
# but compile 1.6 / 1.9-2.2 s CPU against 0.85-1.1 at T=4, a nested loop 84-85 us, the
# lanes as four [rows, hc] tiles 33.5 k cycles a task, the result through a
# [tokens, hc*hc] scratch (cycle in the task graph), a reshaped output (pypto 0.2.0 drops
# writes to an in-place reshape of an output).  The fused task reads rows written in its
# own row iteration (a Sinkhorn loop of its own after the row loop read the first
# iteration's rows unordered: pypto 0.2.0 tracks a dynamic axis as one cell).
SINKHORN_ROWS = 96

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "short_sinkhorn": "runs one Sinkhorn pass fewer than config.hc.sinkhorn_iters",
    "half_sinkhorn": "runs half of config.hc.sinkhorn_iters Sinkhorn passes",
    "row_last": "ends each Sinkhorn pass on the row normalization (row/col swapped)",
    "no_rms": "omits the rsqrt(mean(flat^2) + eps) factor",
}

ABI = (
    Arg("x_hc", ("tokens", "hc", "hidden"), "float32", "in"),
    Arg("fn", ("mix_hc", "hc_dim"), "float32", "in"),
    Arg("scale", (3,), "float32", "in"),
    Arg("base", ("mix_hc",), "float32", "in"),
    Arg("pre", ("tokens", "hc"), "float32", "out"),
    Arg("post", ("tokens", "hc"), "float32", "out"),
    Arg("comb", ("tokens", "hc", "hc"), "float32", "out"),
)


def dims(config, case: dict) -> dict[str, int]:
    return {"tokens": case_int(case, "tokens", minimum=1), "hc": config.hc.hc_mult,
            "hidden": config.hidden_size, "mix_hc": config.mix_hc, "hc_dim": config.hc_dim}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def _sigmoid(pypto, x):
    """``1 / (1 + exp(-x))``; ``pypto.sigmoid`` builds its ones at the full tile shape and
    loses a tail tile's valid shape (DIVOpError on the last, partial row tile)."""
    return pypto.reciprocal(pypto.add(pypto.exp(pypto.mul(x, -1.0)), 1.0))


def _sinkhorn(pypto, logits, passes: int, eps: float, row_last: bool):
    """Sinkhorn on a ``[rows, hc, hc]`` tile (module level: traced, may return)."""
    m = pypto.exp(pypto.sub(logits, pypto.amax(logits, -1, keepdim=True)))
    m = pypto.add(pypto.div(m, pypto.sum(m, -1, keepdim=True)), eps)
    m = pypto.div(m, pypto.add(pypto.sum(m, -2, keepdim=True), eps))
    for _ in range(passes - 1):
        if row_last:
            m = pypto.div(m, pypto.add(pypto.sum(m, -2, keepdim=True), eps))
            m = pypto.div(m, pypto.add(pypto.sum(m, -1, keepdim=True), eps))
        else:
            m = pypto.div(m, pypto.add(pypto.sum(m, -1, keepdim=True), eps))
            m = pypto.div(m, pypto.add(pypto.sum(m, -2, keepdim=True), eps))
    return m


def _comb_logits(pypto, mm, sc_comb, b2, rows, valid, hc):
    """FP32 ``[rows, hc * hc]`` Sinkhorn logits ``mm[:, 2hc:] * scale + base`` (one op each)."""
    return pypto.add(pypto.mul(pypto.view(mm, [rows, hc * hc], [0, 2 * hc],
                                          valid_shape=[valid, hc * hc]), sc_comb),
                     pypto.view(b2, [1, hc * hc], [0, 2 * hc]))


def _sinkhorn_w(pypto, s, hc: int, passes: int, eps: float, row_last: bool, n: int):
    """:func:`_sinkhorn` on one ``[hc, hc * n]`` tile (row ``i``, column ``j * n + t`` is
    ``logits[t, i, j]``): the column sums are one ``sum(-2)``, the row sums the ``hc``
    column blocks added in ``j`` order (as ``sum(-1)`` adds them)."""
    w = hc * n

    def fold(s, op):  # the hc column blocks combined in j order: [hc, n]
        b = [pypto.view(s, [hc, n], [0, j * n]) for j in range(hc)]
        r = b[0]
        for m in b[1:]:
            r = op(r, m)
        return r

    def spread(r):  # [hc, n] back to [hc, hc * n]
        return pypto.concat([r] * hc, 1)

    def rownorm(s):
        return pypto.div(s, spread(pypto.add(fold(s, pypto.add), eps)))

    def colnorm(s):
        c = pypto.add(pypto.sum(s, -2, keepdim=True), eps)
        return pypto.div(s, pypto.expand_clone(c, [hc, w]))

    e = pypto.exp(pypto.sub(s, spread(fold(s, pypto.maximum))))
    s = pypto.add(pypto.div(e, spread(fold(e, pypto.add))), eps)
    s = colnorm(s)
    for _ in range(passes - 1):
        s = rownorm(colnorm(s)) if row_last else colnorm(rownorm(s))
    return s


def _comb_tile(pypto, z, sr, valid, hc, passes, eps, row_last, comb, start):
    """Sinkhorn of the ``[sr, hc * hc]`` logits tile ``z`` (``valid`` real rows) written to
    ``comb`` rows ``start ..``: transposed (``[hc * hc, sr]``, free in the UB), viewed as
    ``[hc, hc * sr]`` (lane ``i`` a row, :func:`_sinkhorn_w`), and back as ``[sr, hc, hc]``
    (that reshape goes through GM: one copy out, one in)."""
    w = max(sr, hc * hc)
    pypto.set_vec_tile_shapes(w, hc * w)
    zt = pypto.reshape(pypto.transpose(z, 0, 1), [hc, hc * sr])
    m = _sinkhorn_w(pypto, zt, hc, passes, eps, row_last, sr)
    m = pypto.transpose(pypto.reshape(m, [hc * hc, sr]), 0, 1)
    pypto.set_vec_tile_shapes(sr, hc, 8)
    pypto.assemble(pypto.reshape(m, [sr, hc, hc], valid_shape=[valid, hc, hc]),
                   [start, 0, 0], comb)


def _k_tile_products(pypto, flat, fn, rows, valid, k, n):
    """``(q, flat[:, K tile q] @ fn[:, K tile q]^T)`` for each ``MATMUL_K_TILE`` slice of K, in
    K order, one cube product each (FP32); the vector tile is left at ``[rows, 32]``."""
    for q in range(-(-k // MATMUL_K_TILE)):  # unrolled at trace time
        kq = min(MATMUL_K_TILE, k - q * MATMUL_K_TILE)
        xv = pypto.view(flat, [rows, kq], [0, q * MATMUL_K_TILE], valid_shape=[valid, kq])
        fv = pypto.view(fn, [n, kq], [0, q * MATMUL_K_TILE])
        mm = pypto.matmul(xv, fv, pypto.DT_FP32, b_trans=True)
        pypto.set_vec_tile_shapes(rows, 32)
        yield q, mm


def _gathered_split_k_product(pypto, flat, fn, rows, valid, k, n, parts, start,
                              gather_rows=GATHER_ROWS):
    """:func:`_split_k_product` with the K-tile products assembled side by side into rows
    ``start ..`` of the scratch ``parts [tokens, nq * n]`` and read back in one copy per
    ``gather_rows``-row tile (``+ -0.0``: exact), then added in K order from that copy: the
    same FP32 sums in the same order.  ``gather_rows=None``: products only (the caller
    reads them back with :func:`_gather_k_tiles`)."""
    for q, mm in _k_tile_products(pypto, flat, fn, rows, valid, k, n):
        pypto.assemble(mm, [start, q * n], parts)
    if gather_rows is None:
        return None
    pypto.set_vec_tile_shapes(gather_rows, -(-k // MATMUL_K_TILE) * n)
    return _gather_k_tiles(pypto, parts, rows, valid, -(-k // MATMUL_K_TILE), n, start)


def _gather_k_tiles(pypto, parts, rows, valid, nq, n, start):
    """The K-tile partials of rows ``start ..`` of ``parts``, read back in one copy and
    added in K order (the vector tile shape is the caller's)."""
    p = pypto.add(pypto.view(parts, [rows, nq * n], [start, 0], valid_shape=[valid, nq * n]),
                  -0.0)  # x + -0.0 == x for every x (-0.0 too): one copy-in, an ADDS
    acc = pypto.view(p, [rows, n], [0, 0], valid_shape=[valid, n])
    for q in range(1, nq):
        acc = pypto.add(acc, pypto.view(p, [rows, n], [0, q * n], valid_shape=[valid, n]))
    return acc


def _scale_base_rows(pypto, scale, base, aux, starts, hc, mix, mw):
    """The per-column scale row and the base row into ``aux`` rows ``starts`` (columns 8
    .. and 8 + mw ..; one subgraph, built in every row iteration), for the fused tasks' one
    copy-in."""
    with one_subgraph(pypto):
        s2 = pypto.reshape(scale, [1, 3])
        sb = [pypto.expand_clone(pypto.view(s2, [1, 1], [0, g]), [1, w])
              for g, w in enumerate((hc, hc, hc * hc))]
        b2 = pypto.add(pypto.reshape(base, [1, mix]), -0.0)
        for r in starts:
            for t, c0 in zip(sb, (0, hc, 2 * hc)):
                pypto.assemble(t, [r, 8 + c0], aux)
            pypto.assemble(b2, [r, 8 + mw], aux)


def _chunk_starts(valid, rows, sr):
    """Row offsets of the SINKHORN_ROWS chunks of a row tile; a tail's chunks overlap,
    never empty."""
    return [(valid - sr).max(0).min(c * sr) for c in range(rows // sr)]


def _plus(start, offsets):
    """``start + o`` for each offset (the jit body may not hold comprehensions)."""
    return [start + o for o in offsets]


def _fused_tile(pypto, parts, aux, rows, valid, nq, n, mw, hc, passes, eps, row_last, rms,
                start, pre, post, comb):
    """One task for the ``rows`` (SINKHORN_ROWS) rows ``start ..`` of a big launch: the
    K-tile partials read back and added, scaled by the RMS factor (``rms = (inv_count,
    rms_eps)`` or None; the sums of squares from ``aux`` column 0), then ``z = mm * scale
    row + base row`` (``aux`` row ``start``), pre / post from ``z[:, :2hc]`` and
    :func:`_comb_tile` on the Sinkhorn logits ``z[:, 2hc:]``: the same FP32 ops, element
    by element, as the small path's."""
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(rows, nq * n)
        mm = _gather_k_tiles(pypto, parts, rows, valid, nq, n, start)
        a = pypto.add(pypto.view(aux, [rows, 8 + 2 * mw], [start, 0],
                                 valid_shape=[valid, 8 + 2 * mw]), -0.0)  # one copy-in (exact)
        if rms is not None:
            sq = pypto.view(a, [rows, 1], [0, 0], valid_shape=[valid, 1])
            rstd = pypto.rsqrt(pypto.add(pypto.mul(sq, rms[0]), rms[1]))
            mm = pypto.mul(mm, rstd)
        z = pypto.add(pypto.mul(mm, pypto.view(a, [1, n], [0, 8])),
                      pypto.view(a, [1, n], [0, 8 + mw]))
        # pre / post transposed ([2hc, rows]: row views, no narrow column views)
        sg = _sigmoid(pypto, pypto.transpose(
            pypto.view(z, [rows, 2 * hc], [0, 0], valid_shape=[valid, 2 * hc]), 0, 1))
        pt = pypto.add(pypto.view(sg, [hc, rows], [0, 0], valid_shape=[hc, valid]), eps)
        pypto.assemble(pypto.transpose(pt, 0, 1), [start, 0], pre)
        qt = pypto.mul(pypto.view(sg, [hc, rows], [hc, 0], valid_shape=[hc, valid]), 2.0)
        pypto.assemble(pypto.transpose(qt, 0, 1), [start, 0], post)
        zc = pypto.view(z, [rows, hc * hc], [0, 2 * hc], valid_shape=[valid, hc * hc])
        _comb_tile(pypto, zc, rows, valid, hc, passes, eps, row_last, comb, start)


def _split_k_product(pypto, flat, fn, rows, valid, k, n):
    """FP32 ``flat @ fn^T`` as one cube product per ``MATMUL_K_TILE`` slice of K (each on
    its own cube core), added in K order on the vector cores: the same FP32 sums, in the
    same order, as one product whose L1 K tile is ``MATMUL_K_TILE`` (the interpreter adds
    its K-tile products one by one into a zeroed accumulator)."""
    acc = None
    for _, mm in _k_tile_products(pypto, flat, fn, rows, valid, k, n):
        acc = mm if acc is None else pypto.add(acc, mm)
    return acc


def build(config, case: dict | None = None, *, variant: str = "reference",
          runtime_options: dict | None = None):
    """The jit kernel ``hc_mixes(x_hc, fn, scale, base, pre, post, comb)``."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    hc, hidden = config.hc.hc_mult, config.hidden_size
    mix, hc_dim = config.mix_hc, config.hc_dim
    passes = config.hc.sinkhorn_iters
    if variant == "short_sinkhorn":
        passes -= 1
    elif variant == "half_sinkhorn":
        passes //= 2
    if passes < 1:
        raise ValueError(f"config.hc.sinkhorn_iters: {config.hc.sinkhorn_iters} must be >= 1")
    row_last = variant == "row_last"
    use_rms = variant != "no_rms"
    eps = float(config.hc.eps)
    rms_eps = float(config.rms_norm_eps)
    inv_count = 1.0 / hc_dim
    # schedule by the case's token count (trace time; tokens stays a dynamic axis)
    n_tokens = case_int(case, "tokens", default=ROW_TILE, minimum=1)
    row_tiles = -(-n_tokens // ROW_TILE)
    big = row_tiles > SPLIT_K_MAX_ROW_TILES
    if not big:
        rows = ROW_TILE
    else:
        rows = HUGE_ROW_TILE if n_tokens > 2 * BIG_ROW_TILE else BIG_ROW_TILE
    gather = row_tiles == 1
    mw = -(-mix // 8) * 8  # aux columns: 0 the sum of squares, 8 .. scale row, 8 + mw .. base
    rms = (inv_count, rms_eps) if use_rms else None
    nq = -(-hc_dim // MATMUL_K_TILE)
    tile_rows = max(1, min(rows, VEC_TILE_FP32_ELEMS // hidden))
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")

    @pypto.frontend.jit(runtime_options=options)
    def hc_mixes(
        x_hc: pypto.Tensor([tokens_dim, hc, hidden], pypto.DT_FP32),
        fn: pypto.Tensor([mix, hc_dim], pypto.DT_FP32),
        scale: pypto.Tensor([3], pypto.DT_FP32),
        base: pypto.Tensor([mix], pypto.DT_FP32),
        pre: pypto.Tensor([tokens_dim, hc], pypto.DT_FP32),
        post: pypto.Tensor([tokens_dim, hc], pypto.DT_FP32),
        comb: pypto.Tensor([tokens_dim, hc, hc], pypto.DT_FP32),
    ):
        tokens = x_hc.shape[0]
        x2 = pypto.reshape(x_hc, [tokens, hc_dim], inplace=True)
        if gather or big:
            parts = pypto.Tensor([tokens, nq * mix], pypto.DT_FP32)  # K-tile partials
        if big:
            # column 0: the sums of squares; in each chunk's first row from column 8 the
            # scale and base rows (the fused task's one copy-in)
            aux = pypto.Tensor([tokens, 8 + 2 * mw], pypto.DT_FP32)
        # FP32 operands: L0A holds m0 x k0 and L0B k0 x n0 x 4 bytes, each <= 64 KiB
        m0 = BIG_CUBE_M if big else 16
        k0 = BIG_CUBE_K if big else 256
        pypto.set_cube_tile_shapes([m0, m0], [k0, MATMUL_K_TILE], [32, 32])
        for i in pypto.loop((tokens + rows - 1) // rows, name="HC_MIXES_ROWS", idx_name="r"):
            start = i * rows
            valid = (tokens - start).min(rows)
            flat = pypto.view(x2, [rows, hc_dim], [start, 0], valid_shape=[valid, hc_dim])
            pypto.set_vec_tile_shapes(tile_rows, hidden)
            sq = pypto.sum(pypto.mul(flat[:, 0:hidden], flat[:, 0:hidden]), -1, keepdim=True)
            for h in range(1, hc):
                xh = pypto.view(flat, [rows, hidden], [0, h * hidden], valid_shape=[valid, hidden])
                sq = pypto.add(sq, pypto.sum(pypto.mul(xh, xh), -1, keepdim=True))
            if big:
                # through aux: read inside the fused task, the last adds of the sums of
                # squares joined it (24 copy-ins of [4, 1])
                pypto.assemble(sq, [start, 0], aux)
                _gathered_split_k_product(pypto, flat, fn, rows, valid, hc_dim, mix, parts,
                                          start, None)
                pypto.set_vec_tile_shapes(GATHER_ROWS, 32)
                # built in every row iteration (see below)
                c0s = _chunk_starts(valid, rows, SINKHORN_ROWS)
                _scale_base_rows(pypto, scale, base, aux, _plus(start, c0s), hc, mix, mw)
                for c0 in c0s:  # unrolled
                    _fused_tile(pypto, parts, aux, SINKHORN_ROWS,
                                (valid - c0).min(SINKHORN_ROWS), nq, mix, mw, hc, passes, eps,
                                row_last, rms, start + c0, pre, post, comb)
            else:
                if gather:
                    mm = _gathered_split_k_product(pypto, flat, fn, rows, valid, hc_dim, mix,
                                                   parts, start)  # [rows, mix]
                else:
                    mm = _split_k_product(pypto, flat, fn, rows, valid, hc_dim, mix)
                pypto.set_vec_tile_shapes(rows, 32)
                # built in every row iteration: built once before the loop, their 2-4 tasks
                # had an edge to every iteration's consumers (serial resolves of 2.7 k cycles
                # each, which delayed the first products; FLASH T=192 59.4 -> 49.2 us)
                s2 = pypto.reshape(scale, [1, 3])
                b2 = pypto.reshape(base, [1, mix])
                # per-group scale rows (a [1, 1] operand may broadcast along one axis only)
                sc_pre = pypto.expand_clone(pypto.view(s2, [1, 1], [0, 0]), [1, hc])
                sc_post = pypto.expand_clone(pypto.view(s2, [1, 1], [0, 1]), [1, hc])
                sc_comb = pypto.expand_clone(pypto.view(s2, [1, 1], [0, 2]), [1, hc * hc])
                if use_rms:
                    rstd = pypto.rsqrt(pypto.add(pypto.mul(sq, inv_count), rms_eps))
                    mm = pypto.mul(mm, rstd)
                pypto.set_vec_tile_shapes(rows, 32)  # one task a row tile for pre / post
                z_pre = pypto.add(pypto.mul(pypto.view(mm, [rows, hc], [0, 0],
                                                       valid_shape=[valid, hc]), sc_pre),
                                  pypto.view(b2, [1, hc], [0, 0]))
                z_post = pypto.add(pypto.mul(pypto.view(mm, [rows, hc], [0, hc],
                                                        valid_shape=[valid, hc]), sc_post),
                                   pypto.view(b2, [1, hc], [0, hc]))
                z_comb = _comb_logits(pypto, mm, sc_comb, b2, rows, valid, hc)
                pypto.assemble(pypto.add(_sigmoid(pypto, z_pre), eps), [start, 0], pre)
                pypto.assemble(pypto.mul(_sigmoid(pypto, z_post), 2.0), [start, 0], post)
                logits = pypto.reshape(z_comb, [rows, hc, hc], valid_shape=[valid, hc, hc])
                pypto.set_vec_tile_shapes(1, 16, 32)
                m = _sinkhorn(pypto, logits, passes, eps, row_last)
                pypto.assemble(m, [start, 0, 0], comb)

    return hc_mixes
